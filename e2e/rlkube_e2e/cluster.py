"""A local Kubernetes cluster: the control plane, fake GPU node pools, real nodes; its CLI.

    python -m rlkube_e2e.cluster up|down|status [--state-dir DIR] [--real-nodes N]

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run as plain local
processes (no containers). kwok simulates the nodes listed in the pools file
(`e2e/pools.yaml` by default) and moves pods through their lifecycle according to the
stages in `e2e/stages/`, so the real scheduler and controllers see a GPU cluster; a
pools file without nodes starts no kwok. With real nodes (`real_nodes`, `rlkube_e2e.node`)
the cluster gets a host bridge of its own, on whose address the apiserver and CoreDNS
listen, and each node runs pods from the images imported into it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import http.client
import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from rlkube_e2e import components, processes
from rlkube_e2e.binaries import Binaries, find_binaries, find_coredns
from rlkube_e2e.components import LOCALHOST, NODE_NETWORK_ORDER, ORDER, Component, Ports
from rlkube_e2e.errors import ClusterError
from rlkube_e2e.kubeapi import ApiError, Credentials, KubeApi
from rlkube_e2e.kubeconfig import write_kubeconfig
from rlkube_e2e.layout import Layout
from rlkube_e2e.node import netns
from rlkube_e2e.node.network import cluster_link
from rlkube_e2e.node.node import RealNode, start_nodes
from rlkube_e2e.pki import ensure_pki
from rlkube_e2e.polling import WaitTimedOut, describe, poll_until
from rlkube_e2e.pools import MANAGED_BY, MANAGED_BY_LABEL, POOL_LABEL, NodePool, load_pools
from rlkube_e2e.state import ClusterState, ProcessRecord

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = REPO_ROOT / ".cluster"
DEFAULT_POOLS_FILE = REPO_ROOT / "e2e" / "pools.yaml"
NO_POOLS_FILE = REPO_ROOT / "e2e" / "pools-none.yaml"
STAGES_DIR = REPO_ROOT / "e2e" / "stages"
DEFAULT_TIMEOUT = 120.0
# Taints the control plane puts on a node that is not (yet) usable.
UNUSABLE_NODE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
NODE_LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
_PORT_IN_USE = re.compile(r"listen tcp [0-9.]+:(\d+): bind: address already in use")
MANAGED_NODES = f"/api/v1/nodes?labelSelector={urllib.parse.quote(f'{MANAGED_BY_LABEL}={MANAGED_BY}')}"


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int
    running: bool
    log: Path


@dataclass(frozen=True)
class ClusterStatus:
    state_dir: Path
    server: str
    kubeconfig: Path
    components: list[ComponentStatus]
    api_ready: bool
    # Pool name -> (nodes, Ready nodes); empty when the API does not answer.
    pools: dict[str, tuple[int, int]]
    expected: tuple[str, ...] = ORDER
    real_nodes: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        names = [c.name for c in self.components]
        return self.api_ready and sorted(names) == sorted(self.expected) and all(c.running for c in self.components)


class LocalCluster:
    """One local control plane, kept in `state_dir`.

    `up()` starts it (or finds it running), `down()` stops it; `kubeconfig` is the
    admin kubeconfig. Processes outlive this object unless `die_with_parent` is set,
    which ties them to the current process (used by the pytest fixture so that a
    killed test session leaves nothing running).
    """

    def __init__(
        self,
        state_dir: Path = DEFAULT_STATE_DIR,
        pools_file: Path = DEFAULT_POOLS_FILE,
        *,
        die_with_parent: bool = False,
        node_network: bool = False,
        real_nodes: int = 0,
        node_pool: str = "real",
        node_images: tuple[Path, ...] = (),
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.layout = Layout(Path(state_dir).absolute())
        # Real nodes (node/) need a host bridge of the cluster's own, on whose address the
        # apiserver listens; a kwok-only cluster stays on loopback and needs no root.
        self.node_network = node_network or real_nodes > 0
        self.real_nodes = real_nodes
        self.node_pool = node_pool
        self.node_images = node_images
        self.pools_file = Path(pools_file)
        self.die_with_parent = die_with_parent
        self._log = log or (lambda _message: None)
        self._handles: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def state_dir(self) -> Path:
        return self.layout.state_dir

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig

    @property
    def logs_dir(self) -> Path:
        return self.layout.logs

    @property
    def server(self) -> str:
        return self._require_state().server

    def api(self) -> KubeApi:
        pki = self.layout.pki
        return KubeApi(self.server, Credentials(pki.ca_cert, pki.admin_cert, pki.admin_key))

    def __enter__(self) -> LocalCluster:
        self.up()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.down()

    # -- up ---------------------------------------------------------------------

    def up(self, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Start the cluster and wait until it is ready; False if it was already running."""
        # Everything a user can get wrong is checked before any process starts.
        pools = load_pools(self.pools_file)
        simulated = any(pool.nodes for pool in pools)
        binaries = find_binaries(kwok=simulated)
        coredns = find_coredns() if self.node_network else None
        stages = sorted(STAGES_DIR.glob("*.yaml"))
        if simulated and not stages:
            raise ClusterError(f"no kwok stages in {STAGES_DIR}; kwok needs them to simulate nodes and pods")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            previous = ClusterState.load(self.layout.state_file)
            if previous is not None and self._all_running(previous) and self._api_ready(previous):
                self._log(f"cluster already running in {self.state_dir} ({previous.server})")
                self.wait_ready(timeout)
                return False
            if previous is not None:
                # Leftovers of a crashed or half-stopped cluster: stop them, keep the data.
                self._stop_all(previous)
            self._start(binaries, coredns, pools, stages, previous, timeout)
            return True

    def _start(
        self,
        binaries: Binaries,
        coredns: Path | None,
        pools: list[NodePool],
        stages: list[Path],
        previous: ClusterState | None,
        timeout: float,
    ) -> None:
        started_at = datetime.datetime.now(datetime.UTC)
        deadline = time.monotonic() + timeout
        layout = self.layout
        ports = _choose_ports(previous.ports if previous else None)
        link = netns.claim_link() if self.node_network else None
        host = str(link.host_address.ip) if link is not None else LOCALHOST
        state = ClusterState(
            server=f"https://{host}:{ports.apiserver}",
            ports=ports,
            nodes={pool.name: pool.node_names() for pool in pools},
            link=link.index if link is not None else None,
        )
        self._log(f"starting the control plane in {self.state_dir}")
        server_ips = (host,) if link is not None else ()
        try:
            write_kubeconfig(layout.kubeconfig, state.server, ensure_pki(layout.pki.dir, server_ips))
        except BaseException:
            self._remove_link(state)
            raise
        layout.kwok_home.mkdir(exist_ok=True)
        try:
            self._spawn(state, components.etcd(binaries, layout, ports))
            # The apiserver would retry, but fill its log with connection errors
            # that hide real ones; etcd answers within a fraction of a second.
            self._wait(state, deadline, lambda: None if _etcd_healthy(ports.etcd_client) else "etcd /health")
            self._spawn(state, self._apiserver(binaries, state))
            self._wait(state, deadline, lambda: None if self._api_ready(state) else "kube-apiserver /readyz")
            self._release_node_leases(state)
            # The controller-manager gives up if the apiserver is not healthy soon,
            # so the rest starts only now.
            simulated = any(pool.nodes for pool in pools)
            self._spawn(state, components.kube_controller_manager(binaries, layout, ports, simulated))
            self._spawn(state, components.kube_scheduler(binaries, layout, ports))
            if binaries.kwok is not None:
                self._spawn(state, components.kwok(binaries, layout, stages))
            if coredns is not None:
                self._spawn(state, components.coredns(coredns, layout, host))
            self._create_nodes(pools)
            self._wait(state, deadline, lambda: self._readiness_problem(state, started_at))
            nodes = [self.real_node(state, index, f"{self.node_pool}-{index}") for index in range(self.real_nodes)]
            state.real_nodes = [node.name for node in nodes]
            state.save(layout.state_file)
            start_nodes(nodes, timeout=max(deadline - time.monotonic(), 60.0))
        except (ApiError, OSError) as error:
            self._stop_all(state)
            raise ClusterError(f"the apiserver refused a start-up call: {error}; logs in {layout.logs}") from None
        except BaseException:
            self._stop_all(state)
            raise
        summary = ", ".join(f"{pool.name} {pool.nodes}" for pool in pools)
        self._log(f"nodes Ready: {summary}")
        self._log(f"logs: {layout.logs}")

    def _apiserver(self, binaries: Binaries, state: ClusterState) -> Component:
        host = str(cluster_link(state.link).host_address.ip) if state.link is not None else None
        return components.kube_apiserver(binaries, self.layout, state.ports, host)

    def real_node(self, state: ClusterState, index: int, name: str) -> RealNode:
        """Real node `index` of this cluster (started or not): its state lives in the
        cluster's state dir, so `down` from another process can stop it."""
        if state.link is None:
            raise ClusterError("this cluster has no node network; start it with real nodes")
        link = cluster_link(state.link)
        return RealNode(
            name=name,
            link_index=link.index,
            index=index,
            server=state.server,
            pki=self.layout.pki,
            state_dir=self.state_dir / "nodes" / name,
            labels={POOL_LABEL: self.node_pool},
            images=self.node_images,
            cluster_dns=str(link.host_address.ip),
            die_with_parent=self.die_with_parent,
            log=self._log,
        )

    def _remove_link(self, state: ClusterState) -> None:
        if state.link is not None:
            netns.remove_link(cluster_link(state.link))

    def _spawn(self, state: ClusterState, component: Component) -> None:
        log = self.layout.log(component.name)
        handle = processes.spawn(component, log, self.state_dir, die_with_parent=self.die_with_parent)
        self._handles[component.name] = handle
        state.processes.append(ProcessRecord(component.name, handle.pid, str(component.binary), str(log)))
        # Saved after every start, so `down` can clean up even after a failed `up`.
        state.save(self.layout.state_file)
        self._log(f"  {component.name:<24} pid {handle.pid:<8} log {log}")

    def _release_node_leases(self, state: ClusterState) -> None:
        """Drop node leases a previous kwok held (kept etcd data after `down --keep`).

        A new kwok has a new identity and will not take over a lease until it
        expires, which would keep `up` waiting for a lease duration (40 s).
        """
        api = self.api()
        ours = {name for names in state.nodes.values() for name in names}
        for lease in api.get(NODE_LEASES)["items"]:
            name = lease["metadata"]["name"]
            if name in ours:
                api.request("DELETE", f"{NODE_LEASES}/{name}")

    def _create_nodes(self, pools: list[NodePool]) -> None:
        api = self.api()
        desired = {
            manifest["metadata"]["name"]: manifest
            for index, pool in enumerate(pools)
            for manifest in pool.node_manifests(index)
        }
        existing = {item["metadata"]["name"]: item for item in api.get(MANAGED_NODES)["items"]}
        for name, node in existing.items():
            # Nodes of pools removed from the file, or whose shape changed, go;
            # the kept etcd data of `down --keep` would otherwise resurrect them.
            if name not in desired or not _same_node(node, desired[name]):
                api.call("DELETE", f"/api/v1/nodes/{name}")
        for name, manifest in desired.items():
            if name in existing and _same_node(existing[name], manifest):
                continue
            status, text = api.request("POST", "/api/v1/nodes", manifest)
            if not 200 <= status < 300:
                raise ClusterError(f"creating node {name} failed: HTTP {status}: {text[:200]}")

    # -- faults -----------------------------------------------------------------

    def restart_apiserver(self, down_seconds: float = 0.0, timeout: float = DEFAULT_TIMEOUT) -> float:
        """Stops kube-apiserver (SIGTERM, as an upgrade or a crash-looping control plane
        does), keeps it down `down_seconds`, starts it again on the same port and data, and
        waits until the cluster is ready; returns how long the API was unreachable. The
        other components stay up and reconnect on their own, as clients in a real cluster do."""
        with self._locked():
            state = self._require_state()
            name = "kube-apiserver"
            record = next(r for r in state.processes if r.name == name)
            stopped_at = datetime.datetime.now(datetime.UTC)
            stopped = time.monotonic()
            processes.stop(record.pid, record.binary, self._handles.pop(name, None))
            time.sleep(down_seconds)
            state.processes = [r for r in state.processes if r.name != name]
            self._spawn(state, self._apiserver(find_binaries(), state))
            deadline = time.monotonic() + timeout
            self._wait(state, deadline, lambda: None if self._api_ready(state) else "kube-apiserver /readyz")
            unreachable = time.monotonic() - stopped
            # Fresh node leases: kwok reached the new API server (it renews every quarter lease).
            self._wait(state, deadline, lambda: self._readiness_problem(state, stopped_at))
        return unreachable

    # -- readiness ---------------------------------------------------------------

    def wait_ready(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until the API, controllers, scheduler and every pool node are ready."""
        state = self._require_state()
        self._wait(state, time.monotonic() + timeout, lambda: self._readiness_problem(state, None))

    def _wait(self, state: ClusterState, deadline: float, problem: Callable[[], str | None]) -> None:
        """Until `problem()` says nothing is missing. A slow look is "not yet"; a component
        that exited ends the wait at once."""
        waiting_for = ["the cluster"]

        def ready() -> bool:
            self._check_alive(state)
            missing = problem()
            if missing is not None:
                waiting_for[0] = missing
            return missing is None

        try:
            poll_until(ready, "the cluster", deadline=deadline)
        except WaitTimedOut as error:
            last = f" (last error: {describe(error.last_error)})" if error.last_error is not None else ""
            raise ClusterError(
                f"cluster not ready in time: still waiting for {waiting_for[0]}{last}; logs in {self.logs_dir}"
            ) from None

    def _check_alive(self, state: ClusterState) -> None:
        for record in state.processes:
            handle = self._handles.get(record.name)
            code = handle.poll() if handle is not None else None
            if code is None and processes.is_running(record.pid, record.binary):
                continue
            line = processes.log_error(Path(record.log))
            exited = f"exited with code {code}" if code is not None else "is not running"
            busy = _PORT_IN_USE.search(line)
            if busy:
                line = f"port {busy.group(1)} is already in use; run `up` again to pick free ports"
            raise ClusterError(f"{record.name} {exited}: {line or 'no output'} (log: {record.log})")

    def _readiness_problem(self, state: ClusterState, started_at: datetime.datetime | None) -> str | None:
        """What the cluster still lacks, or None when it is ready for tests."""
        if not self._api_ready(state):
            return "kube-apiserver /readyz"
        for name, port in (
            ("kube-controller-manager", state.ports.controller_manager),
            ("kube-scheduler", state.ports.scheduler),
        ):
            if not _healthz_ok(port):
                return f"{name} /healthz"
        api = self.api()
        try:
            # Pods are rejected until the namespace has its `default` service account,
            # which the controller-manager creates: a sign its controllers run.
            status, _ = api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
            if status != 200:
                return "the default service account (kube-controller-manager controllers)"
            nodes = {item["metadata"]["name"]: item for item in api.get(MANAGED_NODES)["items"]}
            for name in (name for names in state.nodes.values() for name in names):
                node = nodes.get(name)
                if node is None or not _node_usable(node):
                    return f"node {name} to be Ready"
                if started_at is not None and not _lease_renewed_since(api, name, started_at):
                    # After `down --keep`, nodes are still Ready from the last run;
                    # a fresh lease shows that this run's kwok manages them.
                    return f"kwok to renew the lease of node {name}"
        except (OSError, ApiError) as error:
            return f"the API ({error})"
        return None

    def _api_ready(self, state: ClusterState) -> bool:
        try:
            status, body = self._api_for(state).request("GET", "/readyz")
        except (OSError, ssl.SSLError):
            return False
        return status == 200 and body.strip() == "ok"

    def _api_for(self, state: ClusterState) -> KubeApi:
        pki = self.layout.pki
        return KubeApi(state.server, Credentials(pki.ca_cert, pki.admin_cert, pki.admin_key), timeout=3.0)

    # -- down and status ---------------------------------------------------------

    def down(self, keep: bool = False) -> bool:
        """Stop every process; remove the state dir unless `keep`. False if nothing ran."""
        if not self.state_dir.exists():
            return False
        with self._locked():
            state = ClusterState.load(self.layout.state_file)
            running = state is not None and any(
                processes.is_running(record.pid, record.binary) for record in state.processes
            )
            if state is not None:
                self._stop_all(state)
            if keep:
                if state is not None:
                    state.processes = []
                    state.save(self.layout.state_file)
            else:
                self._remove_state()
        return running

    def _stop_all(self, state: ClusterState) -> None:
        # Nodes first: a kubelet outliving its apiserver would only log errors.
        for index, name in enumerate(state.real_nodes):
            self.real_node(state, index, name).stop()
            self._log(f"  stopped node {name}")
        state.real_nodes = []
        by_name = {record.name: record for record in state.processes}
        # Reverse start order: clients first, etcd last, so nothing logs errors
        # about a backend that went away first.
        for name in reversed(NODE_NETWORK_ORDER):
            record = by_name.get(name)
            if record is not None:
                processes.stop(record.pid, record.binary, self._handles.pop(name, None))
                self._log(f"  stopped {name} (pid {record.pid})")
        # The bridge is claimed afresh by every start; kept, it would only hold an index.
        self._remove_link(state)

    def _remove_state(self) -> None:
        # Only what `up` creates is removed, never the whole directory: --state-dir
        # pointed at a wrong folder must not wipe it.
        layout = self.layout
        for path in (layout.state_file, layout.kubeconfig, layout.lock_file, self.state_dir / "Corefile"):
            path.unlink(missing_ok=True)
        for directory in (layout.pki.dir, layout.etcd_data, layout.logs, layout.kwok_home, self.state_dir / "nodes"):
            shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(self.state_dir / "serving-certs", ignore_errors=True)
        with contextlib.suppress(OSError):
            self.state_dir.rmdir()

    def status(self) -> ClusterStatus | None:
        state = ClusterState.load(self.layout.state_file)
        if state is None:
            return None
        statuses = [
            ComponentStatus(record.name, record.pid, processes.is_running(record.pid, record.binary), Path(record.log))
            for record in state.processes
        ]
        ready = self._api_ready(state)
        pools: dict[str, tuple[int, int]] = {}
        if ready:
            try:
                for node in self._api_for(state).get(MANAGED_NODES)["items"]:
                    pool = node["metadata"].get("labels", {}).get(POOL_LABEL, "?")
                    count, usable = pools.get(pool, (0, 0))
                    pools[pool] = (count + 1, usable + int(_node_usable(node)))
            except (OSError, ApiError):
                pass
        return ClusterStatus(
            self.state_dir,
            state.server,
            self.kubeconfig,
            statuses,
            ready,
            pools,
            _expected(state),
            tuple(state.real_nodes),
        )

    # -- helpers -----------------------------------------------------------------

    def _require_state(self) -> ClusterState:
        state = ClusterState.load(self.layout.state_file)
        if state is None:
            raise ClusterError(f"no cluster in {self.state_dir}; start one with `e2e/cluster up`")
        return state

    def _all_running(self, state: ClusterState) -> bool:
        names = {record.name for record in state.processes}
        return names == set(_expected(state)) and all(processes.is_running(r.pid, r.binary) for r in state.processes)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Two `up`s racing on one state dir would start two control planes.
        with self.layout.lock_file.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


def _expected(state: ClusterState) -> tuple[str, ...]:
    names = NODE_NETWORK_ORDER if state.link is not None else ORDER
    # kwok simulates the pools' nodes: a cluster whose pools have none runs without it.
    return names if any(state.nodes.values()) else tuple(name for name in names if name != "kwok")


def _choose_ports(previous: Ports | None) -> Ports:
    """Reuse the last run's ports when all are free (kubeconfigs stay valid), else pick new ones."""
    if previous is not None and all(_port_free(port) for port in vars(previous).values()):
        return previous
    sockets = []
    try:
        for _ in range(5):
            sock = socket.socket()
            sock.bind((LOCALHOST, 0))
            sockets.append(sock)
        chosen = [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
    return Ports(*chosen)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        # As the Go servers do; TIME_WAIT leftovers of the last run do not count as in use.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOCALHOST, port))
        except OSError:
            return False
    return True


def _etcd_healthy(port: int) -> bool:
    connection = http.client.HTTPConnection(LOCALHOST, port, timeout=3)
    try:
        connection.request("GET", "/health")
        response = connection.getresponse()
        return response.status == 200 and json.loads(response.read()).get("health") == "true"
    except (OSError, ValueError):
        return False
    finally:
        connection.close()


def _healthz_ok(port: int) -> bool:
    # Controller-manager and scheduler serve a self-signed certificate made at start.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    connection = http.client.HTTPSConnection(LOCALHOST, port, context=context, timeout=3)
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        return response.status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _node_usable(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = node.get("spec", {}).get("taints") or []
    return ready and not any(t.get("key") in UNUSABLE_NODE_TAINTS for t in taints)


def _same_node(existing: dict[str, Any], desired: dict[str, Any]) -> bool:
    def user_taints(node: dict[str, Any]) -> list[Any]:
        taints = node.get("spec", {}).get("taints") or []
        return [t for t in taints if t.get("key") not in UNUSABLE_NODE_TAINTS]

    def own_labels(node: dict[str, Any]) -> dict[str, str]:
        # The node lifecycle controller adds the deprecated beta.kubernetes.io/ labels.
        labels: dict[str, str] = node["metadata"].get("labels") or {}
        return {key: value for key, value in labels.items() if not key.startswith("beta.kubernetes.io/")}

    return (
        own_labels(existing) == desired["metadata"]["labels"]
        and existing.get("status", {}).get("capacity") == desired["status"]["capacity"]
        and existing.get("status", {}).get("allocatable") == desired["status"]["allocatable"]
        and [{k: t[k] for k in ("key", "value", "effect") if k in t} for t in user_taints(existing)]
        == user_taints(desired)
    )


def _lease_renewed_since(api: KubeApi, node: str, since: datetime.datetime) -> bool:
    status, text = api.request("GET", f"{NODE_LEASES}/{node}")
    if status != 200:
        return False
    renew = json.loads(text).get("spec", {}).get("renewTime")
    if not renew:
        return False
    # Lease times are microsecond RFC 3339 in UTC; a second of slack for rounding.
    return datetime.datetime.fromisoformat(renew) >= since - datetime.timedelta(seconds=1)


# -- CLI ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="e2e/cluster",
        description="Local Kubernetes cluster: control plane, fake GPU node pools (kwok), real nodes.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"where the cluster lives (default {DEFAULT_STATE_DIR})",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", parents=[common], help="start the cluster (no-op when running)")
    up.add_argument("--pools", type=Path, default=DEFAULT_POOLS_FILE, help="node pools YAML (default e2e/pools.yaml)")
    up.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds to wait for readiness")
    up.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        help="real nodes to start (kubelet, containerd, runc, CNI, kube-proxy; needs root), in pool `real`",
    )
    up.add_argument(
        "--images",
        default="",
        help="comma-separated images to build if needed and import into the real nodes (base, operator, trainer-cpu)",
    )
    down = commands.add_parser("down", parents=[common], help="stop the cluster and delete its state")
    down.add_argument("--keep", action="store_true", help="keep the state dir (etcd data, certs, logs)")
    commands.add_parser("status", parents=[common], help="show components, API server and nodes per pool")
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        print(message, flush=True)

    try:
        cluster = LocalCluster(
            args.state_dir,
            getattr(args, "pools", DEFAULT_POOLS_FILE),
            real_nodes=getattr(args, "real_nodes", 0),
            node_images=_image_archives(getattr(args, "images", "")),
            log=say,
        )
        if args.command == "up":
            return _cmd_up(cluster, args.timeout)
        if args.command == "down":
            return _cmd_down(cluster, args.keep)
        return _cmd_status(cluster)
    except ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired as error:
        # A one-shot set-up command (`ip`, `cp`) that a very busy machine did not finish.
        print(f"error: {describe(error)}; the machine may be overloaded, try again", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _image_archives(names: str) -> tuple[Path, ...]:
    if not names:
        return ()
    from rlkube_e2e.images import ImageError, ensure_image  # noqa: PLC0415 - only when asked for

    try:
        return tuple(ensure_image(name.strip()).path for name in names.split(",") if name.strip())
    except ImageError as error:
        raise ClusterError(str(error)) from None


def _cmd_up(cluster: LocalCluster, timeout: float) -> int:
    start = time.monotonic()
    started = cluster.up(timeout)
    if started:
        print(f"cluster ready in {time.monotonic() - start:.1f} s")
    print(f"API server: {cluster.server}")
    print(f"kubeconfig: {cluster.kubeconfig}")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _cmd_down(cluster: LocalCluster, keep: bool) -> int:
    where = cluster.state_dir
    if not where.exists():
        print(f"no cluster in {where}")
        return 0
    stopped = cluster.down(keep=keep)
    state = f"state kept in {where}" if keep else f"state removed from {where}"
    print(f"cluster stopped; {state}" if stopped else f"no cluster was running; {state}")
    return 0


def _cmd_status(cluster: LocalCluster) -> int:
    status = cluster.status()
    if status is None:
        print(f"no cluster in {cluster.state_dir} (start one with `e2e/cluster up`)")
        return 1
    print(f"state dir:  {status.state_dir}")
    print(f"API server: {status.server} ({'ready' if status.api_ready else 'not answering'})")
    print(f"kubeconfig: {status.kubeconfig}")
    print("components:")
    if not status.components:
        print("  none running (stopped with --keep; `up` restarts it from the kept state)")
    for component in status.components:
        state = f"running (pid {component.pid})" if component.running else "stopped"
        print(f"  {component.name:<24} {state:<22} log {component.log}")
    if status.pools:
        print("nodes per pool:")
        for pool, (count, ready) in sorted(status.pools.items()):
            print(f"  {pool:<24} {count} ({ready} Ready)")
    if status.real_nodes:
        print(f"real nodes: {', '.join(status.real_nodes)} (logs under {status.state_dir / 'nodes'})")
    return 0 if status.healthy else 1


if __name__ == "__main__":
    sys.exit(main())
