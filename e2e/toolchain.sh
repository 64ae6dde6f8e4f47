#!/usr/bin/env bash
# Builds the local control plane from package registries (Go module proxy) and
# caches each component outside the repo, keyed by version:
#   $RLKUBE_CACHE/k8s-v1.36.3/bin/{kube-apiserver,kube-controller-manager,kube-scheduler}
#   $RLKUBE_CACHE/etcd-v3.6.10/bin/etcd
#   $RLKUBE_CACHE/kwok-v0.8.0+uid-precondition/bin/kwok  (patched: build_kwok says why)
#   $RLKUBE_CACHE/helm-v3.21.4/bin/helm
#   $RLKUBE_CACHE/k8s-v1.36.3/bin/{kubelet,kube-proxy}  (the real node)
#   $RLKUBE_CACHE/coredns-v1.14.7/bin/coredns
#   $RLKUBE_CACHE/kube-network-policies-v0.8.0+xt-nfqueue/bin/kube-network-policies  (the real
#     node's NetworkPolicy agent, patched: build_network_policies says why)
#   $RLKUBE_CACHE/pause-v1.36.3/pause.oci.tar  (the pod sandbox image, from the module's pause.c;
#     built by `toolchain.sh pause`, which needs buildah and gcc)
#   $RLKUBE_CACHE/promtool-v0.316.0/bin/promtool  (Prometheus 3.16's rule linter; the Go
#     module's versions are v0.3XX.Y for Prometheus 3.XX.Y)
#   $RLKUBE_CACHE/gofakes3-v1.2.0/bin/gofakes3  (the S3-compatible server the object-storage
#     checkpoint tests start on loopback, its state in a bbolt file: docs/reliability.md says why)
#   $RLKUBE_CACHE/kueue-v0.17.0/bin/kueue, with crd/*.yaml and webhook/manifests.yaml copied from
#     the module (the Kueue controller the gang admission tests run on loopback: e2e/rlkube_e2e/kueue.py)
# A component already in the cache is not rebuilt. Prints progress while building.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.36.3}
ETCD_VERSION=${ETCD_VERSION:-3.6.10}
KWOK_VERSION=${KWOK_VERSION:-0.8.0}
# The cache key of our patched kwok build (build_kwok); e2e/rlkube_e2e/binaries.py names it too.
KWOK_BUILD=kwok-v$KWOK_VERSION+uid-precondition
HELM_VERSION=${HELM_VERSION:-3.21.4}
PROMTOOL_VERSION=${PROMTOOL_VERSION:-0.316.0}
COREDNS_VERSION=${COREDNS_VERSION:-1.14.7}
GOFAKES3_VERSION=${GOFAKES3_VERSION:-1.2.0}
KUEUE_VERSION=${KUEUE_VERSION:-0.17.0}
NETWORK_POLICIES_VERSION=${NETWORK_POLICIES_VERSION:-0.8.0}
# The cache key of our patched build (build_network_policies); e2e/rlkube_e2e/binaries.py names it too.
NETWORK_POLICIES_BUILD=kube-network-policies-v$NETWORK_POLICIES_VERSION+xt-nfqueue
CACHE=${RLKUBE_CACHE:-$HOME/.cache/rlkube}
export CGO_ENABLED=0
export GOFLAGS=${GOFLAGS:--trimpath}

log() { printf '[toolchain %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# The source folder of a Go module (MODULE@VERSION) in Go's module cache, downloaded if needed.
module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }

# A writable copy of a Go module's source at WORK, for a build that patches it (the module
# cache itself is read-only, and shared).
patchable_source() {
  local src
  src=$(module_dir "$1")
  rm -rf "$2"
  mkdir -p "$(dirname "$2")"
  cp -r "$src" "$2"
  chmod -R u+w "$2"
}

