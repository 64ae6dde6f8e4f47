"""Command lines of the control-plane processes (and CoreDNS for clusters with real nodes).

kwokctl's binary runtime (sigs.k8s.io/kwok pkg/kwokctl/components) is the
reference; the differences are noted where they are made. Everything listens on
127.0.0.1 only, on ports chosen free at start, so several clusters (a developer's
and a test session's) can run side by side; a cluster with real nodes binds the
apiserver and CoreDNS to its host bridge's address instead, which the nodes'
network namespaces reach.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rlkube_e2e.binaries import Binaries
from rlkube_e2e.kubeconfig import CONTEXT
from rlkube_e2e.layout import Layout
from rlkube_e2e.node import dns
from rlkube_e2e.pki import SERVICE_CLUSTER_IP_RANGE
from rlkube_e2e.pools import KWOK_NODE_ANNOTATION

LOCALHOST = "127.0.0.1"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# The controllers a real cluster runs (kube-controller-manager's on-by-default set, as
# kubeadm and managed clusters start it): among them the PersistentVolumeClaim and
# PersistentVolume protection controllers, which clear the finalizers that keep a claim or
# volume in use from being deleted (without them a deleted claim hangs in Terminating),
# ephemeral volumes, DaemonSets, CronJobs, resource quotas. Controllers that need a cloud
# provider, node CIDR allocation or a CSR signing key see none configured and stay idle.
# One left out where simulated nodes run: taint-based eviction. A simulated (kwok) node on a
# loaded small machine misses heartbeats now and then; with eviction its pods would be
# deleted, which a production node's pods are not for the same seconds-long blips. The
# node-lifecycle controller still runs (it removes the not-ready taint the apiserver puts on
# new nodes). A cluster of real nodes only runs it, as a real cluster does: a node silent for
# longer than its pods' NoExecute toleration loses them (300 s unless a pod says otherwise).
CONTROLLERS = ("*",)
WITH_SIMULATED_NODES = ("*", "-taint-eviction-controller")
# Order of start; shutdown goes in reverse. A cluster with real nodes adds the cluster DNS.
ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
NODE_NETWORK_ORDER = (*ORDER, "coredns")
NODE_LEASE_SECONDS = 40


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


@dataclass(frozen=True)
class Component:
    name: str
    binary: Path
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> list[str]:
        return [str(self.binary), *self.args]


def etcd(binaries: Binaries, layout: Layout, ports: Ports) -> Component:
    client = f"http://{LOCALHOST}:{ports.etcd_client}"
    peer = f"http://{LOCALHOST}:{ports.etcd_peer}"
    return Component(
        "etcd",
        binaries.etcd,
        [
            "--name=node0",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=node0={peer}",
            "--auto-compaction-retention=1",
            # A throwaway test cluster does not need its writes to survive a power
            # cut; skipping fsync makes every API write several times faster.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ],
    )


def kube_apiserver(binaries: Binaries, layout: Layout, ports: Ports, host_address: str | None = None) -> Component:
    """`host_address`: the cluster link's host address when the cluster runs real nodes.
    The apiserver then listens there instead of on loopback (a node's network namespace
    cannot reach the host's loopback) and advertises it, so the `kubernetes` Service gets
    an endpoint that kube-proxy on a node can lead pods to."""
    pki = layout.pki
    address = host_address or LOCALHOST
    if host_address is None:
        # Left blank, the apiserver advertises the host's primary address (seen here:
        # 192.0.2.2), which is not what a loopback-only cluster serves on. Endpoints may
        # not hold a loopback address, so the `kubernetes` Service gets none; nothing
        # in-cluster calls it (kwok runs no pods).
        advertise = [f"--advertise-address={LOCALHOST}", "--endpoint-reconciler-type=none"]
    else:
        advertise = [f"--advertise-address={host_address}", "--endpoint-reconciler-type=lease"]
    return Component(
        "kube-apiserver",
        binaries.kube_apiserver,
        [
            f"--etcd-servers=http://{LOCALHOST}:{ports.etcd_client}",
            f"--bind-address={address}",
            f"--secure-port={ports.apiserver}",
            *advertise,
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            # `kubectl logs` on a real node's pods: the apiserver calls the node's kubelet
            # endpoint at its InternalIP (Hostname, the default first choice, does not resolve
            # here) with the admin certificate, which the node checks against the CA.
            f"--kubelet-client-certificate={pki.admin_cert}",
            f"--kubelet-client-key={pki.admin_key}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            # As in a real cluster, so `kubectl auth can-i --as ...` answers what
            # the operator's RBAC really allows.
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--profiling=false",
        ],
    )


def kube_controller_manager(binaries: Binaries, layout: Layout, ports: Ports, simulated_nodes: bool) -> Component:
    pki = layout.pki
    controllers = WITH_SIMULATED_NODES if simulated_nodes else CONTROLLERS
    return Component(
        "kube-controller-manager",
        binaries.kube_controller_manager,
        [
            f"--kubeconfig={layout.kubeconfig}",
            f"--bind-address={LOCALHOST}",
            f"--secure-port={ports.controller_manager}",
            f"--cert-dir={layout.cert_dir('kube-controller-manager')}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            # One instance: leader election would only delay a restart by up to a
            # lease duration (the old lease survives in the kept etcd data).
            "--leader-elect=false",
            f"--controllers={','.join(controllers)}",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-account-private-key-file={pki.service_account_key}",
            # The defaults (20 qps) make a StatefulSet of a few dozen pods visibly slow.
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ],
    )


def kube_scheduler(binaries: Binaries, layout: Layout, ports: Ports) -> Component:
    return Component(
        "kube-scheduler",
        binaries.kube_scheduler,
        [
            f"--kubeconfig={layout.kubeconfig}",
            f"--bind-address={LOCALHOST}",
            f"--secure-port={ports.scheduler}",
            f"--cert-dir={layout.cert_dir('kube-scheduler')}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--leader-elect=false",
        ],
    )


def kwok(binaries: Binaries, layout: Layout, stages: list[Path]) -> Component:
    assert binaries.kwok is not None, "find_binaries(kwok=True) finds it"
    return Component(
        "kwok",
        binaries.kwok,
        [
            f"--kubeconfig={layout.kubeconfig}",
            *(f"--config={stage}" for stage in stages),
            # Only the nodes this package creates; a real node joined to the
            # cluster later (e.g. a process-running one) is left alone.
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            # Leases keep nodes Ready with far fewer writes than status heartbeats.
            f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
            # Pod IPs come from here; the default /24 runs out in long test sessions.
            "--cidr=10.244.0.0/16",
            # No --node-port/--server-address: kwok's kubelet-like server (logs,
            # exec) is useless when no container runs, and would need a port.
        ],
        env={"HOME": str(layout.kwok_home)},
    )


def coredns(binary: Path, layout: Layout, host_address: str) -> Component:
    """The cluster DNS of a cluster with real nodes (node/dns.py), on its link's address."""
    corefile = layout.state_dir / "Corefile"
    corefile.write_text(dns.corefile(host_address, layout.kubeconfig, CONTEXT))
    return Component("coredns", binary, [f"-conf={corefile}"])


def process_env(component: Component) -> dict[str, str]:
    return {**os.environ, **component.env}
