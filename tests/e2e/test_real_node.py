"""A real node: kubelet + containerd + runc + CNI joined to a control plane of its
own, running a pod from an image built here, and leaving nothing on the host once stopped.
The two-node cluster is the package's (`tests/e2e/conftest.py`)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rlkube_e2e.binaries import K8S_VERSION
from rlkube_e2e.cluster import REPO_ROOT, LocalCluster
from rlkube_e2e.images import ensure_image
from rlkube_e2e.kubeapi import KubeApi
from rlkube_e2e.node import netns
from rlkube_e2e.node.containerd import containerd_paths
from rlkube_e2e.node.image_store import stores_dir
from rlkube_e2e.node.network import cluster_link
from rlkube_e2e.node.node import find_node_binaries
from rlkube_e2e.testing import Kubectl, wait_for
from tests.e2e import real_node_kit
from tests.e2e.real_node_kit import RealCluster, wait_phase

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
]


def test_the_nodes_hold_their_images_as_links_into_one_image_store(real_cluster: RealCluster) -> None:
    """No node imported the trainer image: its largest layer blob is one file of the store's."""
    roots = [containerd_paths(node.state_dir).root for node in real_cluster.nodes]
    blobs = roots[0] / "io.containerd.content.v1.content" / "blobs" / "sha256"
    largest = max(blobs.iterdir(), key=lambda blob: blob.stat().st_size)
    assert largest.stat().st_size > 1e9, largest  # the trainer image's dependency layer
    inodes = {(root / largest.relative_to(roots[0])).stat().st_ino for root in roots}
    in_store = [p for p in stores_dir().glob(f"*/root/{largest.relative_to(roots[0])}") if p.stat().st_ino in inodes]
    assert len(inodes) == 1 and in_store, (inodes, in_store)


def test_a_pod_from_an_image_built_here_runs_and_its_logs_reach_the_api(
    real_cluster: RealCluster,
) -> None:

    cluster, node = real_cluster.cluster, real_cluster.nodes[0]
    api = cluster.api()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {
            "nodeSelector": {"test/index": "0"},
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": real_cluster.images["base"].ref,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", "import socket; print('hello from', socket.gethostname())"],
                }
            ],
        },
    }
    api.call("POST", "/api/v1/namespaces/default/pods", pod)
    done = wait_phase(api, "/api/v1/namespaces/default/pods/hello", {"Succeeded", "Failed"}, 120)
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"])[:2000]
    assert done["spec"]["nodeName"] == node.name
    assert ipaddress.ip_address(done["status"]["podIP"]) in node.net.pod_cidr
    status, logs = api.request("GET", "/api/v1/namespaces/default/pods/hello/log")
    assert status == 200, logs
    assert logs.strip() == "hello from hello"


def _headless_service(api: KubeApi, name: str, app: str) -> None:
    """A headless Service, as the operator makes per role: pods get `<hostname>.<name>` names."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": "None", "selector": {"app": app}, "publishNotReadyAddresses": True},
    }
    api.call("POST", "/api/v1/namespaces/default/services", service)


def _pod(name: str, script: str, node: int = 0, **spec: object) -> dict:

    container = {
        "name": "main",
        "image": ensure_image("base").ref,
        "imagePullPolicy": "Never",
        "command": ["python3", "-u", "-c", script],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"nodeSelector": {"test/index": str(node)}, "containers": [container], **spec},
    }


# Inside a pod: its own headless-Service name resolves to its own address (CoreDNS), and the
# `kubernetes` Service answers at its ClusterIP (kube-proxy in the node's namespace) to the
# pod's projected ServiceAccount token.
DNS_AND_SERVICE = """
import json, socket, ssl, time, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
own = socket.gethostbyname(socket.gethostname())
fqdn = "dns.headless.default.svc.cluster.local"
for _ in range(120):
    try:
        found = socket.gethostbyname(fqdn)
        break
    except OSError:
        time.sleep(0.5)
