#!/usr/bin/env bash
# rlkube end to end on a kind cluster, for machines with Docker (the local control
# plane of `e2e/cluster` needs no Docker; this runs the real images instead):
#
#   1. a kind cluster (reused when it exists);
#   2. the operator image and the trainer's CPU image, built and loaded into it;
#   3. the chart installed with the operator image;
#   4. the model and data examples/tiny-cpu.yaml expects   <- the step to adapt
#   5. the reward ConfigMap and examples/tiny-cpu.yaml applied;
#   6. wait for state Succeeded (or Failed), then print the job's status.
#
# Usage: e2e/kind.sh          run it all
#        e2e/kind.sh delete   delete the kind cluster
#
# Settings (environment):
#   RLKUBE_KIND_CLUSTER  kind cluster name                     (rlkube)
#   KIND_NODE_IMAGE      kind node image, e.g. kindest/node:v1.33.1 (kind's default)
#   RLKUBE_IMAGE_TAG     tag of the images built here          (dev)
#   RLKUBE_NAMESPACE     namespace of the chart's release      (rlkube-system)
#   RLKUBE_JOB_NAMESPACE namespace of the example job          (default)
#   RLKUBE_JOB_TIMEOUT   seconds to wait for the job           (1800)
#   DOCKER, KIND, KUBECTL, HELM: the tools                     (found on PATH)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

cluster=${RLKUBE_KIND_CLUSTER:-rlkube}
tag=${RLKUBE_IMAGE_TAG:-dev}
release_namespace=${RLKUBE_NAMESPACE:-rlkube-system}
job_namespace=${RLKUBE_JOB_NAMESPACE:-default}
job_timeout=${RLKUBE_JOB_TIMEOUT:-1800}
docker=${DOCKER:-docker}
kind=${KIND:-kind}
kubectl=${KUBECTL:-kubectl}
helm=${HELM:-helm}

operator_image="rlkube-operator:${tag}"
# Dockerfile.trainer's cpu target (kind nodes have no GPU); examples/tiny-cpu.yaml
# names rlkube-trainer:dev, and the job is applied with this image in its place.
trainer_image="rlkube-trainer:${tag}"
job=tiny-cpu
context="kind-${cluster}"

step() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
k() { "$kubectl" --context "$context" "$@"; }

require_tools() {
  local tool
  for tool in "$docker" "$kind" "$kubectl" "$helm"; do
    command -v "$tool" >/dev/null || die "$tool not found on PATH"
  done
  "$docker" info >/dev/null 2>&1 || die "no Docker engine answers ('$docker info' failed)"
}

create_cluster() {
  if "$kind" get clusters 2>/dev/null | grep -qx "$cluster"; then
    step "kind cluster $cluster exists; reusing it"
    return
  fi
  step "kind cluster $cluster"
  local args=(create cluster --name "$cluster" --wait 180s)
  if [[ -n ${KIND_NODE_IMAGE:-} ]]; then
    args+=(--image "$KIND_NODE_IMAGE")
  fi
  "$kind" "${args[@]}"
}

build_images() {
  step "image $operator_image"
  "$docker" build -f Dockerfile.operator -t "$operator_image" .
  step "image $trainer_image (Dockerfile.trainer, target cpu)"
  "$docker" build -f Dockerfile.trainer --target cpu -t "$trainer_image" .
}

load_images() {
  step "loading the images into kind"
  "$kind" load docker-image --name "$cluster" "$operator_image" "$trainer_image"
}

install_chart() {
  step "helm chart charts/rlkube (release rlkube in $release_namespace)"
  # Helm installs the CRD only when it is absent (the crds/ rule); a cluster that
  # has an older one gets the current one here.
  if k get crd rljobs.rlkube.dev >/dev/null 2>&1; then
    k apply --server-side --force-conflicts -f charts/rlkube/crds/rljob.yaml
  fi
  "$helm" upgrade --install rlkube charts/rlkube \
    --kube-context "$context" \
    --namespace "$release_namespace" --create-namespace \
    --set image.repository="${operator_image%:*}" \
    --set image.tag="$tag" \
    --set image.pullPolicy=IfNotPresent \
    --wait --timeout 5m
  k -n "$release_namespace" rollout status deployment/rlkube --timeout=120s
}

ensure_job_namespace() {
  k get namespace "$job_namespace" >/dev/null 2>&1 || k create namespace "$job_namespace"
}

