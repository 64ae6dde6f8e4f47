"""A private control plane with two real nodes, for the real-node tests."""

from __future__ import annotations

import codecs
import contextlib
import datetime
import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkube_e2e.cluster import NO_POOLS_FILE, LocalCluster
from rlkube_e2e.images import ImageArchive, ensure_image
from rlkube_e2e.kubeapi import KubeApi
from rlkube_e2e.node import netns
from rlkube_e2e.node.network import cluster_link
from rlkube_e2e.node.node import RealNode, find_node_binaries, start_nodes
from rlkube_e2e.testing import Kubectl, wait_for


def wait_phase(api: KubeApi, path: str, phases: set[str], timeout: float) -> dict:
    """The pod at `path` once its phase is one of `phases`; an API call that is refused or
    times out is "not yet"."""
    pod: dict = {}

    def in_phase() -> dict | None:
        nonlocal pod
        pod = api.get(path)
        return pod if pod.get("status", {}).get("phase") in phases else None

    try:
        return wait_for(in_phase, f"{path} in {phases}", timeout=timeout, interval=0.5)
    except AssertionError as error:
        raise AssertionError(f"{error}: {json.dumps(pod.get('status'))[:2000]}") from None


@dataclass(frozen=True)
class RealCluster:
    cluster: LocalCluster
    nodes: list[RealNode]
    # The images the nodes hold, by name; their keys were computed once, at the start.
    images: dict[str, ImageArchive]


@contextlib.contextmanager
def real_cluster(root: Path, image_names: tuple[str, ...]) -> Iterator[RealCluster]:
    """A control plane with two real nodes holding `image_names`, each in pool `real` and
    labelled `test/index` with its index; afterwards nothing of them is left on the host."""
    # No skip when a part is missing: `make test` builds every one, and a skip would hide it.
    find_node_binaries()
    images = {name: ensure_image(name) for name in image_names}
    cluster = LocalCluster(root / "cluster", NO_POOLS_FILE, die_with_parent=True, node_network=True)
    cluster.up()
    state = cluster._require_state()
    assert state.link is not None
    link = cluster_link(state.link)
    nodes = [
        RealNode(
            name=f"real-{index}",
            link_index=link.index,
            index=index,
            server=cluster.server,
            pki=cluster.layout.pki,
            state_dir=root / f"node-{index}",
            labels={"rlkube.dev/pool": "real", "test/index": str(index)},
            images=tuple(image.path for image in images.values()),
            cluster_dns=str(link.host_address.ip),
        )
        for index in range(2)
    ]
    try:
        start_nodes(nodes)
        yield RealCluster(cluster, nodes, images)
    finally:
        for node in nodes:
            node.stop()
        cluster.down()
    left = [item for node in nodes for item in node.leftovers()]
    assert left == [], left  # (this module's asserts are not rewritten by pytest)
    assert netns.link_leftovers(link) == []


def wait_operator_ready(kubectl: Kubectl, namespace: str, replicas: int, timeout: float = 180) -> list[dict]:
    """The chart's operator pods once `replicas` of them pass the kubelet's readiness probe."""
    pods: list[dict] = []

    def all_ready() -> list[dict] | None:
        nonlocal pods
        pods = json.loads(kubectl("-n", namespace, "get", "pods", "-o", "json").stdout)["items"]
        ready = [
            p for p in pods
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]  # fmt: skip
        return ready if len(ready) == replicas else None

    try:
        return wait_for(all_ready, f"{replicas} ready operator pods in {namespace}", timeout=timeout, interval=1)
    except AssertionError as error:
        raise AssertionError(f"{error}: {json.dumps([p['status'] for p in pods])[:3000]}") from None


