"""Helpers for the operator's cluster tests: the operator run in-process (in a thread
of the test process, against the local control plane), small RLJobs derived from
examples/tiny-cpu.yaml, and a per-namespace view of a job and its children.

kwok simulates the pods: they become Running/Ready on their own, the chaos label
fails one, and `finish_driver` makes the controller pod's container exit 0 as a
kubelet reports it for a restartPolicy Always pod (phase stays Running).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import kopf
import yaml
from kubernetes.client import ApiClient, AppsV1Api, CoreV1Api, CustomObjectsApi, RbacAuthorizationV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.config import kube_config

from rlkube_api.crd import CRD_FILES, RUNTIME_CRD_FILES
from rlkube_api.names import ANNOTATION_ATTEMPT, ANNOTATION_PROGRESS, LABEL_JOB, LABEL_ROLE
from rlkube_api.rljob import GROUP, PLURAL, VERSION
from rlkube_e2e.testing import Kubectl, wait_established, wait_for
from rlkube_operator import handlers  # noqa: F401  (on import, the handlers register with kopf)

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"
PODGROUP_CRDS = Path(__file__).resolve().parent / "crds"
PODGROUP_CRD_NAMES = ("podgroups.scheduling.volcano.sh", "podgroups.scheduling.x-k8s.io")
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
# Pods of the tiny job: controller + 2 actor + 1 rollout.
TINY_PODS = 4
TINY_ROLES = {"controller": 1, "actor": 2, "rollout": 1}


# --- the operator, in-process ------------------------------------------------------------------


class InProcessOperator:
    """The real operator (rlkube_operator.handlers) run by kopf in a thread of the
    test process: the same handlers, settings and metrics registry as
    `python -m rlkube_operator`, started and stopped on demand.

    `kopf.operator()` is used directly rather than kopf.testing.KopfRunner: the
    runner goes through click's CliRunner, which swaps sys.stdin/stdout/stderr for
    the whole process for as long as the operator runs (all of a test session
    here) and fights pytest's capture; kopf.operator() takes the same stop and
    ready flags without that. One instance per session: `start` refuses to run a
    second operator at the same time.
    """

    _lock = threading.Lock()
    _active: InProcessOperator | None = None

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.starts = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 60.0) -> None:
        with InProcessOperator._lock:
            if InProcessOperator._active is not None:
                raise RuntimeError("an operator is already running against the test cluster")
            InProcessOperator._active = self
        # kopf's login and the operator's own client (kube.connect) call
        # load_kube_config(), which reads KUBECONFIG as it was when the kubernetes
        # package was first imported (earlier in this process): set both.
        os.environ["KUBECONFIG"] = str(self.kubeconfig)
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(self.kubeconfig)
        logging.getLogger("rlkube_operator").setLevel(logging.INFO)
        self._stop = threading.Event()
        ready = threading.Event()
        self._error = None

        def run() -> None:
            try:
                asyncio.run(kopf.operator(clusterwide=True, standalone=True, stop_flag=self._stop, ready_flag=ready))
            except BaseException as error:
                self._error = error

        self._thread = threading.Thread(target=run, name=f"rlkube-operator-{self.starts}", daemon=True)
        self._thread.start()
        self.starts += 1
        deadline = time.monotonic() + timeout
        while not ready.wait(0.1):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the operator did not start: {self._error!r}")

    def stop(self, timeout: float = 60.0) -> float:
        """Stops the operator; returns how long that took."""
        started = time.monotonic()
        try:
            if self._thread is not None:
                self._stop.set()
                self._thread.join(timeout)
                if self._thread.is_alive():
                    raise RuntimeError(f"the operator did not stop within {timeout:.0f} s")
                self._thread = None
            if self._error is not None:
                raise RuntimeError("the operator crashed") from self._error
        finally:
            with InProcessOperator._lock:
                if InProcessOperator._active is self and not self.running:
                    InProcessOperator._active = None
        return time.monotonic() - started


# kopf's log line once the operator's start-up handler ran.
STARTED = "Activity 'configure' succeeded"


class OperatorProcess:
    """The operator as its own process (`python -m rlkube_operator -n NAMESPACE`), as a
    cluster runs it: started, SIGKILLed (no clean shutdown, as an OOM kill or a lost node
    does) and started again. Every start appends to one log."""

    def __init__(self, namespace: str, kubeconfig: Path, log_path: Path) -> None:
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        args = ["-n", self.namespace, "--metrics-port", "0", "--health-port", str(free_port())]
        with self.log_path.open("ab") as log:
            log.write(f"==> start {self.starts}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rlkube_operator", *args], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.starts += 1

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_started(self, timeout: float = 60.0) -> None:
        """Until the latest start has run its start-up handler (its watches begin then)."""
        wait_for(
            lambda: self.log().count(STARTED) >= self.starts or not self.running,
            "the operator to start",
            timeout,
        )
        assert self.running, f"the operator exited: {self.log()[-2000:]}"

    def kill(self) -> None:
        assert self.process is not None and self.running, f"the operator exited: {self.log()[-2000:]}"
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- CRDs ----------------------------------------------------------------------------------------


def install_rljob_crd(kubectl: Kubectl) -> None:
    """The RLJob CRD and the runtimes' (which the operator watches)."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILES[0]), "-f", str(RUNTIME_CRD_FILES[0]))
    for crd in ("rljobs.rlkube.dev", "rljobruntimes.rlkube.dev", "clusterrljobruntimes.rlkube.dev"):
        wait_established(kubectl, crd)