print("headless", found == own)
print("service", socket.gethostbyname("kubernetes.default.svc.cluster.local"))
context = ssl.create_default_context(cafile=sa + "/ca.crt")
request = urllib.request.Request("https://kubernetes.default.svc/version")
request.add_header("Authorization", "Bearer " + open(sa + "/token").read())
print("version", json.load(urllib.request.urlopen(request, context=context, timeout=10))["gitVersion"])
"""


def test_pods_resolve_cluster_names_and_reach_the_kubernetes_service(
    real_cluster: RealCluster,
) -> None:
    cluster = real_cluster.cluster
    api = cluster.api()
    _headless_service(api, "headless", "dns")
    pod = _pod("dns", DNS_AND_SERVICE, restartPolicy="Never", hostname="dns", subdomain="headless")
    api.call("POST", "/api/v1/namespaces/default/pods", pod)
    done = wait_phase(api, "/api/v1/namespaces/default/pods/dns", {"Succeeded", "Failed"}, 120)
    _, logs = api.request("GET", "/api/v1/namespaces/default/pods/dns/log")
    assert done["status"]["phase"] == "Succeeded", logs
    assert logs.split("\n")[:3] == ["headless True", "service 10.96.0.1", f"version v{K8S_VERSION}"], logs


def test_sigterm_reaches_the_container_and_the_termination_message_reaches_the_api(
    real_cluster: RealCluster,
) -> None:
    cluster = real_cluster.cluster
    api = cluster.api()
    # Exits 3 with a termination message: the kubelet reads the file and reports both.
    failing = _pod(
        "fails", "open('/dev/termination-log', 'w').write('why: 3'); raise SystemExit(3)", restartPolicy="Never"
    )
    api.call("POST", "/api/v1/namespaces/default/pods", failing)
    done = wait_phase(api, "/api/v1/namespaces/default/pods/fails", {"Succeeded", "Failed"}, 120)
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["message"]) == (3, "why: 3")

    # Handles SIGTERM and exits at once: deleted with a long grace period, it is gone fast.
    handler = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); print('up'); time.sleep(600)"
    )
    api.call("POST", "/api/v1/namespaces/default/pods", _pod("graceful", handler, terminationGracePeriodSeconds=60))
    wait_phase(api, "/api/v1/namespaces/default/pods/graceful", {"Running"}, 120)
    deadline = time.monotonic() + 30
    while api.request("GET", "/api/v1/namespaces/default/pods/graceful/log")[1].strip() != "up":
        assert time.monotonic() < deadline, "the container never printed"
        time.sleep(0.2)
    started = time.monotonic()
    api.call("DELETE", "/api/v1/namespaces/default/pods/graceful")
    while api.request("GET", "/api/v1/namespaces/default/pods/graceful")[0] != 404:
        assert time.monotonic() - started < 30, (
            "SIGTERM did not end the container: the kubelet waited for the grace period"
        )
        time.sleep(0.2)


SERVER = """
import socket
with socket.create_server(("0.0.0.0", 7000)) as server:
    connection, peer = server.accept()
    connection.sendall(("seen " + peer[0]).encode())
    connection.close()
"""
CLIENT = """
import socket, time
for _ in range(240):
    try:
        connection = socket.create_connection(("server.mesh.default.svc.cluster.local", 7000), timeout=2)
        break
    except OSError:
        time.sleep(0.5)
print(socket.gethostbyname(socket.gethostname()), connection.recv(100).decode())
"""


def test_pods_on_two_nodes_reach_each_other_by_name_and_see_each_others_address(
    real_cluster: RealCluster,
) -> None:
    """What the trainer's rendezvous needs across pods: a headless name leads to a pod on
    another node, and the connection arrives from the peer's own pod address (no NAT)."""
    cluster, nodes = real_cluster.cluster, real_cluster.nodes
    api = cluster.api()
    _headless_service(api, "mesh", "server")
    pods = "/api/v1/namespaces/default/pods"
    api.call("POST", pods, _pod("server", SERVER, node=0, restartPolicy="Never", hostname="server", subdomain="mesh"))
    api.call("POST", pods, _pod("client", CLIENT, node=1, restartPolicy="Never"))
    server = wait_phase(api, f"{pods}/server", {"Succeeded", "Failed"}, 180)
    client = wait_phase(api, f"{pods}/client", {"Succeeded", "Failed"}, 60)
    _, logs = api.request("GET", f"{pods}/client/log")
    assert (server["status"]["phase"], client["status"]["phase"]) == ("Succeeded", "Succeeded"), logs
    assert (server["spec"]["nodeName"], client["spec"]["nodeName"]) == (nodes[0].name, nodes[1].name)
    assert ipaddress.ip_address(server["status"]["podIP"]) in nodes[0].net.pod_cidr
    client_ip = client["status"]["podIP"]
    assert ipaddress.ip_address(client_ip) in nodes[1].net.pod_cidr
    assert logs.strip() == f"{client_ip} seen {client_ip}"