@contextlib.contextmanager
def restricted_operator(real: RealCluster, namespace: str) -> Iterator[Kubectl]:
    """The chart installed as users install it, with the operator image built here, into a
    namespace that enforces the restricted Pod Security Standard: its pods start from the
    image as its non-root user on the real nodes and pass the kubelet's probes. Uninstalled
    afterwards."""
    from rlkube_e2e import release  # noqa: PLC0415
    from tests.chart.chart_kit import install_rljob_crd  # noqa: PLC0415

    kubectl = Kubectl(real.cluster.kubeconfig)
    kubectl("create", "namespace", namespace)
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    install_rljob_crd(kubectl)
    operator = real.images["operator"]
    name = release.install(real.cluster.kubeconfig, namespace, [namespace], operator.ref, "real")
    try:
        ready = wait_operator_ready(kubectl, namespace, replicas=2)
        assert {p["spec"]["nodeName"] for p in ready} <= {n.name for n in real.nodes}
        assert {p["spec"]["containers"][0]["image"] for p in ready} == {operator.ref}
        pod = ready[0]["metadata"]["name"]
        uid = kubectl("-n", namespace, "exec", pod, "--", "python3", "-c", "import os; print(os.getuid())")
        assert uid.stdout.strip() == "65532"
        yield kubectl
    finally:
        release.uninstall(real.cluster.kubeconfig, namespace, name)


# Seconds without a log line after which a followed log is opened again: a stream left hanging
# by a dying pod's kubelet must not outlive that pod's next incarnation.
READ_TIMEOUT = 20


def _stamp_key(line: str) -> tuple[str, str]:
    """The kubelet's timestamp of a `timestamps=True` log line, as a key that sorts in time:
    RFC 3339 with the trailing zeros of its nanoseconds dropped ("…25.15652945Z"), so its
    fraction is padded back to nine digits before it is compared."""
    stamp, _, _ = line.partition(" ")
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return whole, fraction.ljust(9, "0")


def merge_log_lines(seen: dict[str, None], chunk: str) -> str:
    """Adds the complete lines of `chunk` (kubelet-timestamped log text) to `seen` and returns
    the incomplete tail. A line read twice (the log followed again from its start, a
    replaced pod's log read under the old one's stream) is kept once: its timestamp and text
    are its identity."""
    *lines, tail = chunk.split("\n")
    for line in lines:
        if line:
            seen[line] = None
    return tail


def log_text(seen: dict[str, None]) -> str:
    """The lines of `seen` in the kubelet's time order, without their timestamps."""
    ordered = sorted(seen, key=_stamp_key)
    return "".join(line.partition(" ")[2] + "\n" for line in ordered)


class PodLogs:
    """Every incarnation's log of one pod name's container, followed from the API while the
    context is open: `text()` is all lines ever read, oldest first. An incarnation is a pod
    UID (a StatefulSet pod deleted and made again gets a new one, and the kubelet drops the
    old one's logs with it) or a run of its container (a container restarted in place shows
    only its latest run). The log is followed, not polled: a stream opened at any time in an
    incarnation's life reads it from its start to its container's end, where a poll must
    land between a line and the pod's removal (seconds, for a driver killed right after it
    resumed). Lines are merged by the kubelet's timestamps, so reading one twice is harmless."""

    def __init__(self, kubeconfig: Path, namespace: str, pod: str, interval: float = 0.5) -> None:
        from kubernetes.client import CoreV1Api  # noqa: PLC0415
        from kubernetes.config import new_client_from_config  # noqa: PLC0415

        self._client = new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self._core = CoreV1Api(self._client)
        self._namespace, self._pod, self._interval = namespace, pod, interval
        self._lines: dict[str, None] = {}  # kubelet-timestamped lines, as a set kept in arrival order
        self.errors: list[str] = []  # transport errors the follower rode out, for a failing test to show
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"logs-{pod}", daemon=True)

    def __enter__(self) -> PodLogs:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=READ_TIMEOUT + 5)
        self._client.close()

    def _follow(self) -> None:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        while not self._stop.wait(self._interval):
            try:
                self._read_stream()
            except ApiException:
                continue  # not there yet, not started, or gone: the next try sees the next one
            except Exception as error:
                # A connection cut mid-read (urllib3's errors are not OSErrors) or a read timeout
                # must not end the thread: a dead follower silently misses every later incarnation.
                with self._lock:
                    self.errors.append(f"{type(error).__name__}: {error}")

    def _read_stream(self) -> None:
        response = self._core.read_namespaced_pod_log(
            self._pod,
            self._namespace,
            follow=True,
            timestamps=True,
            _preload_content=False,
            _request_timeout=(5, READ_TIMEOUT),
        )
        tail, decoder = "", codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            for chunk in response.stream(decode_content=True):
                with self._lock:
                    tail = merge_log_lines(self._lines, tail + decoder.decode(chunk))
                if self._stop.is_set():
                    return
        finally:
            response.release_conn()

    def text(self) -> str:
        if self._thread.ident is not None and not self._thread.is_alive() and not self._stop.is_set():
            raise RuntimeError(f"the log follower of pod {self._pod} died; it rode out {self.errors}")
        with self._lock:
            return log_text(self._lines)