def install_podgroup_crds(kubectl: Kubectl) -> None:
    for path in sorted(PODGROUP_CRDS.glob("*.yaml")):
        kubectl("apply", "--server-side", "-f", str(path))
    for name in PODGROUP_CRD_NAMES:
        wait_established(kubectl, name)


def uninstall_podgroup_crds(kubectl: Kubectl) -> None:
    for name in PODGROUP_CRD_NAMES:
        kubectl("delete", "crd", name, "--ignore-not-found", "--wait=true", timeout=120)


# --- jobs ----------------------------------------------------------------------------------------


def tiny_job(name: str, namespace: str, overrides: dict[str, Any] | None = None) -> Obj:
    """examples/tiny-cpu.yaml as `name` in `namespace`, with dotted-path overrides
    ('spec.runPolicy.backoffLimit': 0); a value of None removes the key."""
    body: Obj = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": name, "namespace": namespace}
    for path, value in (overrides or {}).items():
        *parents, leaf = path.split(".")
        node = body
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return body


def condition(job: Obj, type_: str) -> Obj | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def is_true(job: Obj, type_: str) -> bool:
    cond = condition(job, type_)
    return cond is not None and cond.get("status") == "True"


def attempt(pod: Obj) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(ANNOTATION_ATTEMPT, "-1"))


def ready(pod: Obj) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