# Runs a command while printing a heartbeat every 30 s, so a cold build that
# takes tens of minutes never looks hung.
with_progress() {
  local what=$1; shift
  local start=$SECONDS
  "$@" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    if (( (SECONDS - start) % 30 < 5 )) && kill -0 "$pid" 2>/dev/null; then
      log "$what: still building ($((SECONDS - start)) s)"
    fi
  done
  wait "$pid"
  log "$what: done in $((SECONDS - start)) s"
}

k8s_ldflags() {
  local minor=${K8S_VERSION#*.}; minor=${minor%%.*}
  local flags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  printf '%s' "$flags"
}

# The wrapper module every Kubernetes command is built in. k8s.io/kubernetes
# requires its staging modules at v0.0.0 and replaces them with local paths; the
# wrapper replaces each with its published v0.X.Y. Its tool list names every
# command we build, so one `go mod tidy` covers the control plane and the node.
k8s_workdir() {
  local work=$CACHE/src/k8s-v$K8S_VERSION
  mkdir -p "$work"
  cd "$work"
  if grep -q 'k8s.io/kubernetes/cmd/kubelet' go.mod 2>/dev/null && [[ -s go.sum ]]; then
    return
  fi
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  local staging_version="v0.${K8S_VERSION#*.}"
  {
    echo "module rlkube.dev/k8s-build"
    echo
    echo "go $(sed -n 's/^go //p' "$gomod")"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    echo "replace ("
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$staging_version"'#p' "$gomod"
    echo ")"
    echo
    echo "tool ("
    echo "	k8s.io/kubernetes/cmd/kube-apiserver"
    echo "	k8s.io/kubernetes/cmd/kube-controller-manager"
    echo "	k8s.io/kubernetes/cmd/kube-scheduler"
    echo "	k8s.io/kubernetes/cmd/kubelet"
    echo "	k8s.io/kubernetes/cmd/kube-proxy"
    echo ")"
  } > go.mod
  with_progress "kubernetes: go mod tidy" go mod tidy
}

build_k8s() {
  local dest=$CACHE/k8s-v$K8S_VERSION/bin
  if [[ -x $dest/kube-apiserver && -x $dest/kube-controller-manager && -x $dest/kube-scheduler ]]; then
    return
  fi
  log "kubernetes v$K8S_VERSION: building kube-apiserver, kube-controller-manager, kube-scheduler (cold: tens of minutes)"
  mkdir -p "$dest"
  k8s_workdir
  with_progress "kubernetes v$K8S_VERSION" go build -ldflags "$(k8s_ldflags)" -o "$dest/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler
}

# The real node's kubelet and kube-proxy: same wrapper module and version as the
# control plane, into the same versioned cache dir.
build_k8s_node() {
  local dest=$CACHE/k8s-v$K8S_VERSION/bin
  [[ -x $dest/kubelet && -x $dest/kube-proxy ]] && return
  log "kubernetes v$K8S_VERSION: building kubelet, kube-proxy (a few minutes on a warm Go cache)"
  mkdir -p "$dest"
  k8s_workdir
  with_progress "kubelet, kube-proxy v$K8S_VERSION" go build -ldflags "$(k8s_ldflags)" -o "$dest/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
}

# CoreDNS serves the cluster's DNS names inside the real node. Its module has
# replace directives, so it is built in a wrapper module as etcd is.
build_coredns() {
  local dest=$CACHE/coredns-v$COREDNS_VERSION/bin
  [[ -x $dest/coredns ]] && return
  log "coredns v$COREDNS_VERSION: building"
  local work=$CACHE/src/coredns-v$COREDNS_VERSION
  mkdir -p "$work" "$dest"
  cd "$work"
  printf 'module rlkube.dev/coredns-build\n\ngo 1.24\n\ntool github.com/coredns/coredns\n' > go.mod
  with_progress "coredns: go get" go get "github.com/coredns/coredns@v$COREDNS_VERSION"
  with_progress "coredns v$COREDNS_VERSION" go build -ldflags "-s -w" -o "$dest/coredns" github.com/coredns/coredns
}

# The pod sandbox ("pause") image: there is no registry to pull one from, so it is
# built from the k8s.io/kubernetes module's own pause.c, static, in an image FROM
# scratch, and kept as an OCI archive the node imports.
build_pause() {
  local dir=$CACHE/pause-v$K8S_VERSION
  local archive=$dir/pause.oci.tar
  [[ -s $archive ]] && return
  command -v buildah >/dev/null || { log "pause: buildah is not installed (make images-sysdeps)"; exit 1; }
  command -v gcc >/dev/null || { log "pause: gcc is not installed (apt-get install gcc libc6-dev)"; exit 1; }
  log "pause (k8s v$K8S_VERSION): building"
  local src
  src=$(module_dir "k8s.io/kubernetes@v$K8S_VERSION")
  mkdir -p "$dir/ctx"
  gcc -Os -static -o "$dir/ctx/pause" "$src/build/pause/linux/pause.c"
  strip "$dir/ctx/pause" 2>/dev/null || true
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' > "$dir/ctx/Containerfile"
  local ref=localhost/rlkube/pause:$K8S_VERSION
  # The project's own buildah store (as e2e/rlkube_e2e/images.py uses), not the host's.
  local store=$CACHE/images/storage
  buildah() { command buildah --root "$store/root" --runroot "$store/run" "$@"; }
  buildah build --quiet --isolation chroot --pull-never -t "$ref" -f "$dir/ctx/Containerfile" "$dir/ctx" >/dev/null
  buildah push --quiet "$ref" "oci-archive:$archive.tmp:$ref" >/dev/null
  buildah rmi "$ref" >/dev/null 2>&1 || true
  mv "$archive.tmp" "$archive"
  log "pause: $archive"
}

build_etcd() {
  local dest=$CACHE/etcd-v$ETCD_VERSION/bin
  [[ -x $dest/etcd ]] && return
  log "etcd v$ETCD_VERSION: building"
  local work=$CACHE/src/etcd-v$ETCD_VERSION
  mkdir -p "$work" "$dest"
  cd "$work"
  printf 'module rlkube.dev/etcd-build\n\ngo 1.24\n\ntool go.etcd.io/etcd/server/v3\n' > go.mod
  with_progress "etcd: go get" go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  with_progress "etcd v$ETCD_VERSION" go build -ldflags "-s -w" -o "$dest/etcd" go.etcd.io/etcd/server/v3
}

# Commands whose modules have no replace directives install with plain `go install`;
# a fourth argument gives build tags.
go_install() {
  local name=$1 pkg=$2 version=$3 tags=${4:-}
  local dest=$CACHE/$name-v$version/bin
  [[ -x $dest/$name ]] && return
  log "$name v$version: building"
  mkdir -p "$dest"
  with_progress "$name v$version" env GOBIN="$dest" go install -tags "$tags" -ldflags "-s -w" "$pkg@v$version"
}

# kwok stands in for the kubelet of the simulated pools. Its pod controller deletes a pod it
# saw being deleted by name alone, and it may do so more than once (each event of the dying
# pod plays its delete stage again); a late delete then kills the pod the StatefulSet has just
# created under the same name, a member of the new gang, which the operator rightly counts as
# lost. A real kubelet deletes with the pod's UID as a precondition (so a successor is never
# touched); this build adds that precondition, and a refused delete (409) ends the stage.
build_kwok() {
  local dest=$CACHE/$KWOK_BUILD/bin
  [[ -x $dest/kwok ]] && return
  log "kwok v$KWOK_VERSION: building (with the kubelet's UID precondition on pod deletes)"
  local work=$CACHE/src/$KWOK_BUILD
  mkdir -p "$dest"
  patchable_source "sigs.k8s.io/kwok@v$KWOK_VERSION" "$work"
  local file=$work/pkg/kwok/controllers/pod_controller.go
  local call='c.typedClient.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, deleteOpt)'
  grep -qF "err := $call" "$file" || { log "kwok: the pod delete to patch is not in $file"; exit 1; }
  sed -i "s|err := ${call//./\\.}|opt := deleteOpt; opt.Preconditions = metav1.NewUIDPreconditions(string(pod.UID)); err := ${call/deleteOpt/opt}|" "$file"
  grep -qF 'NewUIDPreconditions(string(pod.UID))' "$file" || { log "kwok: patching $file failed"; exit 1; }
  (cd "$work" && with_progress "kwok v$KWOK_VERSION" go build -ldflags "-s -w" -o "$dest/kwok" ./cmd/kwok)
}

# kube-network-policies enforces NetworkPolicies on the real nodes: nftables rules send the
# first packet of each new connection to a pod to an nfqueue, where the agent decides it. It
# writes that hand-off as the nftables `queue` expression, which needs the kernel's nft_queue
# (CONFIG_NFT_QUEUE), and not every kernel has it (this project's CI kernel does not); the
# xtables NFQUEUE target, reached through nft_compat, does the same and is far more often
# built in. This build swaps the one for the other (xt_NFQ_info_v3: queue number, one queue,
# the bypass flag when the agent fails open); the verdicts the agent gives are unchanged.
build_network_policies() {
  local dest=$CACHE/$NETWORK_POLICIES_BUILD/bin
  [[ -x $dest/kube-network-policies ]] && return
  log "kube-network-policies v$NETWORK_POLICIES_VERSION: building (with the xtables NFQUEUE target)"
  local work=$CACHE/src/$NETWORK_POLICIES_BUILD
  mkdir -p "$dest"
  patchable_source "sigs.k8s.io/kube-network-policies@v$NETWORK_POLICIES_VERSION" "$work"
  local pkg=$work/pkg/networkpolicy
  cat > "$pkg/xt_nfqueue.go" <<'GO'
package networkpolicy

import (
	"encoding/binary"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// nfqueueTarget hands a packet to nfqueue `num` through the xtables NFQUEUE target (revision
// 3, struct xt_NFQ_info_v3), in place of the nftables queue expression.
func nfqueueTarget(num uint16, bypass bool) expr.Any {
	info := make([]byte, 6)
	binary.NativeEndian.PutUint16(info[0:], num)
	binary.NativeEndian.PutUint16(info[2:], 1) // queues_total
	if bypass {
		binary.NativeEndian.PutUint16(info[4:], 1) // NFQ_FLAG_BYPASS
	}
	payload := xt.Unknown(info)
	return &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &payload}
}
GO
  perl -0pi -e 's/queue := &expr\.Queue\{Num: uint16\(c\.config\.QueueID\)\}\n\s*if c\.config\.FailOpen \{\n\s*queue\.Flag = expr\.QueueFlagBypass\n\s*\}/queue := nfqueueTarget(uint16(c.config.QueueID), c.config.FailOpen)/g' "$pkg/controller.go"
  perl -pi -e 's/&expr\.Queue\{Num: uint16\(n\.nfQueueID\), Flag: expr\.QueueFlagBypass\}/nfqueueTarget(uint16(n.nfQueueID), true)/' "$pkg/dnsagent.go"
  if grep -q 'expr\.Queue{' "$pkg/controller.go" "$pkg/dnsagent.go"; then
    log "kube-network-policies: an nftables queue expression is left unpatched in $pkg"; exit 1
  fi
  (cd "$work" && with_progress "kube-network-policies v$NETWORK_POLICIES_VERSION" go build -ldflags "-s -w" -o "$dest/kube-network-policies" ./cmd)
}

# promtool only checks and unit-tests rule files here: without Prometheus' service
# discovery plugins (cloud SDKs) it builds in a fraction of the time.
build_promtool() {
  go_install promtool github.com/prometheus/prometheus/cmd/promtool "$PROMTOOL_VERSION" remove_all_sd
}

# Kueue's controller, plus its CRDs and webhook manifests copied out of the module, so the
# runner (e2e/rlkube_e2e/kueue.py) needs only the cache dir, not the Go module cache.
build_kueue() {
  local dir=$CACHE/kueue-v$KUEUE_VERSION
  [[ -x $dir/bin/kueue && -s $dir/webhook/manifests.yaml ]] && return
  go_install kueue sigs.k8s.io/kueue/cmd/kueue "$KUEUE_VERSION"
  local src
  src=$(module_dir "sigs.k8s.io/kueue@v$KUEUE_VERSION")
  mkdir -p "$dir/crd" "$dir/webhook"
  cp "$src"/config/components/crd/bases/*.yaml "$dir/crd/"
  cp "$src/config/components/webhook/manifests.yaml" "$dir/webhook/manifests.yaml"
  chmod -R u+w "$dir/crd" "$dir/webhook"
  log "kueue: $dir"
}

build() {
  local what=$1
  case $what in
    k8s) build_k8s ;;
    etcd) build_etcd ;;
    kwok) build_kwok ;;
    helm) go_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" ;;
    promtool) build_promtool ;;
    node) build_k8s_node ;;
    coredns) build_coredns ;;
    pause) build_pause ;;
    s3) go_install gofakes3 github.com/johannesboyne/gofakes3/cmd/gofakes3 "$GOFAKES3_VERSION" ;;
    kueue) build_kueue ;;
    network-policies) build_network_policies ;;
    all)
      # Small ones first so a failure there shows before the long build.
      (build_kwok)
      (go_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION")
      (build_promtool)
      (go_install gofakes3 github.com/johannesboyne/gofakes3/cmd/gofakes3 "$GOFAKES3_VERSION")
      (build_etcd)
      (build_k8s)
      (build_k8s_node)
      (build_kueue)
      (build_coredns)
      (build_network_policies)
      ;;
    demo)
      # What `make demo` runs: the control plane, the real node's parts, helm and the pause
      # image; not kwok (the demo's cluster has no simulated pool), promtool (only the tests
      # lint rules) or gofakes3 (the tests' S3 server).
      (go_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION")
      (build_etcd)
      (build_k8s)
      (build_k8s_node)
      (build_coredns)
      (build_network_policies)
      (build_pause)
      ;;
    paths)
      echo "K8S_BIN=$CACHE/k8s-v$K8S_VERSION/bin"
      echo "ETCD_BIN=$CACHE/etcd-v$ETCD_VERSION/bin"
      echo "KWOK_BIN=$CACHE/$KWOK_BUILD/bin"
      echo "HELM_BIN=$CACHE/helm-v$HELM_VERSION/bin"
      echo "PROMTOOL_BIN=$CACHE/promtool-v$PROMTOOL_VERSION/bin"
      echo "COREDNS_BIN=$CACHE/coredns-v$COREDNS_VERSION/bin"
      echo "PAUSE_ARCHIVE=$CACHE/pause-v$K8S_VERSION/pause.oci.tar"
      echo "GOFAKES3_BIN=$CACHE/gofakes3-v$GOFAKES3_VERSION/bin"
      echo "KUEUE_DIR=$CACHE/kueue-v$KUEUE_VERSION"
      echo "NETWORK_POLICIES_BIN=$CACHE/$NETWORK_POLICIES_BUILD/bin"
      ;;
    *) log "unknown target '$what' (k8s|etcd|kwok|helm|promtool|node|coredns|network-policies|pause|s3|kueue|all|demo|paths)"; exit 2 ;;
  esac
}

# Each argument in turn (default: all).
main() {
  command -v go >/dev/null || { log "go is not installed (apt-get install golang-go, or see README)"; exit 1; }
  mkdir -p "$CACHE"
  local what
  for what in "${@:-all}"; do
    build "$what"
  done
}
main "$@"