def kill_daemon(node: RealNode, binary: Path) -> tuple[int, datetime.datetime]:
    """SIGKILL the node's daemon running `binary` (its kubelet, its containerd), as an OOM kill
    or a crash would; wait for its supervisor to start a new one. Returns the new pid and when
    the old one was killed."""
    log, line = node.logs_dir / f"{binary.name}.log", f"supervise: {binary.name} killed by SIGKILL"
    earlier = log.read_text().count(line)  # an earlier test may have killed it already
    [old] = node.daemon_pids(binary)
    killed_at = datetime.datetime.now(datetime.UTC)
    os.kill(old, signal.SIGKILL)
    new = wait_for(lambda: [p for p in node.daemon_pids(binary) if p != old] or None, f"a new {binary.name}", 30)
    assert len(new) == 1, new
    text = log.read_text()
    assert text.count(line) == earlier + 1, text[-2000:]
    return new[0], killed_at


def wait_renewed_and_ready(api: KubeApi, node: str, since: datetime.datetime, timeout: float = 60) -> None:
    """Wait until `node`'s Lease was renewed at or after `since` and the node reports Ready:
    a restarted kubelet has taken over."""

    def renewed_and_ready() -> bool:
        status, text = api.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")
        if status == 404:  # a node that just registered writes its first Lease seconds later
            return False
        assert status == 200, text
        renewed = datetime.datetime.fromisoformat(json.loads(text)["spec"]["renewTime"].replace("Z", "+00:00"))
        conditions = api.get(f"/api/v1/nodes/{node}")["status"]["conditions"]
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        return renewed >= since and ready

    wait_for(renewed_and_ready, f"node {node}'s kubelet to renew its Lease, Ready", timeout)


# Run in a probe pod: a TCP connect to each port of one address at once, each "open", "refused"
# (nothing listens, or a reset) or "timeout" (the SYN dropped: what an enforced NetworkPolicy
# does to a connection it denies).
REACH = """
import concurrent.futures, json, socket, sys
host, ports = sys.argv[1], [int(port) for port in sys.argv[2:]]
def reach(port):
    try:
        socket.create_connection((host, port), timeout=%(timeout)s).close()
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as error:
        return type(error).__name__
with concurrent.futures.ThreadPoolExecutor(len(ports)) as pool:
    print(json.dumps(dict(zip(map(str, ports), pool.map(reach, ports)))))
"""
# A dropped SYN is retried after 1 s and 3 s: 3 s tells a drop from a slow answer on a busy
# machine, where the job's own pods connect in milliseconds.
REACH_TIMEOUT = 3.0


def probe_pod(name: str, image: str, node_index: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod that only sleeps, from an image every node holds, on node `node_index`, which
    the restricted Pod Security Standard admits; the probes run in it with `kubectl exec`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"test/probe": name}},
        "spec": {
            "nodeSelector": {"test/index": str(node_index)},
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "probe",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "infinity"],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def reach(
    kubectl: Kubectl, namespace: str, pod: str, address: str, ports: list[int], container: str | None = None
) -> dict[int, str]:
    """What a TCP connect from `pod` to each of `ports` at `address` meets."""
    script = REACH % {"timeout": REACH_TIMEOUT}
    command = ["-n", namespace, "exec", pod, *(["-c", container] if container else []), "--"]
    result = kubectl(*command, "python3", "-c", script, address, *map(str, ports))
    return {int(port): verdict for port, verdict in json.loads(result.stdout).items()}


def fetch(kubectl: Kubectl, namespace: str, pod: str, url: str) -> str:
    """`url` read from inside `pod` (an OSError when it cannot be read): how a Prometheus in
    the pod's namespace scrapes an endpoint."""
    script = (
        "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
    )
    result = kubectl("-n", namespace, "exec", pod, "--", "python3", "-c", script, url, check=False)
    if result.returncode != 0:
        raise OSError(f"{url} from {namespace}/{pod}: {result.stderr.strip()[-500:]}")
    return str(result.stdout)