class Jobs:
    """RLJobs and their children in one namespace, read the way a user would see them."""

    def __init__(self, api: ApiClient, kubectl: Kubectl, namespace: str) -> None:
        self.api = api
        self.kubectl = kubectl
        self.namespace = namespace
        self.core = CoreV1Api(api)
        self.apps = AppsV1Api(api)
        self.custom = CustomObjectsApi(api)
        self.rbac = RbacAuthorizationV1Api(api)

    def plain(self, obj: Any) -> Obj:
        """A client model object as the API server's JSON (camelCase keys)."""
        return cast(Obj, self.api.sanitize_for_serialization(obj))  # type: ignore[no-untyped-call]

    # --- the RLJob ---

    def create(self, body: Obj, reward: bool = True) -> Obj:
        """Creates the RLJob; with `reward`, first the reward ConfigMap it names, as a user
        does (the operator creates no pod while an object the pods name is missing)."""
        if reward:
            self.create_reward_config_map(body)
        return cast(Obj, self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body))

    def create_reward_config_map(self, body: Obj) -> None:
        """The ConfigMap `body`'s reward function names (kwok runs no trainer: its code is a stub),
        unless it exists."""
        ref = ((body["spec"].get("reward") or {}).get("function") or {}).get("configMap")
        if ref is None:
            return
        config_map = {"metadata": {"name": ref["name"]}, "data": {ref["key"]: "def compute_score(*_): return 0.0\n"}}
        try:
            self.core.create_namespaced_config_map(self.namespace, config_map)
        except ApiException as error:
            if error.status != 409:
                raise

    def get(self, name: str) -> Obj:
        return cast(Obj, self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name))

    def exists(self, name: str) -> bool:
        try:
            self.get(name)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def patch(self, name: str, patch: Obj) -> Obj:
        """A merge patch of the RLJob (spec, metadata)."""
        self.kubectl("patch", "rljob", name, "-n", self.namespace, "--type=merge", "-p", json.dumps(patch))
        return self.get(name)

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def delete_all(self, timeout: float = 30.0) -> None:
        """Deletes every RLJob of the namespace and waits until the operator has let them go."""
        self.kubectl("delete", "rljobs", "--all", "-n", self.namespace, "--wait=false")

        def none_left() -> bool:
            listing = cast(Obj, self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL))
            return not listing["items"]

        wait_for(none_left, f"every RLJob of namespace {self.namespace} to be deleted", timeout)

    def wait(self, name: str, check: Callable[[Obj], bool], what: str, timeout: float = 30.0) -> Obj:
        """Polls the RLJob until `check` holds; the timeout message shows its last status."""
        last: list[Obj] = [{}]

        def probe() -> Obj | None:
            job = self.get(name)
            last[0] = job
            return job if check(job) else None

        try:
            return wait_for(probe, f"RLJob {self.namespace}/{name}: {what}", timeout=timeout)
        except AssertionError as error:
            raise AssertionError(f"{error}; last status: {json.dumps(last[0].get('status'), indent=1)}") from None

    def wait_state(self, name: str, state: str, timeout: float = 30.0) -> Obj:
        return self.wait(name, lambda j: (j.get("status") or {}).get("state") == state, f"state {state}", timeout)

    def wait_running(self, name: str, restarts: int = 0, timeout: float = 30.0) -> Obj:
        """State Running with the Running condition True (every pod Ready), after `restarts` gang restarts."""

        def check(job: Obj) -> bool:
            status = job.get("status") or {}
            running = status.get("state") == "Running" and is_true(job, "Running")
            return running and status.get("restartCount", 0) == restarts

        return self.wait(name, check, f"state Running after {restarts} restarts", timeout)

    # --- children ---

    def pods(self, name: str, include_deleting: bool = False) -> list[Obj]:
        items = self.core.list_namespaced_pod(self.namespace, label_selector=f"{LABEL_JOB}={name}").items
        pods = [self.plain(p) for p in items]
        return [p for p in pods if include_deleting or not p["metadata"].get("deletionTimestamp")]

    def pod(self, pod_name: str) -> Obj:
        return self.plain(self.core.read_namespaced_pod(pod_name, self.namespace))

    def wait_pods(self, name: str, count: int, at_attempt: int = 0, timeout: float = 30.0) -> list[Obj]:
        """`count` pods, all Running and Ready, all of the given attempt, none being deleted."""

        def probe() -> list[Obj] | None:
            pods = self.pods(name, include_deleting=True)
            good = [
                p
                for p in pods
                if p["status"].get("phase") == "Running"
                and ready(p)
                and attempt(p) == at_attempt
                and not p["metadata"].get("deletionTimestamp")
            ]
            return pods if len(good) == count == len(pods) else None

        return wait_for(probe, f"{count} Ready pods of attempt {at_attempt} of job {name}", timeout)

    def wait_no_pods(self, name: str, timeout: float = 30.0) -> None:
        wait_for(lambda: not self.pods(name, include_deleting=True), f"no pods of job {name}", timeout)

    def statefulsets(self, name: str) -> dict[str, Obj]:
        items = self.apps.list_namespaced_stateful_set(self.namespace, label_selector=f"{LABEL_JOB}={name}").items
        plain = [self.plain(s) for s in items]
        return {s["metadata"]["name"]: s for s in plain}

    def children(self, name: str) -> dict[str, Obj]:
        """'Kind/name' -> object for every child kind the operator always creates."""
        selector = f"{LABEL_JOB}={name}"
        ns = self.namespace
        found: dict[str, Any] = {}
        listings: list[tuple[str, Any]] = [
            ("StatefulSet", self.apps.list_namespaced_stateful_set(ns, label_selector=selector)),
            ("Service", self.core.list_namespaced_service(ns, label_selector=selector)),
            ("ConfigMap", self.core.list_namespaced_config_map(ns, label_selector=selector)),
            ("ServiceAccount", self.core.list_namespaced_service_account(ns, label_selector=selector)),
            ("Role", self.rbac.list_namespaced_role(ns, label_selector=selector)),
            ("RoleBinding", self.rbac.list_namespaced_role_binding(ns, label_selector=selector)),
        ]
        for kind, listing in listings:
            for item in listing.items:
                obj = self.plain(item)
                found[f"{kind}/{obj['metadata']['name']}"] = obj
        return found

    def child_uids(self, name: str) -> dict[str, str]:
        return {key: obj["metadata"]["uid"] for key, obj in self.children(name).items()}

    def podgroups(self, group: str, version: str) -> list[Obj]:
        listing = cast(Obj, self.custom.list_namespaced_custom_object(group, version, self.namespace, "podgroups"))
        items: list[Obj] = listing["items"]
        return items

    # --- what happens to pods ---

    def fail_pod(self, pod_name: str, exit_code: int = 1, message: str = "container failed") -> None:
        """kwok's chaos stage turns the Running pod Failed, its container terminated with
        this exit code and termination message."""
        annotations = {f"{FAIL_LABEL}/exit-code": str(exit_code), f"{FAIL_LABEL}/message": message}
        patch = {"metadata": {"labels": {FAIL_LABEL: "true"}, "annotations": annotations}}
        self.core.patch_namespaced_pod(pod_name, self.namespace, patch)

    def finish_driver(self, name: str) -> None:
        """The driver exits 0: the controller pod's container terminates with exit
        code 0 while the pod stays Running (restartPolicy Always), as a kubelet
        reports it before restarting the container."""
        pod_name = f"{name}-controller-0"
        pod = self.pod(pod_name)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        statuses = copy.deepcopy(pod["status"]["containerStatuses"])
        statuses[0]["ready"] = False
        statuses[0]["started"] = False
        started = (statuses[0].get("state") or {}).get("running", {}).get("startedAt", now)
        statuses[0]["state"] = {
            "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": now}
        }
        self._patch_pod_status(pod_name, {"containerStatuses": statuses})

    def crash_container(self, pod_name: str, exit_code: int = 1, reason: str = "Error", message: str = "") -> None:
        """The container exits non-zero and the kubelet restarts it in place
        (restartPolicy Always): phase stays Running, restartCount 1, the exit in lastState."""
        pod = self.pod(pod_name)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        statuses = copy.deepcopy(pod["status"]["containerStatuses"])
        first = statuses[0]
        started = (first.get("state") or {}).get("running", {}).get("startedAt", now)
        first["restartCount"] = int(first.get("restartCount", 0)) + 1
        first["lastState"] = {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason,
                "message": message,
                "startedAt": started,
                "finishedAt": now,
            }
        }
        first["state"] = {"running": {"startedAt": now}}
        self._patch_pod_status(pod_name, {"containerStatuses": statuses})

    def _patch_pod_status(self, pod_name: str, status: Obj) -> None:
        self.kubectl(
            "patch", "pod", pod_name, "-n", self.namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip

    def report_progress(self, name: str, progress: Obj) -> None:
        """What the driver does: its progress as JSON in its own pod's annotation."""
        patch = {"metadata": {"annotations": {ANNOTATION_PROGRESS: json.dumps(progress)}}}
        self.core.patch_namespaced_pod(f"{name}-controller-0", self.namespace, patch)

    # --- what users see ---

    def events(self, name: str) -> list[Obj]:
        items = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.kind=RLJob,involvedObject.name={name}"
        ).items
        return [self.plain(e) for e in items]

    def wait_event(self, name: str, reason: str, timeout: float = 15.0) -> Obj:
        def probe() -> Obj | None:
            return next((e for e in self.events(name) if e.get("reason") == reason), None)

        return wait_for(probe, f"an Event {reason} for RLJob {name}", timeout)

    def table(self, resource: str, name: str, *extra: str) -> dict[str, str]:
        """`kubectl get <resource> <name>` as {column: value}."""
        out = self.kubectl("get", resource, name, "-n", self.namespace, *extra).stdout.splitlines()
        assert len(out) == 2, out
        header, row = out
        # Column starts from the header (values may be empty: "<none>" is printed then).
        starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
        bounds = [*starts[1:], None]
        return {header[s:e].strip(): row[s:e].strip() for s, e in zip(starts, bounds, strict=True)}


def roles_of(pods: list[Obj]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pod in pods:
        role = pod["metadata"]["labels"][LABEL_ROLE]
        counts[role] = counts.get(role, 0) + 1
    return counts