# ---------------------------------------------------------------------------------
# STEP 4, THE ONE TO ADAPT: the model and data of examples/tiny-cpu.yaml.
# The job mounts the node directory /var/tmp/rlkube-demo (hostPath) at /rlkube,
# reads its model from /rlkube/tiny/model and its data from
# /rlkube/tiny/data/{train,val}.parquet, and writes its checkpoints there too. On kind
# the node is the kind container, so a one-off pod with the same mount writes them
# with the code the tests use (rlkube_trainer.tiny.task: random weights, nothing
# downloaded), after handing the directory to the trainer's UID. A multi-node
# cluster needs a ReadWriteMany volume instead (see the example's comment).
# ---------------------------------------------------------------------------------
node_dir=/var/tmp/rlkube-demo
trainer_uid=1000 # Dockerfile.trainer's USER

provide_model_and_data() {
  step "the tiny model and data in $node_dir/tiny on the kind node"
  k -n "$job_namespace" delete pod tiny-task-init --ignore-not-found --wait=true
  k -n "$job_namespace" apply -f - <<MANIFEST
apiVersion: v1
kind: Pod
metadata:
  name: tiny-task-init
spec:
  restartPolicy: Never
  initContainers:
    - name: own
      image: ${trainer_image}
      command: [chown, "${trainer_uid}:${trainer_uid}", /rlkube]
      securityContext: {runAsUser: 0}
      volumeMounts: [{name: work, mountPath: /rlkube}]
  containers:
    - name: write
      image: ${trainer_image}
      command:
        - python
        - -c
        - |
          from pathlib import Path
          from rlkube_trainer.tiny.task import VAL_PROMPTS, build_model, write_dataset
          build_model(Path("/rlkube/tiny/model"))
          write_dataset(Path("/rlkube/tiny/data/train.parquet"))
          write_dataset(Path("/rlkube/tiny/data/val.parquet"), count=VAL_PROMPTS, seed=1)
      securityContext: {runAsUser: ${trainer_uid}, runAsGroup: ${trainer_uid}}
      volumeMounts: [{name: work, mountPath: /rlkube}]
  volumes:
    - name: work
      hostPath: {path: ${node_dir}, type: DirectoryOrCreate}
MANIFEST
  if ! k -n "$job_namespace" wait pod/tiny-task-init --for=jsonpath='{.status.phase}'=Succeeded --timeout=600s; then
    k -n "$job_namespace" logs pod/tiny-task-init --all-containers >&2 || true
    die "writing the tiny model and data failed"
  fi
  k -n "$job_namespace" delete pod tiny-task-init --wait=false
}

run_job() {
  step "RLJob $job_namespace/$job (examples/tiny-cpu.yaml)"
  # A fresh run each time: an old job would already be finished.
  k -n "$job_namespace" delete rljob "$job" --ignore-not-found --wait=true
  k -n "$job_namespace" create configmap tiny-reward \
    --from-file=reward.py=examples/rewards/tiny_task.py --dry-run=client -o yaml |
    k -n "$job_namespace" apply -f -
  sed -e "s|^  image: .*|  image: ${trainer_image}|" examples/tiny-cpu.yaml |
    k -n "$job_namespace" apply -f -
}

wait_for_job() {
  step "waiting up to ${job_timeout} s for state Succeeded"
  local deadline=$((SECONDS + job_timeout)) state
  # Short waits in a loop rather than one long one: a Failed job ends the wait at once.
  until k -n "$job_namespace" wait "rljob/$job" --for=jsonpath='{.status.state}'=Succeeded --timeout=15s \
    >/dev/null 2>&1; do
    state=$(k -n "$job_namespace" get rljob "$job" -o jsonpath='{.status.state}')
    if [[ $state == Failed ]]; then
      print_status
      die "RLJob $job failed"
    fi
    if ((SECONDS >= deadline)); then
      print_status
      die "RLJob $job is still ${state:-without a state} after ${job_timeout} s"
    fi
    k -n "$job_namespace" get rljob "$job" --no-headers
  done
  print_status
  step "RLJob $job succeeded"
}

print_status() {
  k -n "$job_namespace" get rljob "$job" -o wide
  k -n "$job_namespace" get rljob "$job" -o jsonpath='{.status}'
  echo
  k -n "$job_namespace" describe rljob "$job" | sed -n '/^Events:/,$p'
}

main() {
  case ${1:-up} in
    up)
      require_tools
      create_cluster
      build_images
      load_images
      install_chart
      ensure_job_namespace
      provide_model_and_data
      run_job
      wait_for_job
      ;;
    delete)
      "$kind" delete cluster --name "$cluster"
      ;;
    *)
      die "unknown command '$1' (expected: up, delete)"
      ;;
  esac
}

main "$@"
