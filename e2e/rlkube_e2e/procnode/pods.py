"""One pod on the node, from binding to deletion: sandbox, containers, status.

A PodWorker is a thread per pod. It sets up the pod's sandbox (address,
volumes, network namespace, the sandbox process holding the pod's namespaces,
DNS entry), runs the init containers one after the other and then the
containers (a ContainerRunner thread each), reports the pod's status as the
kubelet would, and on deletion stops the containers (SIGTERM, the grace
period capped at MAX_GRACE, SIGKILL), frees everything and deletes the pod
object for good. A pod that reaches Succeeded or Failed gives its sandbox
back at once and waits for its deletion.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rlkube_e2e.kubeapi import ApiError
from rlkube_e2e.procnode import launcher, network
from rlkube_e2e.procnode.api import NodeApi
from rlkube_e2e.procnode.containers import (
    DEFAULT_TERMINATION_PATH,
    LAUNCHER_ENV,
    ContainerFiles,
    ContainerRunner,
    Launch,
)
from rlkube_e2e.procnode.dns import PodDns, hostname, resolv_conf
from rlkube_e2e.procnode.env import ConfigError, command_line, container_env
from rlkube_e2e.procnode.logs import LogRequestError, LogSource
from rlkube_e2e.procnode.mounts import Mount, mounted_below
from rlkube_e2e.procnode.status import (
    ContainerRecord,
    now,
    pod_conditions,
    pod_phase,
    pod_status,
    terminated,
    waiting,
)
from rlkube_e2e.procnode.volumes import PodVolume, container_mounts, prepare_volumes

T = TypeVar("T")

MAX_GRACE = 30.0
SETUP_RETRY = 2.0
SANDBOX_START_TIMEOUT = 15.0
TERMINAL = ("Succeeded", "Failed")
HOSTNAME_MAX = 63


class SandboxError(Exception):
    pass


@dataclass(frozen=True)
class NodeContext:
    """What every pod of a node shares."""

    name: str
    api: NodeApi
    state_dir: Path
    addresses: network.AddressBlock
    dns: PodDns
    host_ip: str
    netns_prefix: str
    python: str
    bin_dir: Path  # the project's virtualenv's bin: the image's stand-in
    # PATH (the project's virtualenv first), HOME, KUBERNETES_SERVICE_* and the like.
    base_env: Mapping[str, str]
    log: logging.Logger

    def pod_dir(self, uid: str) -> Path:
        return self.state_dir / "pods" / uid

    def log_path(self, namespace: str, name: str) -> Path:
        return self.state_dir / "logs" / f"{namespace}_{name}.log"


class PodWorker:
    def __init__(self, node: NodeContext, pod: dict[str, Any]) -> None:
        self.node = node
        metadata = pod["metadata"]
        self.uid: str = metadata["uid"]
        self.namespace: str = metadata["namespace"]
        self.name: str = metadata["name"]
        spec = pod["spec"]
        self._pod = pod
        self._policy: str = spec.get("restartPolicy") or "Always"
        self._init_specs: list[dict[str, Any]] = spec.get("initContainers") or []
        self._specs: list[dict[str, Any]] = spec["containers"]
        self._init_records = [ContainerRecord(c["name"], c.get("image", "")) for c in self._init_specs]
        self._records = [ContainerRecord(c["name"], c.get("image", "")) for c in self._specs]
        status = pod.get("status") or {}
        self._start_time: str = status.get("startTime") or now()
        self._conditions: list[dict[str, Any]] = status.get("conditions") or []
        self._dir = node.pod_dir(self.uid)
        self._netns = f"{node.netns_prefix}{self.uid}"
        self._hostname = hostname(pod)[:HOSTNAME_MAX].rstrip("-.")
        self._address = ""
        self._volumes: dict[str, PodVolume] = {}
        self._hosts_file: Path | None = None
        self._sandbox: subprocess.Popen[bytes] | None = None
        self._runners: list[ContainerRunner] = []
        self._init_failed = False
        self._reported: dict[str, Any] | None = None
        self._report_lock = threading.Lock()
        self._wake = threading.Event()
        self._deleting = threading.Event()
        self._vanished = False
        self._stop_grace: float | None = None
        self._thread = threading.Thread(target=self._run, name=f"pod-{self.namespace}/{self.name}", daemon=True)

    @property
    def log_path(self) -> Path:
        return self.node.log_path(self.namespace, self.name)

    @property
    def finished(self) -> bool:
        return not self._thread.is_alive()

    def container_log(self, container: str, previous: bool) -> LogSource:
        """The log of `container`'s current run (or the one before); LogRequestError if none, with
        the kubelet's wording."""
        names = [spec["name"] for spec in (*self._init_specs, *self._specs)]
        if container not in names:
            raise LogRequestError(
                400, f"container {container} is not valid for pod {self.name} (containers: {', '.join(names)})"
            )
        runner = next((r for r in list(self._runners) if r.name == container), None)
        found = runner.log_of(previous=previous) if runner is not None else None
        if found is None:
            if previous:
                raise LogRequestError(
                    400, f'previous terminated container "{container}" in pod "{self.name}" not found'
                )
            raise LogRequestError(400, f'container "{container}" in pod "{self.name}" is waiting to start')
        path, running = found
        return LogSource(path, running)

    def start(self) -> None:
        self._thread.start()

    def update(self, pod: dict[str, Any]) -> None:
        self._pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            self._deleting.set()
        self._wake.set()

    def vanished(self) -> None:
        """The pod object is gone (force-deleted, or its namespace): stop without deleting anything."""
        self._vanished = True
        self._deleting.set()
        self._wake.set()

    def shutdown(self, grace: float) -> None:
        """The node stops: kill the pod's processes, leave the pod object as it is."""
        self._stop_grace = grace
        self._deleting.set()
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -- lifecycle ----------------------------------------------------------------

    def _run(self) -> None:
        log = self.node.log
        log.info("pod %s/%s (%s): starting", self.namespace, self.name, self.uid)
        try:
            if not self._lost_in_restart() and self._set_up():
                self._run_containers()
        except Exception:
            log.exception("pod %s/%s: worker failed; stopping its processes", self.namespace, self.name)
        try:
            # Back to nothing running at once, then wait for the pod's deletion (or the node's stop).
            self._release()
            self._wait([])
            self._release()
            if self._stop_grace is None:
                self._remove_files()
                if not self._vanished:
                    self._confirm_deletion()
        except Exception:
            log.exception("pod %s/%s: clean-up failed", self.namespace, self.name)
        log.info("pod %s/%s: done", self.namespace, self.name)

    def _lost_in_restart(self) -> bool:
        """Carry restart counts over from a previous run of this node; True if the pod cannot go on.

        Processes die with the node, so a pod that ran before is restarted; under
        restartPolicy Never it cannot be, and fails as a pod on a rebooted node does.
        """
        status = self._pod.get("status") or {}
        previous = {s["name"]: s for s in status.get("containerStatuses") or []}
        previous.update({s["name"]: s for s in status.get("initContainerStatuses") or []})
        ran = False
        for record in [*self._init_records, *self._records]:
            old = previous.get(record.name)
            if old is None or ("waiting" in (old.get("state") or {}) and not old.get("lastState")):
                continue
            ran = True
            record.restart_count = int(old.get("restartCount", 0)) + (0 if self._policy == "Never" else 1)
        if not ran or self._policy != "Never":
            return False
        message = "the process node restarted; the container's processes are gone"
        for record in [*self._init_records, *self._records]:
            record.state = terminated(137, self._start_time, now(), "ProcessNodeRestarted", message)
            record.done = True
        self._report()
        return True

    def _set_up(self) -> bool:
        if self._deleting.is_set():
            return False  # Bound, then deleted before this node saw it.
        for name in ("volumes", "containers", "shm"):
            (self._dir / name).mkdir(parents=True, exist_ok=True)
        (self._dir / "tmp").mkdir(exist_ok=True)
        (self._dir / "tmp").chmod(0o1777)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._address = self.node.addresses.allocate()
        volumes = self._retry(self._prepare_volumes)
        if volumes is None:
            return False
        self._volumes = volumes
        if self._retry(self._start_sandbox) is None:
            return False
        where = f"address {self._address}, netns {self._netns}, log {self.log_path}"
        self.node.log.info("pod %s/%s: %s", self.namespace, self.name, where)
        self._report()
        return True

    def _retry(self, step: Callable[[], T]) -> T | None:
        """Run a set-up step until it works (as the kubelet retries); None if the pod is deleted meanwhile."""
        while True:
            try:
                return step()
            except (ConfigError, ApiError, network.NetworkError, SandboxError, OSError) as error:
                self.node.log.warning("pod %s/%s: %s", self.namespace, self.name, error)
                for record in [*self._init_records, *self._records]:
                    record.state = waiting("ContainerCreating", str(error))
                self._report()
            if self._deleting.wait(SETUP_RETRY):
                return None

    def _prepare_volumes(self) -> dict[str, PodVolume]:
        node = self.node
        return prepare_volumes(self._pod, self._dir, self._files, self._token, self._address, node.host_ip, self._claim)

    def _start_sandbox(self) -> bool:
        self._kill_sandbox()
        network.create_pod_network(self._netns, self._address)
        memory = [volume.path for volume in self._volumes.values() if volume.memory]
        spec = {
            "parent": os.getpid(),
            "netns": f"/run/netns/{self._netns}",
            "hostname": self._hostname,
            "tmpfs": [{"path": str(self._dir / "shm"), "mode": "1777"}]
            + [{"path": str(path), "mode": "777"} for path in memory],
        }
        spec_path = self._dir / "sandbox.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        with self.log_path.open("ab") as log:
            self._sandbox = subprocess.Popen(
                launcher.command(self.node.python, "sandbox", spec_path),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd="/",
                env=LAUNCHER_ENV,
                start_new_session=True,
            )
        assert self._sandbox.stdout is not None
        ready, _, _ = select.select([self._sandbox.stdout], [], [], SANDBOX_START_TIMEOUT)
        line = self._sandbox.stdout.readline().decode().strip() if ready else ""
        if line != launcher.READY:
            self._kill_sandbox()
            raise SandboxError(f"the pod sandbox did not start (see {self.log_path})")
        dns = self.node.dns
        self._hosts_file = dns.hosts_file(self.namespace)
        dns.publish(self._pod, self._address)
        (self._dir / "resolv.conf").write_text(resolv_conf(self.namespace))
        (self._dir / "hostname").write_text(self._hostname + "\n")
        return True

    def _run_containers(self) -> None:
        for spec, record in zip(self._init_specs, self._init_records, strict=True):
            if self._wait([self._runner(spec, record, init=True)]):
                return
            if record.exit_code != 0:
                self._init_failed = True
                self._report()
                return
        for spec, record in zip(self._specs, self._records, strict=True):
            self._runner(spec, record, init=False)
        self._wait(self._runners)

    def _runner(self, spec: dict[str, Any], record: ContainerRecord, *, init: bool) -> ContainerRunner:
        assert self._sandbox is not None
        runner = ContainerRunner(
            record,
            pod=f"{self.namespace}/{self.name}",
            policy=self._policy,
            init=init,
            prepare=lambda: self._launch(spec),
            files=ContainerFiles(self._dir / "containers" / spec["name"]),
            sandbox_pid=self._sandbox.pid,
            python=self.node.python,
            log_path=self.log_path,
            notify=self._changed,
            log=self.node.log,
        )
        self._runners.append(runner)
        runner.start()
        return runner

    def _wait(self, runners: Sequence[ContainerRunner]) -> bool:
        """Wait until `runners` have finished (no runners: until the pod goes away); True if it goes away first."""
        while not self._deleting.is_set():
            if runners and all(runner.finished for runner in runners):
                return False
            self._wake.wait(1.0)
            self._wake.clear()
            if self._reported is None:
                self._report()  # An earlier report failed; try again.
        return True

    def _changed(self) -> None:
        self._report()
        self._wake.set()

    # -- what a container run needs ----------------------------------------------------

    def _launch(self, container: Mapping[str, Any]) -> Launch:
        """Resolve env, command and mounts afresh for each run, as the kubelet does."""
        objects: dict[tuple[str, str], dict[str, bytes] | None] = {}

        def text(kind: str, name: str) -> dict[str, str] | None:
            if (kind, name) not in objects:
                objects[kind, name] = self._files(kind, name)
            data = objects[kind, name]
            return None if data is None else {k: v.decode(errors="replace") for k, v in data.items()}

        base = {**self.node.base_env, "HOSTNAME": self._hostname}
        try:
            env = container_env(self._pod, container, text, self._address, self.node.host_ip, base)
        except (ApiError, OSError) as error:
            raise ConfigError(f"reading the container's environment: {error}") from None
        argv = command_line(container, env)
        # The environment binds last: a volume at /tmp (an emptyDir, as read-only-root pods
        # have) would hide them otherwise.
        mounts = [
            *self._standard_mounts(),
            *container_mounts(container, self._volumes, env),
            *(Mount(str(path), str(path), readonly=True) for path in _environment_under_tmp(self.node.bin_dir)),
        ]
        return Launch(
            argv,
            env,
            container.get("workingDir") or "/",
            mounts,
            container.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH,
            container.get("terminationMessagePolicy") or "File",
        )

    def _standard_mounts(self) -> list[Mount]:
        assert self._hosts_file is not None
        return [
            Mount(str(self._dir / "tmp"), "/tmp"),
            Mount(str(self._dir / "shm"), "/dev/shm"),
            Mount(str(self._hosts_file), "/etc/hosts", readonly=True),
            Mount(str(self._dir / "hostname"), "/etc/hostname", readonly=True),
            Mount(str(self._dir / "resolv.conf"), "/etc/resolv.conf", readonly=True),
        ]

    def _files(self, kind: str, name: str) -> dict[str, bytes] | None:
        """A ConfigMap's or Secret's keys and contents; None if it does not exist."""
        resource = "configmaps" if kind == "configmap" else "secrets"
        status, text = self.node.api.request("GET", f"/api/v1/namespaces/{self.namespace}/{resource}/{name}")
        if status == 404:
            return None
        if status != 200:
            raise ApiError(status, "", text)
        item = json.loads(text)
        if kind == "secret":
            return {key: base64.b64decode(value) for key, value in (item.get("data") or {}).items()}
        files = {key: value.encode() for key, value in (item.get("data") or {}).items()}
        files.update({key: base64.b64decode(value) for key, value in (item.get("binaryData") or {}).items()})
        return files

    def _claim(self, name: str) -> Path:
        """The host path of the PersistentVolume bound to claim `name` (hostPath or local)."""
        status, text = self.node.api.request(
            "GET", f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{name}"
        )
        if status == 404:
            raise ConfigError(f"persistentVolumeClaim {name!r} not found")
        if status != 200:
            raise ApiError(status, "", text)
        claim = json.loads(text)
        volume = claim.get("spec", {}).get("volumeName")
        if not volume or claim.get("status", {}).get("phase") != "Bound":
            raise ConfigError(f"persistentVolumeClaim {name!r} is not bound to a PersistentVolume yet")
        status, text = self.node.api.request("GET", f"/api/v1/persistentvolumes/{volume}")
        if status != 200:
            raise ApiError(status, "", text)
        spec = json.loads(text).get("spec", {})
        source = spec.get("hostPath") or spec.get("local")
        if not source:
            raise ConfigError(f"PersistentVolume {volume!r}: only hostPath and local volumes run on the process node")
        return Path(source["path"])

    def _token(self, audience: str | None, expiration: int) -> str:
        """A service-account token bound to this pod (TokenRequest), as the kubelet gets for projected volumes."""
        account = self._pod["spec"].get("serviceAccountName") or "default"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": expiration,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": self.name, "uid": self.uid},
            },
        }
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token"
        return str(self.node.api.call("POST", path, body)["status"]["token"])

    # -- status -------------------------------------------------------------------

    def _report(self) -> None:
        """Patch the pod's status if it changed. Not while the pod goes away: the object is about to vanish."""
        if self._deleting.is_set():
            return
        with self._report_lock:
            phase = pod_phase(self._init_records, self._records, init_failed=self._init_failed)
            conditions = pod_conditions(
                self._conditions,
                phase=phase,
                sandbox_ready=self._sandbox is not None,
                init=self._init_records,
                containers=self._records,
            )
            status = pod_status(
                phase=phase,
                conditions=conditions,
                pod_ip=self._address,
                host_ip=self.node.host_ip,
                start_time=self._start_time,
                init=self._init_records,
                containers=self._records,
            )
            if status == self._reported:
                return
            path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status"
            try:
                # The uid makes the patch fail on a new pod of the same name (StatefulSets reuse names).
                self.node.api.merge_patch(path, {"metadata": {"uid": self.uid}, "status": status})
            except (ApiError, OSError) as error:
                self.node.log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, error)
                self._reported = None
                return
            self._reported = status
            self._conditions = conditions

    # -- the end ------------------------------------------------------------------

    def _grace(self) -> float:
        if self._stop_grace is not None:
            return self._stop_grace
        metadata = self._pod["metadata"]
        seconds = metadata.get("deletionGracePeriodSeconds")
        if seconds is None:
            seconds = self._pod["spec"].get("terminationGracePeriodSeconds", MAX_GRACE)
        return float(min(max(seconds, 0), MAX_GRACE))

    def _release(self) -> None:
        """Stop the containers and give back the sandbox, network namespace, address and DNS entry."""
        runners = [runner for runner in self._runners if not runner.finished]
        if runners:
            grace = self._grace()
            self.node.log.info("pod %s/%s: stopping containers (grace %.0f s)", self.namespace, self.name, grace)
            for runner in runners:
                runner.stop(signal.SIGTERM)
            deadline = time.monotonic() + grace
            for runner in runners:
                runner.join(max(0.0, deadline - time.monotonic()))
            for runner in runners:
                if not runner.finished:
                    runner.stop(signal.SIGKILL)
                    runner.join(10)
        self._kill_sandbox()
        if self._address:
            self.node.dns.withdraw(self.uid)
            self.node.addresses.release(self._address)
            self._address = ""

    def _kill_sandbox(self) -> None:
        if self._sandbox is not None:
            self._sandbox.kill()
            self._sandbox.wait()
            if self._sandbox.stdout is not None:
                self._sandbox.stdout.close()
            self._sandbox = None
        # Whatever is left in the namespace (nothing, normally: the PID namespaces saw to it).
        leftovers = network.kill_processes(self._netns)
        if leftovers:
            self.node.log.info("pod %s/%s: killed leftover processes %s", self.namespace, self.name, leftovers)
        network.delete_pod_network(self._netns)

    def _remove_files(self) -> None:
        mounted = mounted_below(self._dir)
        if mounted:
            # Never remove through a mount point: it could reach host data.
            self.node.log.warning(
                "pod %s/%s: keeping %s, still mounted: %s", self.namespace, self.name, self._dir, mounted
            )
            return
        shutil.rmtree(self._dir, ignore_errors=True)

    def _confirm_deletion(self) -> None:
        """Delete the object for good, as the kubelet does once the pod's processes are gone."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        try:
            status, text = self.node.api.request("DELETE", path, body)
        except OSError as error:
            self.node.log.warning("pod %s/%s: delete failed: %s", self.namespace, self.name, error)
            return
        if status not in (200, 202, 404, 409):
            self.node.log.warning("pod %s/%s: delete failed: HTTP %d %s", self.namespace, self.name, status, text[:200])


REPO_ROOT = Path(__file__).resolve().parents[3]


def _environment_under_tmp(bin_dir: Path) -> list[Path]:
    """The virtualenv and the project (editable installs point into it) when under /tmp: the
    pod's own /tmp hides the host's, and a CI clone lives there; bound back so the image's
    stand-in runs."""
    tmp = Path("/tmp")
    roots = sorted({bin_dir.resolve().parent, REPO_ROOT.resolve()}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for root in roots:
        if root.is_relative_to(tmp) and root != tmp and not any(root.is_relative_to(k) for k in kept):
            kept.append(root)
    return kept
