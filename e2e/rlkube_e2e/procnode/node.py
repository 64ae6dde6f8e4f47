"""ProcessNode: a Node of the cluster whose pods run as processes on this machine.

It registers the Node (honest CPU and memory, no GPUs, label
rlkube.dev/pool=local), keeps it Ready through a Lease in kube-node-lease and
periodic status, watches the pods bound to it and runs each through a
PodWorker (pods.py). kwok leaves it alone: it has no kwok annotation.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import platform
import shutil
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from rlkube_e2e.cluster import NODE_LEASES, UNUSABLE_NODE_TAINTS
from rlkube_e2e.errors import ClusterError
from rlkube_e2e.kubeapi import ApiError
from rlkube_e2e.pki import KUBERNETES_SERVICE_IP
from rlkube_e2e.pools import KWOK_NODE_ANNOTATION, POOL_LABEL
from rlkube_e2e.procnode import network
from rlkube_e2e.procnode.api import NodeApi, read_kubeconfig
from rlkube_e2e.procnode.dns import PodDns
from rlkube_e2e.procnode.forwarder import Forwarder
from rlkube_e2e.procnode.kubelet import KubeletServer
from rlkube_e2e.procnode.logs import LogRequestError, LogSource
from rlkube_e2e.procnode.mounts import mounted_below
from rlkube_e2e.procnode.pods import TERMINAL, NodeContext, PodWorker
from rlkube_e2e.procnode.status import now

POOL = "local"
DEFAULT_PODS = 110
LEASE_SECONDS = 40
LEASE_RENEW_INTERVAL = 10.0
STATUS_INTERVAL = 60.0
WATCH_RETRY = 1.0
# Host variables that pods inherit: the locale, and where models and caches are
# (the image is ignored, so the host's environment stands in for it).
INHERITED_ENV = ("HOME", "LANG", "LC_ALL", "TZ")
INHERITED_ENV_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


class ProcessNode:
    """A node running its pods as local processes; `start()` and `stop()` are idempotent.

    Everything runs in background threads of the calling process; the pods'
    processes die with it. Logs: `node_log`, and one file per pod (`log_path`).
    """

    def __init__(
        self,
        kubeconfig: Path,
        name: str = "proc-0",
        labels: Mapping[str, str] | None = None,
        state_dir: Path | None = None,
        *,
        cpu: str | None = None,
        memory: str | None = None,
        pods: int = DEFAULT_PODS,
        bin_dir: Path | None = None,
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.name = name
        self.labels = dict(labels or {})
        self.state_dir = Path(state_dir or self.kubeconfig.parent / "procnode" / name).absolute()
        self.capacity = {
            "cpu": cpu or str(len(os.sched_getaffinity(0))),
            "memory": memory or _memory(),
            "pods": str(pods),
        }
        # The project's virtualenv: `python` and `rlkube-trainer` in pods resolve there.
        self.bin_dir = bin_dir or Path(sys.executable).parent
        self.log = logging.getLogger(f"rlkube_e2e.procnode.{name}")
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._workers: dict[str, PodWorker] = {}
        self._finished: set[str] = set()
        self._workers_lock = threading.Lock()
        self._handler: logging.Handler | None = None
        self._context: NodeContext | None = None
        self._forwarder: Forwarder | None = None
        self._kubelet: KubeletServer | None = None
        self._started = False
        self._last_status = 0.0
        self._ready_since = ""
        self._netns_prefix = ""

    @property
    def node_log(self) -> Path:
        return self.state_dir / "node.log"

    def log_path(self, namespace: str, pod: str) -> Path:
        """The file that collects the stdout and stderr of every container of a pod (appended per run)."""
        return self.state_dir / "logs" / f"{namespace}_{pod}.log"

    def netns(self, uid: str) -> str:
        """The network namespace of the pod with `uid` (`ip netns pids NAME` lists its processes)."""
        if not self._netns_prefix:
            raise ClusterError(f"node {self.name} is not started")
        return f"{self._netns_prefix}{uid}"

    @staticmethod
    def unavailable() -> str | None:
        """Why this machine cannot run a process node, or None."""
        if sys.platform != "linux":
            return "a process node needs Linux (network and mount namespaces)"
        if os.geteuid() != 0:
            return "a process node needs root (network namespaces, mounts)"
        if not os.access(network.IP_COMMAND, os.X_OK):
            return "a process node needs iproute2's `ip` command"
        return None

    def __enter__(self) -> ProcessNode:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    # -- start --------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        """Register the node and wait until the scheduler may use it; a no-op when started."""
        with self._lock:
            if self._started:
                return
            problem = self.unavailable()
            if problem:
                raise ClusterError(problem)
            self._started = True
            self._stopping.clear()
            try:
                self._start(timeout)
            except BaseException:
                self._stop(grace=1.0)
                raise

    def _start(self, timeout: float) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._handler = logging.FileHandler(self.node_log)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self.log.addHandler(self._handler)
        self.log.setLevel(logging.INFO)
        access = read_kubeconfig(self.kubeconfig, self.state_dir / "credentials")
        api = NodeApi(access)
        server = urllib.parse.urlsplit(access.server)
        port = server.port or 443
        cluster = hashlib.sha1(access.server.encode()).hexdigest()[:6]
        netns_prefix = self._netns_prefix = f"rlk-{cluster}-{self.name}-"
        self.log.info("starting node %s for %s in %s", self.name, access.server, self.state_dir)
        network.ensure_bridge((KUBERNETES_SERVICE_IP,))
        # Claimed first: it fails if this node already runs elsewhere, whose pods must not be touched.
        addresses = network.AddressBlock.claim(f"process node {self.name} of {access.server}", netns_prefix)
        for netns in network.namespaces(netns_prefix):
            self.log.info("removing network namespace %s left by a previous run", netns)
            network.delete_pod_network(netns)
        dns = PodDns(network.HOST_DIR / "clusters" / cluster / "dns", self.name, KUBERNETES_SERVICE_IP)
        dns.withdraw_node()
        self._forwarder = Forwarder((KUBERNETES_SERVICE_IP, port), (server.hostname or "127.0.0.1", port))
        self._forwarder.start()
        # Started before the Node is registered: its status carries the port (for `kubectl logs`).
        self._kubelet = KubeletServer(
            network.GATEWAY, self._container_log, access.credentials.ca_cert, self.state_dir / "kubelet", self.log
        )
        self._kubelet.start()
        self._context = NodeContext(
            name=self.name,
            api=api,
            state_dir=self.state_dir,
            addresses=addresses,
            dns=dns,
            host_ip=network.GATEWAY,
            netns_prefix=netns_prefix,
            python=sys.executable,
            bin_dir=self.bin_dir,
            base_env=self._base_env(port),
            log=self.log,
        )
        self.log.info("pod addresses %s, apiserver for pods at %s:%d", addresses.network, KUBERNETES_SERVICE_IP, port)
        self._register(api)
        self._spawn(self._heartbeat, "heartbeat")
        self._wait_usable(api, timeout)
        self._spawn(self._watch_pods, "pod-watch")
        self.log.info("node %s is Ready", self.name)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"{self.name}-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _base_env(self, port: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in INHERITED_ENV or k.startswith(INHERITED_ENV_PREFIXES)}
        env.setdefault("HOME", "/root")
        env["PATH"] = f"{self.bin_dir}:{SYSTEM_PATH}"
        if (self.bin_dir.parent / "pyvenv.cfg").exists():
            env["VIRTUAL_ENV"] = str(self.bin_dir.parent)
        # What the kubelet gives every container for the `kubernetes` Service.
        env["KUBERNETES_SERVICE_HOST"] = KUBERNETES_SERVICE_IP
        env["KUBERNETES_SERVICE_PORT"] = str(port)
        env["KUBERNETES_SERVICE_PORT_HTTPS"] = str(port)
        env["KUBERNETES_PORT"] = f"tcp://{KUBERNETES_SERVICE_IP}:{port}"
        return env

    def _register(self, api: NodeApi) -> None:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": _ARCH.get(platform.machine(), platform.machine()),
            **self.labels,
            POOL_LABEL: self.labels.get(POOL_LABEL, POOL),
        }
        manifest = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": labels}}
        status, text = api.request("POST", "/api/v1/nodes", manifest)
        if status == 409:
            existing = api.get(f"/api/v1/nodes/{self.name}")
            if KWOK_NODE_ANNOTATION in (existing["metadata"].get("annotations") or {}):
                raise ClusterError(f"node {self.name} already exists as a kwok node; pick another --name")
            api.merge_patch(f"/api/v1/nodes/{self.name}", {"metadata": {"labels": labels}})
        elif not 200 <= status < 300:
            raise ClusterError(f"registering node {self.name} failed: HTTP {status}: {text[:300]}")
        self._post_status(api, ready=True)
        self._renew_lease(api)

    def _post_status(self, api: NodeApi, *, ready: bool, reason: str = "KubeletReady") -> None:
        stamp = now()
        if ready and not self._ready_since:
            self._ready_since = stamp
        if not ready:
            self._ready_since = ""

        def condition(kind: str, status: str, why: str, message: str, since: str) -> dict[str, str]:
            return {
                "type": kind,
                "status": status,
                "reason": why,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": since,
            }

        ready_message = "rlkube process node is posting ready status" if ready else "rlkube process node stopped"
        status = {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "no memory pressure", stamp),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure", stamp),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "enough PIDs", stamp),
                condition("Ready", str(ready), reason, ready_message, self._ready_since or stamp),
            ],
            "addresses": [
                {"type": "InternalIP", "address": network.GATEWAY},
                {"type": "Hostname", "address": self.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self._kubelet.port if self._kubelet else 0}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": platform.release(),
                "osImage": "rlkube process node",
                "containerRuntimeVersion": "procnode://0.1",
                "kubeletVersion": "v0.0.0-procnode",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": _ARCH.get(platform.machine(), platform.machine()),
            },
        }
        api.merge_patch(f"/api/v1/nodes/{self.name}/status", {"status": status})
        self._last_status = time.monotonic()

    def _renew_lease(self, api: NodeApi) -> None:
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": _micro_now()}
        status, _ = api.request("PATCH", f"{NODE_LEASES}/{self.name}", {"spec": spec}, "application/merge-patch+json")
        if status != 404:
            return
        node = api.get(f"/api/v1/nodes/{self.name}")
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": node["metadata"]["uid"]}
        metadata = {"name": self.name, "namespace": "kube-node-lease", "ownerReferences": [owner]}
        api.call(
            "POST",
            NODE_LEASES,
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec},
        )

    def _wait_usable(self, api: NodeApi, timeout: float) -> None:
        """Until Ready and the node lifecycle controller has lifted its not-ready taint."""
        deadline = time.monotonic() + timeout
        while True:
            node = api.get(f"/api/v1/nodes/{self.name}")
            conditions = node.get("status", {}).get("conditions") or []
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            taints = [t["key"] for t in node.get("spec", {}).get("taints") or [] if t["key"] in UNUSABLE_NODE_TAINTS]
            if ready and not taints:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"node {self.name} not usable after {timeout:.0f} s (taints {taints}); log {self.node_log}"
                )
            time.sleep(0.5)

    # -- running ------------------------------------------------------------------

    def _heartbeat(self) -> None:
        assert self._context is not None
        api = self._context.api
        while not self._stopping.wait(LEASE_RENEW_INTERVAL):
            try:
                self._renew_lease(api)
                if time.monotonic() - self._last_status > STATUS_INTERVAL:
                    self._post_status(api, ready=True)
            except (ApiError, OSError) as error:
                self.log.warning("heartbeat failed: %s", error)
            with self._workers_lock:
                for uid, worker in list(self._workers.items()):
                    if worker.finished:
                        del self._workers[uid]
                        self._finished.add(uid)

    def _watch_pods(self) -> None:
        """List and watch the pods bound to this node; relist when the watch's resourceVersion expires."""
        assert self._context is not None
        api = self._context.api
        selector = {"fieldSelector": f"spec.nodeName={self.name}"}
        version = ""
        first = True
        while not self._stopping.is_set():
            try:
                if not version:
                    listing = api.get(f"/api/v1/pods?{urllib.parse.urlencode(selector)}")
                    version = listing["metadata"]["resourceVersion"]
                    self._sync(listing["items"], remove_stale=first)
                    first = False
                params = {**selector, "resourceVersion": version, "allowWatchBookmarks": "true"}
                for event in api.watch("/api/v1/pods", params):
                    kind, item = event["type"], event["object"]
                    if kind == "ERROR":
                        # 410 Gone: the version is too old; anything else, start over too.
                        self.log.info("pod watch: %s; listing again", item.get("message"))
                        version = ""
                        break
                    version = item["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        self._dispatch(kind, item)
            except ApiError as error:
                if error.status == 410:
                    version = ""
                    continue
                self.log.warning("pod watch: %s", error)
                self._stopping.wait(WATCH_RETRY)
            except Exception as error:
                if self._stopping.is_set():
                    return
                self.log.warning("pod watch interrupted: %r", error)
                self._stopping.wait(WATCH_RETRY)

    def _sync(self, pods: list[dict[str, Any]], *, remove_stale: bool) -> None:
        assert self._context is not None
        seen = {pod["metadata"]["uid"] for pod in pods}
        for pod in pods:
            self._dispatch("ADDED", pod)
        with self._workers_lock:
            gone = [worker for uid, worker in self._workers.items() if uid not in seen]
        for worker in gone:
            worker.vanished()
        if remove_stale:
            # Directories of pods that went away while the node was down.
            for directory in (self.state_dir / "pods").glob("*"):
                if directory.name not in seen:
                    self._remove_stale(directory)

    def _remove_stale(self, directory: Path) -> None:
        if not mounted_below(directory):
            shutil.rmtree(directory, ignore_errors=True)

    def _dispatch(self, kind: str, pod: dict[str, Any]) -> None:
        assert self._context is not None
        uid = pod["metadata"]["uid"]
        with self._workers_lock:
            worker = self._workers.get(uid)
            if kind == "DELETED":
                if worker is not None:
                    worker.vanished()
                return
            if worker is not None:
                worker.update(pod)
                return
            if uid in self._finished or self._stopping.is_set():
                return
            if (pod.get("status") or {}).get("phase") in TERMINAL:
                return  # Finished before this node (run) saw it: nothing to run.
            worker = PodWorker(self._context, pod)
            worker.update(pod)
            self._workers[uid] = worker
        worker.start()

    def _container_log(self, namespace: str, pod: str, container: str, previous: bool) -> LogSource:
        """For the kubelet API: the log of a container of a pod this node runs."""
        with self._workers_lock:
            workers = [w for w in self._workers.values() if (w.namespace, w.name) == (namespace, pod)]
        if not workers:
            raise LogRequestError(404, f'pod "{pod}" in namespace "{namespace}" is not running on node {self.name}')
        # A StatefulSet pod deleted and made again under its name: the one not finished is current.
        worker = next((w for w in workers if not w.finished), workers[-1])
        return worker.container_log(container, previous)

    # -- stop ---------------------------------------------------------------------

    def stop(self, grace: float = 5.0, *, delete_node: bool = False) -> None:
        """Kill every pod process (SIGTERM, `grace` seconds, SIGKILL) and clean up; a no-op when stopped.

        The Node is marked NotReady and its pods are left as they are: a node
        started again with the same name restarts them (restartPolicy Always and
        OnFailure) or fails them (Never). With `delete_node` the Node goes
        instead, and the pod garbage collector deletes its pods (after its 40 s
        quarantine), so that nothing stays stuck in Terminating.
        """
        with self._lock:
            if self._started:
                self._stop(grace, delete_node=delete_node)

    def _stop(self, grace: float, *, delete_node: bool = False) -> None:
        self._stopping.set()
        context, self._context = self._context, None
        if context is not None:
            context.api.close()
        with self._workers_lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.shutdown(grace)
        for worker in workers:
            worker.join(grace + 30)
        for thread in self._threads:
            thread.join(15)
        self._threads = []
        self._workers.clear()
        self._finished.clear()
        if self._forwarder is not None:
            self._forwarder.stop()
            self._forwarder = None
        if self._kubelet is not None:
            self._kubelet.stop()
            self._kubelet = None
        if context is not None:
            try:
                if delete_node:
                    context.api.request("DELETE", f"/api/v1/nodes/{self.name}")
                else:
                    self._post_status(context.api, ready=False, reason="ProcessNodeStopped")
            except (ApiError, OSError) as error:
                self.log.warning("could not mark the node NotReady or delete it: %s", error)
            for netns in network.namespaces(context.netns_prefix):
                network.delete_pod_network(netns)
            context.dns.withdraw_node()
            context.dns.remove_if_unused()
            context.addresses.close()
        self.log.info("node %s stopped", self.name)
        if self._handler is not None:
            self.log.removeHandler(self._handler)
            self._handler.close()
            self._handler = None
        self._started = False


def _memory() -> str:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return f"{line.split()[1]}Ki"
    return "0"


def _micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