def test_a_cluster_of_real_nodes_only_runs_without_kwok(real_cluster: RealCluster) -> None:
    """No simulated pool, no kwok: `make demo` neither builds nor starts it, and the cluster
    still counts as healthy."""
    state = real_cluster.cluster._require_state()
    names = {record.name for record in state.processes}
    assert "kwok" not in names and {"kube-scheduler", "coredns"} <= names, names
    status = real_cluster.cluster.status()
    assert status is not None and status.healthy, status


@contextlib.contextmanager
def machine_loaded(scratch: Path) -> Iterator[None]:
    """Every core kept busy and the disk kept writing synchronously, as on a newcomer's laptop
    that builds or indexes while the cluster starts: the waits must treat slow answers as
    "not yet", not fail."""
    scratch.mkdir(parents=True, exist_ok=True)
    spin = [sys.executable, "-c", "while True: pass"]
    write = ["sh", "-c", f"while :; do dd if=/dev/zero of={scratch}/load bs=1M count=64 oflag=dsync 2>/dev/null; done"]
    loads = [subprocess.Popen(spin) for _ in range(os.cpu_count() or 2)] + [subprocess.Popen(write)]
    try:
        yield
    finally:
        for load in loads:
            load.kill()
            load.wait()


def test_e2e_cluster_starts_a_real_node_on_a_loaded_machine_and_its_down_leaves_nothing(tmp_path: Path) -> None:
    cli = [str(REPO_ROOT / "e2e" / "cluster")]
    state_dir = tmp_path / "cli"
    with machine_loaded(tmp_path / "load"):
        up = subprocess.run(
            [*cli, "up", "--state-dir", str(state_dir), "--real-nodes", "1"],
            capture_output=True, text=True, check=False, timeout=600,
        )  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "node real-0 Ready" in up.stdout
        status = subprocess.run(
            [*cli, "status", "--state-dir", str(state_dir)], capture_output=True, text=True, check=False
        )
        assert status.returncode == 0 and "real nodes: real-0" in status.stdout, status.stdout
        cluster = LocalCluster(state_dir)
        state = cluster._require_state()
        node = cluster.real_node(state, 0, "real-0")
        assert node.leftovers(), "a running node shows nothing that leftovers() sees"
    finally:
        down = subprocess.run(
            [*cli, "down", "--state-dir", str(state_dir)], capture_output=True, text=True, check=False
        )
    assert down.returncode == 0, down.stdout + down.stderr
    assert node.leftovers() == []
    assert state.link is not None and netns.link_leftovers(cluster_link(state.link)) == []
    assert not state_dir.exists()


def test_the_charts_operator_runs_from_its_image_under_the_restricted_standard(real_cluster: RealCluster) -> None:
    """`helm install` as a user does, with the operator image built here: its pods start
    from the image as its non-root user in a namespace that enforces the restricted Pod
    Security Standard, pass the kubelet's probes, reach the API through the `kubernetes`
    Service with the chart's ServiceAccount, and reconcile an RLJob."""
    namespace = "operator-restricted"
    with real_node_kit.restricted_operator(real_cluster, namespace) as kubectl:
        job = yaml.safe_load((REPO_ROOT / "examples" / "gpu-multipool.yaml").read_text())
        job["metadata"]["namespace"] = namespace
        kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
        deadline = time.monotonic() + 120
        while True:
            found = json.loads(kubectl("-n", namespace, "get", "rljob", job["metadata"]["name"], "-o", "json").stdout)
            if found.get("status", {}).get("conditions"):
                break
            assert time.monotonic() < deadline, "the operator pod never reconciled the RLJob"
            time.sleep(1)


