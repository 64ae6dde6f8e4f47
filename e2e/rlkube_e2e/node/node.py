"""One real node of a local cluster: containerd + runc + CNI + kubelet, started and stopped.

The node lives in a network namespace of its own (`netns`) and a mount namespace of its own
(`mountns`), held open by a `sleep` process; containerd and the kubelet join both with
`nsenter`, so the volumes the kubelet mounts are the ones containerd hands to runc, and
`stop()` ends every process of the node (pods' included) and so every mount. Its cgroups
sit under a root of its own (`/rlkube/<netns>` in each hierarchy), removed at stop.
`leftovers()` lists whatever of the node is still on the host; after stop() it is empty.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rlkube_e2e import processes
from rlkube_e2e.binaries import K8S_VERSION, NETWORK_POLICIES_BUILD, cache_dir
from rlkube_e2e.components import Component
from rlkube_e2e.errors import ClusterError
from rlkube_e2e.kubeapi import ApiError, Credentials, KubeApi
from rlkube_e2e.kubeconfig import write_kubeconfig
from rlkube_e2e.node import mountns, netns, network_policies
from rlkube_e2e.node.containerd import containerd_config, containerd_paths, cri_serving
from rlkube_e2e.node.image_store import ImageStoreError, ensure_store, import_archive, seed_root
from rlkube_e2e.node.kube_proxy import KubeProxyInputs, kube_proxy_args, write_kube_proxy_config
from rlkube_e2e.node.kubelet import (
    SECCOMP_DIR_IN_NODE,
    KubeletInputs,
    cgroup_root,
    kubelet_args,
    write_kubelet_config,
)
from rlkube_e2e.node.network import NodeNetwork, cni_conflist, node_network
from rlkube_e2e.pki import Pki, issue_client_cert, issue_node_client_cert, self_signed_server_cert
from rlkube_e2e.polling import WaitTimedOut, poll_until

CGROUP_MOUNTS = Path("/sys/fs/cgroup")
CNI_BIN_DIR = Path("/usr/lib/cni")
PAUSE_IMAGE = f"localhost/rlkube/pause:{K8S_VERSION}"
# The Localhost seccomp profiles every node holds, as the README asks of users' nodes (a node
# image or a DaemonSet): the multi-turn example's code interpreter needs `unshare` and Landlock,
# which RuntimeDefault refuses. Pods name it `localhostProfile: profiles/rlkube-sandbox.json`.
SECCOMP_PROFILES: dict[str, Path] = {
    "profiles/rlkube-sandbox.json": Path(__file__).resolve().parents[3]
    / "examples"
    / "seccomp"
    / "rlkube-sandbox.json",
}


class NodeError(ClusterError):
    """The node could not start or stop; the message says which part and where its log is."""


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    kube_proxy: Path
    network_policies: Path  # the NetworkPolicy agent
    containerd: Path
    ctr: Path
    nsenter: Path
    nft: Path
    sleep: Path
    pause_archive: Path


def find_node_binaries() -> NodeBinaries:
    """Locate what a node runs, or say in one line what is missing and which target gets it."""
    k8s = cache_dir() / f"k8s-v{K8S_VERSION}" / "bin"
    kubelet, kube_proxy = k8s / "kubelet", k8s / "kube-proxy"
    agent = cache_dir() / NETWORK_POLICIES_BUILD / "bin" / network_policies.NAME
    for binary in (kubelet, kube_proxy, agent):
        if not os.access(binary, os.X_OK):
            raise NodeError(f"{binary.name} not found (expected {binary}); run `make toolchain`")
    pause = cache_dir() / f"pause-v{K8S_VERSION}" / "pause.oci.tar"
    if not pause.is_file():
        raise NodeError(f"the pause image is not built (expected {pause}); run `bash e2e/toolchain.sh pause`")
    found: dict[str, Path] = {}
    for name in ("containerd", "ctr", "runc", "nsenter", "sleep", "iptables", "nft"):
        path = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        if path is None:
            raise NodeError(f"{name} not found; run `make sysdeps`")
        found[name] = Path(path)
    if not (CNI_BIN_DIR / "bridge").exists():
        raise NodeError(f"CNI plugins not found in {CNI_BIN_DIR}; run `make sysdeps`")
    return NodeBinaries(
        kubelet=kubelet,
        kube_proxy=kube_proxy,
        network_policies=agent,
        containerd=found["containerd"],
        ctr=found["ctr"],
        nsenter=found["nsenter"],
        nft=found["nft"],
        sleep=found["sleep"],
        pause_archive=pause,
    )


@dataclass
class _Running:
    name: str
    pid: int
    binary: Path
    handle: subprocess.Popen[bytes] | None
    # A daemon under `supervise`: `pid` and `binary` are the supervisor's; its log's size at
    # the start, after which a "supervise:" line means the daemon died.
    supervised: bool = False
    log_start: int = 0


class RealNode:
    """Node `index` of the cluster on link `link_index`, registered as `name`.

    `server` is the apiserver's URL on the link's host address, `pki` the cluster's;
    `images` are OCI archives the node's containerd holds before the kubelet starts (the
    pause image always: there is no registry to pull one from), from the shared image store.
    """

    def __init__(
        self,
        *,
        name: str,
        link_index: int,
        index: int,
        server: str,
        pki: Pki,
        state_dir: Path,
        labels: dict[str, str] | None = None,
        taints: list[str] | None = None,
        images: tuple[Path, ...] = (),
        cluster_dns: str | None = None,
        die_with_parent: bool = True,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.net: NodeNetwork = node_network(link_index, index)
        self.server = server
        self.pki = pki
        self.state_dir = Path(state_dir).absolute()
        self.labels = labels or {}
        self.taints = taints or []
        self.images = images
        self.cluster_dns = cluster_dns
        self.die_with_parent = die_with_parent
        self._log = log or (lambda _message: None)
        self._running: list[_Running] = []

    @property
    def cgroup_id(self) -> str:
        # Host-wide unique (the netns name is), unlike a node name, which is per cluster.
        return self.net.netns

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def _holder_file(self) -> Path:
        return self.state_dir / "holder.pid"

    @property
    def address(self) -> str:
        return str(self.net.node_address.ip)

    # -- start ---------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        start_nodes([self], timeout)

    # start_nodes() runs these phases from the calling thread: PR_SET_PDEATHSIG
    # (processes.spawn's die_with_parent) fires when the *thread* that forked a child exits,
    # so a node started from a pool thread was SIGKILLed as soon as that thread ended.

    def _start_runtime(self, timeout: float, store_root: Path) -> None:
        """Namespaces, holder, and containerd on a root seeded from the image store."""
        binaries = find_node_binaries()
        deadline = time.monotonic() + timeout
        self.state_dir.mkdir(parents=True, exist_ok=True)
        mountns.provide(
            self.state_dir,
            {PurePosixPath(SECCOMP_DIR_IN_NODE) / name: source for name, source in SECCOMP_PROFILES.items()},
        )
        netns.create(self.net)
        self._make_cgroup_roots()
        hold = mountns.wrap(self.net.netns, self.state_dir, [str(binaries.sleep), "infinity"])
        holder = self._spawn("holder", binaries.sleep, hold)
        # stop() from another process (`e2e/cluster down`) finds the namespaces through it.
        self._holder_file.write_text(f"{holder.pid}\n")
        self._wait(deadline, lambda: self._in_own_mount_ns(holder.pid), "the node's namespaces")
        paths = containerd_paths(self.state_dir)
        paths.config.parent.mkdir(parents=True, exist_ok=True)
        seed_root(store_root, paths.root)
        paths.config.write_text(containerd_config(paths, PAUSE_IMAGE, CNI_BIN_DIR))
        paths.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        (paths.cni_conf_dir / "10-rlkube.conflist").write_text(cni_conflist(self.net))
        enter = self._enter(binaries, holder.pid)
        self._spawn_supervised("containerd", enter, holder.pid, [str(binaries.containerd), f"--config={paths.config}"])
        ctr = [*enter, str(binaries.ctr), f"--address={paths.socket}"]
        self._wait(deadline, lambda: self._containerd_serving(ctr), "containerd's socket")
        # Through the holder's root: the socket's path from here may be too long for a unix socket.
        socket = Path(f"/proc/{holder.pid}/root") / paths.socket.relative_to("/")
        self._wait(deadline, lambda: cri_serving(socket), "containerd's CRI")

    def _start_kubelet(self, timeout: float) -> None:
        """The kubelet and kube-proxy, then wait for the Node to be Ready."""
        binaries = find_node_binaries()
        deadline = time.monotonic() + timeout
        inputs = self._write_files()
        holder = int(self._holder_file.read_text())
        enter = self._enter(binaries, holder)
        config = self.state_dir / "kubelet" / "config.json"
        write_kubelet_config(config, inputs)
        args = kubelet_args(binaries.kubelet, config, inputs)
        if self.labels:
            args.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(self.labels.items())))
        if self.taints:
            args.append("--register-with-taints=" + ",".join(self.taints))
        self._spawn_supervised("kubelet", enter, holder, args)
        proxy_config = self.state_dir / "kube-proxy" / "config.json"
        write_kube_proxy_config(proxy_config, self._kube_proxy_inputs())
        self._spawn_supervised("kube-proxy", enter, holder, kube_proxy_args(binaries.kube_proxy, proxy_config))
        self._start_network_policies(binaries, enter, holder)
        self._wait(deadline, self._node_ready, f"node {self.name} to be Ready")
        # Ready for pods means NetworkPolicies enforced: the agent has loaded its rules.
        self._wait(deadline, self.enforcing, f"node {self.name}'s NetworkPolicy agent")
        self._log(f"node {self.name} Ready at {self.address} (pods {self.net.pod_cidr}); logs in {self.logs_dir}")

    def _start_network_policies(self, binaries: NodeBinaries, enter: list[str], holder: int) -> None:
        token = network_policies.grant_and_issue_token(self.api())
        network_policies.write_service_account(self.state_dir / "run", token, self.pki.ca_cert)
        inputs = network_policies.AgentInputs(binaries.network_policies, self.name, self.server)
        self._spawn_supervised(network_policies.NAME, enter, holder, network_policies.agent_command(inputs))

    def enforcing(self) -> bool:
        """Whether the node's NetworkPolicy agent has its nftables rules in place."""
        binaries = find_node_binaries()
        enter_net = [str(binaries.nsenter), f"--target={self._holder_file.read_text().strip()}", "--net", "--"]
        return network_policies.rules_loaded([*enter_net, str(binaries.nft)])

    @staticmethod
    def _enter(binaries: NodeBinaries, holder: int) -> list[str]:
        return [str(binaries.nsenter), f"--target={holder}", "--mount", "--net", "--"]

    def _write_files(self) -> KubeletInputs:
        paths = containerd_paths(self.state_dir)
        certs = self.state_dir / "pki"
        issue_node_client_cert(self.pki, certs / "kubelet-client.crt", certs / "kubelet-client.key", self.name)
        self_signed_server_cert(certs / "kubelet.crt", certs / "kubelet.key", self.name, [self.address])
        kubeconfig = self.state_dir / "kubelet.kubeconfig"
        write_kubeconfig(
            kubeconfig,
            self.server,
            self.pki,
            user=f"system:node:{self.name}",
            client_cert=certs / "kubelet-client.crt",
            client_key=certs / "kubelet-client.key",
        )
        # Pods with dnsPolicy Default read the node's resolver; the host's is the best there is.
        resolv = Path("/etc/resolv.conf")
        (self.state_dir / "resolv.conf").write_text(resolv.read_text() if resolv.exists() else "")
        return KubeletInputs(
            node_name=self.name,
            node_ip=self.address,
            pod_cidr=str(self.net.pod_cidr),
            state_dir=self.state_dir,
            runtime_socket=paths.socket,
            client_ca=self.pki.ca_cert,
            kubeconfig=kubeconfig,
            serving_cert=certs / "kubelet.crt",
            serving_key=certs / "kubelet.key",
            cluster_dns=self.cluster_dns,
            cgroup_id=self.cgroup_id,
        )

    def _kube_proxy_inputs(self) -> KubeProxyInputs:
        certs = self.state_dir / "pki"
        issue_client_cert(self.pki, certs / "kube-proxy.crt", certs / "kube-proxy.key", "system:kube-proxy", None)
        kubeconfig = self.state_dir / "kube-proxy.kubeconfig"
        write_kubeconfig(
            kubeconfig,
            self.server,
            self.pki,
            user="system:kube-proxy",
            client_cert=certs / "kube-proxy.crt",
            client_key=certs / "kube-proxy.key",
        )
        return KubeProxyInputs(node_name=self.name, node_ip=self.address, kubeconfig=kubeconfig)

    def _spawn(self, name: str, binary: Path, argv: list[str]) -> _Running:
        log = self.logs_dir / f"{name}.log"
        component = Component(name, Path(argv[0]), argv[1:], env={"PATH": _path_with_sbin()})
        handle = processes.spawn(component, log, self.state_dir, die_with_parent=self.die_with_parent)
        running = _Running(name, handle.pid, binary, handle)
        self._running.append(running)
        self._log(f"  {self.name} {name:<12} pid {handle.pid:<8} log {log}")
        return running

    def _spawn_supervised(self, name: str, enter: list[str], holder: int, command: list[str]) -> _Running:
        """`command` inside the node's namespaces under `supervise`, which restarts it when it
        dies, as systemd restarts a real node's kubelet and containerd."""
        log = self.logs_dir / f"{name}.log"
        log_start = log.stat().st_size if log.exists() else 0
        supervise = [sys.executable, "-m", "rlkube_e2e.node.supervise", f"--name={name}", f"--holder={holder}", "--"]
        running = self._spawn(name, Path(sys.executable).resolve(), [*enter, *supervise, *command])
        running.supervised = True
        running.log_start = log_start
        return running

    def _wait(self, deadline: float, ready: Callable[[], bool], what: str) -> None:
        """Until `ready()`; a slow look (a command past its timeout, a refused connection) is
        "not yet". One of the node's processes exiting ends the wait at once, and so does a
        supervised daemon dying while the node starts (a bad flag would only restart it)."""

        def looked() -> bool:
            for running in self._running:
                code = running.handle.poll() if running.handle is not None else None
                if code is not None or (running.supervised and self._restarted(running)):
                    line = processes.log_error(self.logs_dir / f"{running.name}.log")
                    exited = f"exited with code {code}" if code is not None else "died"
                    raise NodeError(f"node {self.name}: {running.name} {exited}: {line}")
            return ready()

        try:
            poll_until(looked, what, deadline=deadline)
        except WaitTimedOut as error:
            raise NodeError(f"node {self.name}: {error}; logs in {self.logs_dir}") from None

    def _restarted(self, running: _Running) -> bool:
        try:
            with (self.logs_dir / f"{running.name}.log").open("rb") as log:
                log.seek(running.log_start)
                return b" supervise: " in log.read()
        except OSError:
            return False

    def daemon_pids(self, binary: Path) -> list[int]:
        """The node's processes running `binary` (the kubelet's, containerd's), for tests that
        kill one and watch it come back."""
        found = []
        for pid in sorted(self._namespace_pids()):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)") == str(binary.resolve()):
                    found.append(pid)
        return found

    def _in_own_mount_ns(self, pid: int) -> bool:
        # The holder's exec chain ends in `sleep` once the mounts are made (`exec "$@"`).
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            return exe.endswith("/sleep") and os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        except OSError:
            return False

    def import_images(self, archives: tuple[Path, ...]) -> None:
        """Import images into a running node (one started by another process included)."""
        binaries = find_node_binaries()
        try:
            holder = int(self._holder_file.read_text())
        except (OSError, ValueError):
            raise NodeError(f"node {self.name} is not running (no {self._holder_file})") from None
        ctr = [
            *self._enter(binaries, holder),
            str(binaries.ctr),
            f"--address={containerd_paths(self.state_dir).socket}",
        ]
        for archive in archives:
            self._import(ctr, archive)

    def _containerd_serving(self, ctr: list[str]) -> bool:
        return subprocess.run([*ctr, "version"], capture_output=True, check=False, timeout=10).returncode == 0

    def _import(self, ctr: list[str], archive: Path) -> None:
        try:
            seconds = import_archive(ctr, archive)
        except ImageStoreError as error:
            raise NodeError(f"node {self.name}: {error}") from None
        self._log(f"  {self.name} imported {archive.name} in {seconds:.1f} s")

    def api(self) -> KubeApi:
        pki = self.pki
        return KubeApi(self.server, Credentials(pki.ca_cert, pki.admin_cert, pki.admin_key), timeout=5.0)

    def _node_ready(self) -> bool:
        try:
            status, node = self.api().request("GET", f"/api/v1/nodes/{self.name}")
        except (OSError, ApiError):
            return False
        if status != 200:
            return False
        conditions = json.loads(node).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    # -- cgroups ---------------------------------------------------------------------------

    def _hierarchies(self) -> list[Path]:
        # cgroup v1 controllers (and named hierarchies) as mounted here, and the unified one
        # of a hybrid host: it holds no controllers, but runc makes each container's cgroup
        # there too, so a stop must remove (and leftovers() see) those as well.
        if not CGROUP_MOUNTS.is_dir():
            return []
        return sorted(
            p for p in CGROUP_MOUNTS.iterdir() if p.is_dir() and ((p / "tasks").exists() or p.name == "unified")
        )

    def _cgroup_dirs(self) -> list[Path]:
        relative = cgroup_root(self.cgroup_id).lstrip("/")
        return [hierarchy / relative for hierarchy in self._hierarchies()]

    def _make_cgroup_roots(self) -> None:
        """The kubelet wants its cgroupRoot to exist; a v1 cpuset child starts with no CPUs
        and no memory nodes, so each level copies its parent's."""
        for directory in self._cgroup_dirs():
            for level in (directory.parent, directory):
                if level.is_dir():
                    continue
                level.mkdir()
                if (level / "cpuset.cpus").exists():
                    for name in ("cpuset.cpus", "cpuset.mems"):
                        (level / name).write_text((level.parent / name).read_text())

    def _remove_cgroups(self) -> list[str]:
        """Remove the node's cgroup trees leaf first; what cannot go is returned."""
        failed = []
        for directory in self._cgroup_dirs():
            if not directory.exists():
                continue
            for path in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    path.rmdir()
            try:
                directory.rmdir()
            except OSError as error:
                failed.append(f"cgroup {directory} ({error.strerror})")
            with contextlib.suppress(OSError):
                directory.parent.rmdir()  # /rlkube, once no node of any cluster uses it
        return failed

    def _cgroup_pids(self) -> set[int]:
        pids: set[int] = set()
        for directory in self._cgroup_dirs():
            if not directory.exists():
                continue
            for procs in directory.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(line) for line in procs.read_text().split())
        return pids

    # -- stop ------------------------------------------------------------------------------

    def _namespace_pids(self) -> set[int]:
        """Every process in the node's mount namespace: the holder, containerd, the kubelet
        and the containerd shims (a shim outlives containerd by design)."""
        holder = next((r.pid for r in self._running if r.name == "holder"), None)
        if holder is None:
            try:
                holder = int(self._holder_file.read_text())
            except (OSError, ValueError):
                return set()
        try:
            if not os.readlink(f"/proc/{holder}/exe").endswith("/sleep"):
                return set()  # the pid was reused: the node is long gone
            target = os.readlink(f"/proc/{holder}/ns/mnt")
        except OSError:
            return set()
        if target == os.readlink("/proc/self/ns/mnt"):
            return set()
        found = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == target:
                    found.add(int(entry.name))
        return found

    def stop(self) -> None:
        """Stop the kubelet (it lets go of its Lease; its supervisor passes SIGTERM on and does
        not restart it), then kill every process of the node, its pods', the other daemons'
        and their supervisors' included, and remove its cgroups and network; idempotent. A
        supervisor never restarts a daemon once the holder is gone."""
        kubelet = next((r for r in self._running if r.name == "kubelet"), None)
        if kubelet is not None:
            processes.stop(kubelet.pid, str(kubelet.binary), kubelet.handle, timeout=10)
        victims = self._namespace_pids() | self._cgroup_pids()
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(pid) for pid in victims):
            for running in self._running:
                if running.handle is not None:
                    running.handle.poll()
            time.sleep(0.05)
        for running in self._running:
            if running.handle is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    running.handle.wait(timeout=5)
        self._running = []
        self._holder_file.unlink(missing_ok=True)
        # The kernel tears a killed process down after kill() returns (gigabytes of a trainer's
        # memory on a loaded machine take seconds), and its cgroup and mounts go only then:
        # retry until nothing is left, or the deadline.
        deadline = time.monotonic() + 60
        while True:
            for pid in self._cgroup_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._remove_cgroups()
            netns.remove(self.net)
            self._remove_runtime_data()
            if not self.leftovers() or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        with contextlib.suppress(OSError, ApiError):
            self.api().request("DELETE", f"/api/v1/nodes/{self.name}")

    def _remove_runtime_data(self) -> None:
        """Drop containerd's store and the /var/lib overlay's writes (an imported trainer image
        is about 11 GB per node); logs, configs and certificates stay. Only once nothing of the
        node is mounted any more: the namespace's mounts went with its last process."""
        with open("/proc/self/mounts") as mounts:
            if any(str(self.state_dir) in line.split()[1] for line in mounts):
                return
        for name in ("containerd", "var-lib", "run"):
            shutil.rmtree(self.state_dir / name, ignore_errors=True)

    def leftovers(self) -> list[str]:
        found = netns.leftovers(self.net)
        found += [f"cgroup {d}" for d in self._cgroup_dirs() if d.exists()]
        found += [f"data {self.state_dir / n}" for n in ("containerd", "var-lib") if (self.state_dir / n).exists()]
        found += [f"process {pid}" for pid in sorted(self._cgroup_pids())]
        with open("/proc/self/mounts") as mounts:
            found += [f"mount {line.split()[1]}" for line in mounts if str(self.state_dir) in line.split()[1]]
        return found


def start_nodes(nodes: list[RealNode], timeout: float = 120.0) -> None:
    """Start nodes: the image store for their images (imported once, minutes for a trainer
    image, then cached), each node's runtime on a root seeded from it, then the kubelets. On
    any error every node is stopped and the first error raised."""
    try:
        binaries = find_node_binaries()
        stores: dict[tuple[Path, ...], Path] = {}
        for node in nodes:
            wanted = (binaries.pause_archive, *node.images)
            if wanted not in stores:
                stores[wanted] = ensure_store(wanted, binaries.containerd, binaries.ctr, node._log)
            node._start_runtime(timeout, stores[wanted])
        for node in nodes:
            node._start_kubelet(timeout)
    except BaseException:
        for node in nodes:
            node.stop()
        raise


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _path_with_sbin() -> str:
    # containerd finds runc, and the CNI plugins iptables, on PATH.
    path = os.environ.get("PATH", "/usr/bin:/bin")
    return ":".join(dict.fromkeys([*path.split(":"), "/usr/local/sbin", "/usr/sbin", "/sbin"]))