def test_a_killed_kubelet_is_restarted_and_its_node_renews_its_lease_and_is_ready(real_cluster: RealCluster) -> None:
    """SIGKILL the kubelet, as an OOM kill or a crash would: its supervisor starts it again
    (as systemd does a real node's), and the new kubelet renews the node's Lease and reports
    the node Ready."""
    node = real_cluster.nodes[1]
    _, killed_at = real_node_kit.kill_daemon(node, find_node_binaries().kubelet)
    real_node_kit.wait_renewed_and_ready(real_cluster.cluster.api(), node.name, killed_at)


def test_a_deleted_claim_and_its_volume_are_gone_once_nothing_uses_them(
    real_kubectl: Kubectl, real_namespace: str, tmp_path: Path
) -> None:
    """The controller-manager runs the PVC and PV protection controllers, as a real cluster's
    does: they clear the protection finalizers the API server adds, so a delete completes
    instead of hanging in Terminating."""
    volume = f"pv-{real_namespace}"
    manifests = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Mi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(tmp_path)},
                "claimRef": {"namespace": real_namespace, "name": "claim"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "claim", "namespace": real_namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Mi"}},
            },
        },
    ]
    real_kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))
    try:

        def bound() -> bool:
            phase = real_kubectl("-n", real_namespace, "get", "pvc", "claim", "-o", "jsonpath={.status.phase}")
            return phase.stdout == "Bound"

        wait_for(bound, "the claim to bind to its volume", 30)
        finalizers = real_kubectl("-n", real_namespace, "get", "pvc", "claim", "-o", "jsonpath={.metadata.finalizers}")
        assert "kubernetes.io/pvc-protection" in finalizers.stdout
        real_kubectl("-n", real_namespace, "delete", "pvc", "claim", "--wait=false")
        real_kubectl("delete", "pv", volume, "--wait=false")

        def gone(*args: str) -> bool:
            return "NotFound" in real_kubectl("get", *args, check=False).stderr

        wait_for(lambda: gone("-n", real_namespace, "pvc", "claim"), "the claim to be deleted", 30)
        wait_for(lambda: gone("pv", volume), "the volume to be deleted", 30)
    finally:
        real_kubectl("delete", "pv", volume, "--ignore-not-found", "--wait=false", check=False)


def test_a_running_pod_keeps_running_through_kubelet_and_containerd_restarts(
    real_cluster: RealCluster, real_kubectl: Kubectl, real_namespace: str
) -> None:
    """As on a production node: the kubelet restarting leaves running containers alone (they
    belong to containerd's shims), and so does containerd restarting (the shims outlive it and
    it reconnects to them). The pod's container is the same one throughout, never restarted,
    and once both are back the kubelet execs into it through containerd."""
    node = real_cluster.nodes[0]
    binaries = find_node_binaries()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "steady", "namespace": real_namespace},
        "spec": {
            "nodeSelector": {"test/index": "0"},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": real_cluster.images["base"].ref,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", "import time\nwhile True: time.sleep(1)"],
                }
            ],
        },
    }
    real_kubectl("apply", "-f", "-", input=json.dumps(pod))

    def container() -> dict | None:
        found = json.loads(real_kubectl("-n", real_namespace, "get", "pod", "steady", "-o", "json").stdout)
        statuses = found.get("status", {}).get("containerStatuses") or [{}]
        return statuses[0] if "running" in statuses[0].get("state", {}) else None

    before = wait_for(container, "pod steady to run", 60)
    for binary in (binaries.kubelet, binaries.containerd):
        [old] = node.daemon_pids(binary)
        os.kill(old, signal.SIGKILL)
        wait_for(lambda b=binary, o=old: [p for p in node.daemon_pids(b) if p != o] or None, f"{binary.name} back", 30)
    # exec goes apiserver -> kubelet -> containerd -> the container's shim: all of them answer again.
    exec_ok = wait_for(
        lambda: real_kubectl("-n", real_namespace, "exec", "steady", "--", "true", check=False).returncode == 0,
        "kubectl exec into the pod through the restarted kubelet and containerd",
        60,
        interval=1,
    )
    assert exec_ok
    after = container()
    assert after is not None, "the pod's container stopped running"
    assert after["containerID"] == before["containerID"]
    assert after["restartCount"] == 0
