"""Operator benchmark: apply-to-running latency against the floor,
and 500 RLJobs at once. A benchmark, not a test: it prints numbers and asserts none.

    .venv/bin/python bench/operator_scale.py                      # the full run
    .venv/bin/python bench/operator_scale.py --jobs 50 --latency-samples 5   # a quick one

It starts its own local control plane (rlkube_e2e.cluster.LocalCluster, kwok nodes
from bench/operator_scale_pools.yaml) in a fresh temporary state dir, installs the
RLJob CRD, and runs the operator as a subprocess (`python -m rlkube_operator -n NS`),
exactly as a user would. Every RLJob is examples/tiny-cpu.yaml (controller + 2 actor
+ 1 rollout pods, 11 children).

(a) Latency, N samples, alternating operator / floor:
    operator: `kubectl apply --server-side` of an RLJob → every child exists and every
              pod is Running;
    floor:    `kubectl apply --server-side` of the very manifests the builders produce
              (rlkube_operator.desired.desired_children(job, uid, 0, True, ray_token),
              ownerReferences stripped) in a namespace the operator does not watch → the
              same pods Running.
    Pod and StatefulSet times come from watches held by this process (receive time of
    the event). Both sides include kubectl's start-up; the table splits the time into
    kubectl, → first/last StatefulSet, → first pod, first pod → all Running.
(b) Scale: a fresh operator watching one namespace; one warm-up job (not counted);
    then J RLJobs created at once from a thread pool. Measured:
    - reconciled: from the first create call until every job has
      status.observedGeneration (its first status write);
    - all Running: until every job has status.state == Running;
    - operator peak RSS: VmHWM of the operator process (/proc/PID/status);
    - status lag (burst): per job, from the moment the last of its pods is seen Ready
      to the moment status.state == Running is seen, while the 500 jobs start up;
    - status lag (steady): once everything is Running, the controller pod of every job
      gets an `rlkube.dev/progress` annotation (what the driver writes) at a fixed
      rate; lag = from just before the patch is sent until status.progress.step shows
      the new step;
    - idle cost: operator CPU (cores) and reconcile passes started per second over a
      window (default 35 s; the operator's idle requeue was once 30 s, about
      300 s now, so the window now shows the cost of nothing happening) that begins
      `--settle` seconds (default 30) after every job is Running, nothing changing;
      and CPU, reconcile passes and status writes (RLJob MODIFIED events) of the burst;
    - floor (`--no-scale-floor` skips it): after the operator's run, the same children
      of J jobs applied directly by the same number of threads, with the operator's
      own apply call (one task per job, children in the operator's order), and the
      time until all those pods are Running.
    `--operator-env KEY=VALUE` runs the operator with extra environment, for
    experiments (e.g. MALLOC_ARENA_MAX=2).

Everything is torn down at the end, also on failure or Ctrl-C: the operator is
stopped, the namespaces deleted and the cluster stopped (its state dir removed).
The operator's log is kept in a temporary folder whose path is printed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import math
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any, cast

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from rlkube_api.crd import CRD_FILES
from rlkube_api.names import ANNOTATION_PROGRESS, LABEL_JOB
from rlkube_api.rljob import GROUP, PLURAL, VERSION
from rlkube_api.validation import parse_rljob
from rlkube_e2e.cluster import LocalCluster
from rlkube_e2e.testing import Kubectl, wait_for
from rlkube_e2e.testing import create_namespace as create_labelled_namespace
from rlkube_operator.desired import desired_children
from rlkube_operator.kube import PLURALS, Kube

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"
POOLS = Path(__file__).resolve().parent / "operator_scale_pools.yaml"
# Pods of the tiny job.
TINY_PODS = ("controller-0", "actor-0", "actor-1", "rollout-0")
# Namespaces the bench creates carry this label; all are deleted at the end.
BENCH_LABEL, BENCH = "rlkube.dev/bench", "operator-scale"
GOAL_RATIO = 1.2
GOAL_RECONCILED_S = 60.0
GOAL_RSS_MB = 300.0
GOAL_LAG_S = 2.0


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- small statistics --------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 20 samples is the largest)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": float(len(values)),
        "median": statistics.median(values) if values else math.nan,
        "p99": percentile(values, 99),
        "max": max(values) if values else math.nan,
    }


# --- watches ------------------------------------------------------------------------------------------


class Watcher:
    """Holds one watch (list + watch, restarted on expiry) on a namespaced collection
    and hands every object to `handle(obj, received_at)`. Raw JSON, no client models:
    this process shares 2 cores with everything it measures."""

    def __init__(self, name: str, list_fn: Callable[..., Any], handle: Callable[[str, Obj, float], None]) -> None:
        self.list_fn = list_fn
        self.handle = handle
        self.stop = threading.Event()
        self.synced = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)

    def start(self) -> Watcher:
        self.thread.start()
        if not self.synced.wait(30):
            raise RuntimeError(f"{self.thread.name}: initial list did not return: {self.error!r}")
        return self

    def _run(self) -> None:
        version = ""
        while not self.stop.is_set():
            try:
                if not version:
                    response = self.list_fn(_preload_content=False)
                    listing = json.loads(response.data)
                    now = time.monotonic()
                    for item in listing["items"]:
                        self.handle("ADDED", item, now)
                    version = listing["metadata"]["resourceVersion"]
                    self.synced.set()
                response = self.list_fn(
                    watch=True,
                    allow_watch_bookmarks=True,
                    resource_version=version,
                    timeout_seconds=120,
                    _preload_content=False,
                    _request_timeout=150,
                )
                for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                    if not line:
                        continue
                    now = time.monotonic()
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        version = ""  # 410 Gone: list again
                        break
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self.handle(event["type"], obj, now)
                    if self.stop.is_set():
                        return
            except Exception as error:
                self.error = error
                if self.stop.is_set():
                    return
                time.sleep(0.5)


@dataclass
class PodTimes:
    job: str
    added: float
    running: float | None = None
    ready: float | None = None


@dataclass
class JobTimes:
    added: float
    reconciled: float | None = None
    running: float | None = None
    # step -> when status.progress.step was first seen at that value
    steps: dict[int, float] = field(default_factory=dict)
    # MODIFIED events: with nobody editing the spec, the operator's status writes
    modified: int = 0


class Tracker:
    """First-seen times of pods and RLJobs in one namespace, from watches."""

    def __init__(self, api: client.ApiClient, namespace: str, rljobs: bool, statefulsets: bool = False) -> None:
        self.namespace = namespace
        self.cond = threading.Condition()
        self.pods: dict[str, PodTimes] = {}
        self.jobs: dict[str, JobTimes] = {}
        # StatefulSet name -> first seen
        self.sets: dict[str, float] = {}
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        apps = client.AppsV1Api(api)
        self.watchers = [
            Watcher(
                f"pods-{namespace}",
                lambda **kw: core.list_namespaced_pod(namespace, label_selector=LABEL_JOB, **kw),
                self._pod,
            )
        ]
        if rljobs:
            self.watchers.append(
                Watcher(
                    f"rljobs-{namespace}",
                    lambda **kw: custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, **kw),
                    self._job,
                )
            )

        if statefulsets:
            self.watchers.append(
                Watcher(
                    f"statefulsets-{namespace}",
                    lambda **kw: apps.list_namespaced_stateful_set(namespace, label_selector=LABEL_JOB, **kw),
                    self._set,
                )
            )

    def start(self) -> Tracker:
        for watcher in self.watchers:
            watcher.start()
        return self

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.stop.set()

    def _pod(self, kind: str, pod: Obj, now: float) -> None:
        if kind == "DELETED":
            return
        meta = pod["metadata"]
        status = pod.get("status") or {}
        with self.cond:
            times = self.pods.get(meta["name"])
            if times is None:
                times = self.pods[meta["name"]] = PodTimes((meta.get("labels") or {}).get(LABEL_JOB, ""), now)
            if times.running is None and status.get("phase") == "Running":
                times.running = now
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            if times.ready is None and ready:
                times.ready = now
            self.cond.notify_all()

    def _set(self, kind: str, sts: Obj, now: float) -> None:
        with self.cond:
            self.sets.setdefault(sts["metadata"]["name"], now)

    def _job(self, kind: str, job: Obj, now: float) -> None:
        if kind == "DELETED":
            return
        name = job["metadata"]["name"]
        status = job.get("status") or {}
        with self.cond:
            times = self.jobs.get(name)
            if times is None:
                times = self.jobs[name] = JobTimes(now)
            if kind == "MODIFIED":
                times.modified += 1
            if times.reconciled is None and status.get("observedGeneration") is not None:
                times.reconciled = now
            if times.running is None and status.get("state") == "Running":
                times.running = now
            step = (status.get("progress") or {}).get("step")
            if isinstance(step, int) and step not in times.steps:
                times.steps[step] = now
            self.cond.notify_all()

    def wait(self, check: Callable[[], bool], what: str, timeout: float) -> float:
        """Waits (under the lock) until `check()` holds; returns the monotonic time it did."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not check():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
                self.cond.wait(min(left, 1.0))
        return time.monotonic()

    def pods_running(self, job: str) -> float | None:
        """When the last of the job's pods was first seen Running (None: not all yet)."""
        times = [self.pods.get(f"{job}-{suffix}") for suffix in TINY_PODS]
        running = [t.running for t in times if t is not None]
        return max(cast(list[float], running)) if len(running) == len(TINY_PODS) and None not in running else None

    def pods_ready(self, job: str) -> float | None:
        times = [self.pods.get(f"{job}-{suffix}") for suffix in TINY_PODS]
        ready = [t.ready for t in times if t is not None]
        return max(cast(list[float], ready)) if len(ready) == len(TINY_PODS) and None not in ready else None

    def set_spread(self, job: str) -> tuple[float, float]:
        """(first, last) time a StatefulSet of the job was seen."""
        seen = [t for name, t in self.sets.items() if name.startswith(f"{job}-")]
        return min(seen), max(seen)

    def first_pod(self, job: str) -> float | None:
        added = [t.added for suffix in TINY_PODS if (t := self.pods.get(f"{job}-{suffix}")) is not None]
        return min(added) if added else None


# --- the operator as a subprocess --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OperatorProcess:
    """`python -m rlkube_operator --metrics-port P --health-port Q -n NS`, with its log in a file."""

    def __init__(
        self, kubeconfig: Path, namespaces: list[str], log_path: Path, extra_env: dict[str, str] | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.extra_env = extra_env or {}
        self.namespaces = namespaces
        self.log_path = log_path
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 60.0) -> None:
        argv = [sys.executable, "-m", "rlkube_operator", "--metrics-port", str(self.metrics_port)]
        argv += ["--health-port", str(self.health_port)]
        for namespace in self.namespaces:
            argv += ["-n", namespace]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.extra_env}
        with self.log_path.open("ab") as out:
            out.write(f"==> {' '.join(argv)}\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

        def healthy() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the operator exited with {self.process.returncode}; log: {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        wait_for(healthy, "the operator's /healthz", timeout=timeout, interval=0.2)

    def memory_mb(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MB (10^6 bytes)."""
        values: dict[str, float] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024 / 1e6
        return values["VmRSS"], values["VmHWM"]

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime

    def metrics(self) -> dict[str, float]:
        """The operator's Prometheus samples, summed over labels."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            if 'le="' in name_labels:
                bound = name_labels.split('le="', 1)[1].split('"', 1)[0]
                name = f"{name}{{le={bound}}}"
            samples[name] = samples.get(name, 0.0) + float(value)
        return samples

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


class MemorySampler:
    """Samples the operator's RSS every `interval` seconds (the peak is VmHWM anyway)."""

    def __init__(self, operator: OperatorProcess, interval: float = 0.5) -> None:
        self.operator = operator
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError, KeyError):
                self.samples.append((time.monotonic(), self.operator.memory_mb()[0]))


# --- cluster helpers ----------------------------------------------------------------------------------


def tiny_job(name: str, namespace: str) -> Obj:
    body: Obj = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": name, "namespace": namespace}
    return body


def floor_manifests(name: str, namespace: str) -> list[Obj]:
    """The builders' output for the tiny job `name`, without ownerReferences (no RLJob owns them)."""
    job = parse_rljob(tiny_job(name, namespace))
    children = desired_children(job, f"floor-{secrets.token_hex(4)}", 0, True, secrets.token_urlsafe(32))
    for child in children:
        child["metadata"].pop("ownerReferences", None)
    return children


def create_namespace(core: client.CoreV1Api, name: str) -> None:
    """The namespace, with the reward ConfigMap the tiny job names (the operator creates no pod
    while an object the pods name is missing; a user creates it before the jobs)."""
    create_labelled_namespace(core, name, {BENCH_LABEL: BENCH}, timeout=60)
    reward = yaml.safe_load(EXAMPLE.read_text())["spec"]["reward"]["function"]["configMap"]
    core.create_namespaced_config_map(name, {"metadata": {"name": reward["name"]}, "data": {reward["key"]: ""}})


def children_present(api: client.ApiClient, namespace: str, expected: list[Obj]) -> bool:
    """Whether every expected child ('Kind/name') exists, by one list per kind."""
    wanted: dict[str, set[str]] = {}
    for manifest in expected:
        wanted.setdefault(manifest["kind"], set()).add(manifest["metadata"]["name"])
    job = expected[0]["metadata"]["labels"][LABEL_JOB]
    for kind, names in wanted.items():
        api_version = next(m["apiVersion"] for m in expected if m["kind"] == kind)
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}"
        method, url, headers, body, _ = api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=[("labelSelector", f"{LABEL_JOB}={job}")],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = api.call_api(method, url, header_params=headers, body=body)
        response.read()  # type: ignore[no-untyped-call]
        found = {item["metadata"]["name"] for item in json.loads(response.data or b"{}")["items"]}
        if not names <= found:
            return False
    return True


def kubectl_apply(kubectl: Kubectl, objects: list[Obj]) -> float:
    """`kubectl apply --server-side` of the objects from stdin; returns its wall time."""
    document = objects[0] if len(objects) == 1 else {"apiVersion": "v1", "kind": "List", "items": objects}
    started = time.monotonic()
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(document))
    return time.monotonic() - started


# --- (a) latency --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One apply, times in seconds from just before kubectl starts."""

    total: float  # → every pod Running and every child present
    first_pod: float  # → first pod seen
    first_set: float  # → first StatefulSet seen
    last_set: float  # → last StatefulSet seen
    kubectl: float  # kubectl's own wall time
    operator_cpu: float = math.nan  # CPU seconds the operator used during the sample


@dataclass
class LatencyResult:
    operator: list[Sample] = field(default_factory=list)
    floor: list[Sample] = field(default_factory=list)
    # apply → status.state Running (what a user waiting on the RLJob sees)
    operator_status_running: list[float] = field(default_factory=list)
    operator_cpu_s: float = math.nan
    operator_reconciles: float = math.nan


def one_sample(
    api: client.ApiClient,
    kubectl: Kubectl,
    tracker: Tracker,
    name: str,
    objects: list[Obj],
    expected: list[Obj],
    timeout: float,
) -> Sample:
    started = time.monotonic()
    kubectl_wall = kubectl_apply(kubectl, objects)
    pods_at = tracker.wait(lambda: tracker.pods_running(name) is not None, f"pods of {name} Running", timeout)
    done = cast(float, tracker.pods_running(name))
    # Children are applied before the StatefulSets that create the pods, so they are
    # normally there already; if not, the sample ends when they are.
    while not children_present(api, tracker.namespace, expected):
        if time.monotonic() - pods_at > timeout:
            raise TimeoutError(f"children of {name} never all appeared")
        time.sleep(0.02)
        done = time.monotonic()
    with tracker.cond:
        first_set, last_set = tracker.set_spread(name)
        first_pod = cast(float, tracker.first_pod(name))
    return Sample(done - started, first_pod - started, first_set - started, last_set - started, kubectl_wall)


def run_latency(
    api: client.ApiClient,
    kubectl: Kubectl,
    kubeconfig: Path,
    samples: int,
    log_dir: Path,
    timeout: float,
    operator_env: dict[str, str],
) -> LatencyResult:
    core = client.CoreV1Api(api)
    suffix = secrets.token_hex(3)
    op_ns, floor_ns = f"bench-latency-op-{suffix}", f"bench-latency-floor-{suffix}"
    for namespace in (op_ns, floor_ns):
        create_namespace(core, namespace)
    result = LatencyResult()
    operator = OperatorProcess(kubeconfig, [op_ns], log_dir / "operator-latency.log", operator_env)
    op_tracker = Tracker(api, op_ns, rljobs=True, statefulsets=True).start()
    floor_tracker = Tracker(api, floor_ns, rljobs=False, statefulsets=True).start()
    try:
        operator.start()
        cpu_before = operator.cpu_seconds()
        reconciles_before = operator.metrics().get("rlkube_reconcile_total", 0.0)
        # Warm-up (not counted): the operator's watches are live, kubectl's caches warm.
        for tracker, is_op in ((op_tracker, True), (floor_tracker, False)):
            objects = [tiny_job("warmup", op_ns)] if is_op else floor_manifests("warmup", floor_ns)
            one_sample(api, kubectl, tracker, "warmup", objects, floor_manifests("warmup", tracker.namespace), timeout)
        time.sleep(1.0)
        for index in range(samples):
            # Alternate which side goes first, so slow drifts in machine load hit both.
            for is_op in (True, False) if index % 2 == 0 else (False, True):
                cpu = operator.cpu_seconds()
                if is_op:
                    name = f"op-{index}"
                    objects, expected = [tiny_job(name, op_ns)], floor_manifests(name, op_ns)
                    sample = one_sample(api, kubectl, op_tracker, name, objects, expected, timeout)
                    result.operator.append(replace(sample, operator_cpu=operator.cpu_seconds() - cpu))
                else:
                    name = f"floor-{index}"
                    manifests = floor_manifests(name, floor_ns)
                    sample = one_sample(api, kubectl, floor_tracker, name, manifests, manifests, timeout)
                    result.floor.append(replace(sample, operator_cpu=operator.cpu_seconds() - cpu))
                # Let trailing status writes of the sample settle before the next.
                time.sleep(0.5)
            log(
                f"  sample {index + 1}/{samples}: operator {result.operator[-1].total:.2f} s, "
                f"floor {result.floor[-1].total:.2f} s"
            )

        def all_running() -> bool:
            return all((t := op_tracker.jobs.get(f"op-{i}")) is not None and t.running for i in range(samples))

        op_tracker.wait(all_running, "latency jobs Running", timeout)
        for index in range(samples):
            # `added` is when the watch first saw the RLJob, right after kubectl created it.
            times = op_tracker.jobs[f"op-{index}"]
            result.operator_status_running.append(cast(float, times.running) - times.added)
        result.operator_cpu_s = operator.cpu_seconds() - cpu_before
        result.operator_reconciles = operator.metrics().get("rlkube_reconcile_total", 0.0) - reconciles_before
    finally:
        operator.stop()
        op_tracker.stop()
        floor_tracker.stop()
    return result


# --- (b) scale ----------------------------------------------------------------------------------------


@dataclass
class ScaleResult:
    jobs: int
    workers: int
    created_s: float = math.nan
    reconciled_s: float = math.nan
    all_running_s: float = math.nan
    peak_rss_mb: float = math.nan
    # RSS (MB) with only the warm-up job, when all are reconciled / Running, at the end
    rss_mb: dict[str, float] = field(default_factory=dict)
    lag_burst: list[float] = field(default_factory=list)
    lag_steady: list[float] = field(default_factory=list)
    # operator CPU seconds and reconcile passes: from the first create until all Running
    burst_cpu_s: float = math.nan
    burst_reconciles: float = math.nan
    # status writes (RLJob MODIFIED events) in the same span
    burst_status_writes: int = 0
    # with every job Running and nothing happening: CPU seconds per second, reconciles per second
    idle_window_s: float = math.nan
    idle_cpu_cores: float = math.nan
    idle_reconciles_per_s: float = math.nan
    # the steady-state lag part: CPU and reconciles while the progress reports go in
    steady_cpu_s: float = math.nan
    steady_reconciles: float = math.nan
    metrics: dict[str, float] = field(default_factory=dict)
    create_errors: int = 0


def run_scale(
    api: client.ApiClient,
    kubeconfig: Path,
    jobs: int,
    workers: int,
    progress_rate: float,
    idle_window: float,
    settle: float,
    log_dir: Path,
    timeout: float,
    operator_env: dict[str, str],
) -> ScaleResult:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    namespace = f"bench-scale-{secrets.token_hex(3)}"
    create_namespace(core, namespace)
    result = ScaleResult(jobs, workers)
    operator = OperatorProcess(kubeconfig, [namespace], log_dir / "operator-scale.log", operator_env)
    tracker = Tracker(api, namespace, rljobs=True).start()

    def reconciles() -> float:
        return operator.metrics().get("rlkube_reconcile_total", math.nan)

    try:
        operator.start()
        # Warm-up job (not counted): proves the operator's watches are live.
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, tiny_job("warmup", namespace))
        tracker.wait(lambda: "warmup" in tracker.jobs and bool(tracker.jobs["warmup"].running), "warm-up job", 120)
        time.sleep(2.0)
        result.rss_mb["one job"] = operator.memory_mb()[0]
        cpu_before, reconciles_before = operator.cpu_seconds(), reconciles()
        names = [f"job-{i:04d}" for i in range(jobs)]
        bodies = [tiny_job(name, namespace) for name in names]

        def create(body: Obj) -> None:
            for attempt in range(5):
                try:
                    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
                    return
                except ApiException as error:
                    if error.status in (429, 500, 503, 504) and attempt < 4:
                        time.sleep(0.2 * (attempt + 1))
                        continue
                    raise

        log(f"creating {jobs} RLJobs with {workers} threads")
        with MemorySampler(operator) as sampler:
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                futures = [pool.submit(create, body) for body in bodies]
                for future in concurrent.futures.as_completed(futures):
                    if future.exception() is not None:
                        result.create_errors += 1
                        log(f"  create failed: {future.exception()!r}")
            result.created_s = time.monotonic() - started
            log(f"  created in {result.created_s:.1f} s")

            def reconciled() -> bool:
                return all((t := tracker.jobs.get(n)) is not None and t.reconciled for n in names)

            tracker.wait(reconciled, f"{jobs} jobs reconciled", timeout)
            result.reconciled_s = max(cast(float, tracker.jobs[n].reconciled) for n in names) - started
            result.rss_mb["all reconciled"] = operator.memory_mb()[0]
            log(f"  all reconciled after {result.reconciled_s:.1f} s")

            def running() -> bool:
                return all((t := tracker.jobs.get(n)) is not None and t.running for n in names)

            tracker.wait(running, f"{jobs} jobs Running", timeout)
            result.all_running_s = max(cast(float, tracker.jobs[n].running) for n in names) - started
            result.rss_mb["all Running"] = operator.memory_mb()[0]
            result.burst_cpu_s = operator.cpu_seconds() - cpu_before
            result.burst_reconciles = reconciles() - reconciles_before
            log(f"  all Running after {result.all_running_s:.1f} s")
            with tracker.cond:
                result.burst_status_writes = sum(tracker.jobs[n].modified for n in names)
                for name in names:
                    ready = tracker.pods_ready(name)
                    running_at = tracker.jobs[name].running
                    if ready is not None and running_at is not None:
                        result.lag_burst.append(max(0.0, running_at - ready))

            # Idle: every job Running, nothing changing. What does the operator spend? The
            # settle time lets the backlog of the burst (status writes, their echoes) drain.
            log(f"  settling {settle:g} s, then an idle window of {idle_window:g} s")
            time.sleep(settle)
            cpu0, reconciles0, t0 = operator.cpu_seconds(), reconciles(), time.monotonic()
            time.sleep(idle_window)
            result.idle_window_s = time.monotonic() - t0
            result.idle_cpu_cores = (operator.cpu_seconds() - cpu0) / result.idle_window_s
            result.idle_reconciles_per_s = (reconciles() - reconciles0) / result.idle_window_s

            # Steady state: the drivers report progress; how soon does the status show it?
            log(f"  status lag: patching the progress annotation of {jobs} controller pods at {progress_rate:g}/s")
            step = 7
            sent: dict[str, float] = {}
            now_iso = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            annotation = json.dumps({"step": step, "totalSteps": 30, "updatedAt": now_iso})
            patch = {"metadata": {"annotations": {ANNOTATION_PROGRESS: annotation}}}

            def report(name: str) -> None:
                sent[name] = time.monotonic()
                core.patch_namespaced_pod(f"{name}-controller-0", namespace, patch)

            cpu0, reconciles0 = operator.cpu_seconds(), reconciles()
            begin = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                pending = []
                for index, name in enumerate(names):
                    delay = begin + index / progress_rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    pending.append(pool.submit(report, name))
                for future in pending:
                    future.result()
            tracker.wait(lambda: all(step in tracker.jobs[n].steps for n in names), "progress in status", timeout)
            result.steady_cpu_s = operator.cpu_seconds() - cpu0
            result.steady_reconciles = reconciles() - reconciles0
            result.lag_steady = [tracker.jobs[n].steps[step] - sent[n] for n in names]
            result.rss_mb["end"], result.peak_rss_mb = operator.memory_mb()
            result.metrics = operator.metrics()
            peak_sampled = max((rss for _, rss in sampler.samples), default=math.nan)
            log(f"  RSS sampled peak {peak_sampled:.0f} MB, VmHWM {result.peak_rss_mb:.0f} MB")
    finally:
        operator.stop()
        tracker.stop()
    return result


@dataclass
class ScaleFloor:
    """The children of J jobs applied directly (no operator), J at once from a thread pool."""

    jobs: int
    workers: int
    applied_s: float = math.nan
    all_running_s: float = math.nan
    errors: int = 0


def run_scale_floor(api: client.ApiClient, jobs: int, workers: int, timeout: float) -> ScaleFloor:
    """Server-side apply of every child of `jobs` tiny jobs, one task per job applying its
    children in the operator's order (rlkube_operator.kube.Kube.apply, the operator's
    own call), `workers` tasks at a time; then until every pod is Running."""
    core = client.CoreV1Api(api)
    namespace = f"bench-scale-floor-{secrets.token_hex(3)}"
    create_namespace(core, namespace)
    result = ScaleFloor(jobs, workers)
    names = [f"job-{i:04d}" for i in range(jobs)]
    manifests = {name: floor_manifests(name, namespace) for name in names}
    kube = Kube(api)
    tracker = Tracker(api, namespace, rljobs=False).start()

    def apply_job(name: str) -> None:
        for manifest in manifests[name]:
            kube.apply(manifest)

    try:
        log(f"applying the {sum(len(m) for m in manifests.values())} children of {jobs} jobs with {workers} threads")
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for future in concurrent.futures.as_completed([pool.submit(apply_job, n) for n in names]):
                if future.exception() is not None:
                    result.errors += 1
                    log(f"  apply failed: {future.exception()!r}")
        result.applied_s = time.monotonic() - started
        log(f"  applied in {result.applied_s:.1f} s")
        tracker.wait(lambda: all(tracker.pods_running(n) is not None for n in names), "floor pods Running", timeout)
        result.all_running_s = max(cast(float, tracker.pods_running(n)) for n in names) - started
        log(f"  all pods Running after {result.all_running_s:.1f} s")
    finally:
        tracker.stop()
    return result


# --- report -------------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def fmt(values: list[float]) -> str:
    stats = summary(values)
    return f"median {stats['median']:.2f} s, p99 {stats['p99']:.2f} s"


def report(latency: LatencyResult | None, scale: ScaleResult | None, floor: ScaleFloor | None) -> dict[str, Any]:
    rows: list[tuple[str, str, str, str]] = []
    out: dict[str, Any] = {}
    if latency is not None:
        op = summary([s.total for s in latency.operator])
        fl = summary([s.total for s in latency.floor])
        ratio_median, ratio_p99 = op["median"] / fl["median"], op["p99"] / fl["p99"]
        ok = max(ratio_median, ratio_p99) <= GOAL_RATIO
        n = len(latency.operator)

        def both(part: Callable[[Sample], float]) -> str:
            mine = statistics.median(part(s) for s in latency.operator)
            floor = statistics.median(part(s) for s in latency.floor)
            return f"{mine:.2f} s / {floor:.2f} s"

        rows += [
            (f"(a) apply → all children + pods Running, operator (n={n})", fmt([s.total for s in latency.operator]), "", ""),
            (f"(a) same, floor: kubectl apply of the builders' output (n={n})", fmt([s.total for s in latency.floor]), "", ""),
            ("(a) ratio operator / floor", f"median {ratio_median:.2f}×, p99 {ratio_p99:.2f}×", f"≤ {GOAL_RATIO}×", verdict(ok)),
            ("(a) medians operator / floor: kubectl wall time", both(lambda s: s.kubectl), "", ""),
            ("(a)   apply → first StatefulSet seen", both(lambda s: s.first_set), "", ""),
            ("(a)   first → last StatefulSet seen", both(lambda s: s.last_set - s.first_set), "", ""),
            ("(a)   apply → first pod seen", both(lambda s: s.first_pod), "", ""),
            ("(a)   first pod → all Running", both(lambda s: s.total - s.first_pod), "", ""),
            ("(a) apply → status.state Running, operator", fmt(latency.operator_status_running), "", ""),
            ("(a)   operator CPU used during the sample", both(lambda s: s.operator_cpu), "", ""),
            ("(a) operator CPU, reconcile passes: whole phase", f"{latency.operator_cpu_s:.1f} s, {latency.operator_reconciles:.0f}", "", ""),
        ]  # fmt: skip
        out["latency"] = {
            "operator": [vars(s) for s in latency.operator],
            "floor": [vars(s) for s in latency.floor],
            "operator_status_running": latency.operator_status_running,
            "ratio_median": ratio_median,
            "ratio_p99": ratio_p99,
            "operator_cpu_s": latency.operator_cpu_s,
            "operator_reconciles": latency.operator_reconciles,
        }
    if scale is not None:
        burst, steady = summary(scale.lag_burst), summary(scale.lag_steady)
        duration_sum = scale.metrics.get("rlkube_reconcile_duration_seconds_sum", math.nan)
        duration_count = scale.metrics.get("rlkube_reconcile_duration_seconds_count", math.nan)
        rss = ", ".join(f"{k} {v:.0f}" for k, v in scale.rss_mb.items())
        rows += [
            (f"(b) {scale.jobs} RLJobs created ({scale.workers} client threads)", f"{scale.created_s:.1f} s ({scale.create_errors} errors)", "", ""),
            ("(b) first create → all reconciled (observedGeneration)", f"{scale.reconciled_s:.1f} s", f"< {GOAL_RECONCILED_S:g} s", verdict(scale.reconciled_s < GOAL_RECONCILED_S)),
            ("(b) first create → all status.state Running", f"{scale.all_running_s:.1f} s", "", ""),
            ("(b) operator peak RSS (VmHWM)", f"{scale.peak_rss_mb:.0f} MB", f"< {GOAL_RSS_MB:g} MB", verdict(scale.peak_rss_mb < GOAL_RSS_MB)),
            ("(b)   RSS at milestones (MB)", rss, "", ""),
            ("(b) status lag, burst: last pod Ready → state Running", f"{fmt(scale.lag_burst)}, max {burst['max']:.2f} s", f"p99 < {GOAL_LAG_S:g} s", verdict(burst["p99"] < GOAL_LAG_S)),
            ("(b) status lag, steady: progress annotation → status", f"{fmt(scale.lag_steady)}, max {steady['max']:.2f} s", f"p99 < {GOAL_LAG_S:g} s", verdict(steady["p99"] < GOAL_LAG_S)),
            ("(b) burst: operator CPU, reconciles, status writes", f"{scale.burst_cpu_s:.0f} s, {scale.burst_reconciles:.0f}, {scale.burst_status_writes}", "", ""),
            ("(b) mean reconcile duration (queue + work, metric)", f"{duration_sum / duration_count:.2f} s", "", ""),
            ("(b) idle: operator CPU, reconciles", f"{scale.idle_cpu_cores:.2f} cores, {scale.idle_reconciles_per_s:.1f}/s", "", ""),
            ("(b) steady: operator CPU, reconciles", f"{scale.steady_cpu_s:.0f} s, {scale.steady_reconciles:.0f}", "", ""),
        ]  # fmt: skip
        out["scale"] = {k: v for k, v in vars(scale).items() if k not in ("lag_burst", "lag_steady", "metrics")}
        out["scale"]["lag_burst"] = burst
        out["scale"]["lag_steady"] = steady
        out["scale"]["metrics"] = {
            k: v for k, v in scale.metrics.items() if k.startswith("rlkube_") and not k.endswith("_created")
        }
    if floor is not None:
        rows += [
            (f"(b) floor: children of {floor.jobs} jobs applied directly ({floor.workers} threads)", f"{floor.applied_s:.1f} s ({floor.errors} errors)", "", ""),
            ("(b) floor: first apply → all pods Running", f"{floor.all_running_s:.1f} s", "", ""),
        ]  # fmt: skip
        out["scale_floor"] = vars(floor)
    if not rows:
        return out
    header = ("measure", "value", "goal", "")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return out


# --- main ---------------------------------------------------------------------------------------------


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def cluster_for(kubeconfig: Path | None, pools: Path, keep_state: bool) -> Iterator[Path]:
    if kubeconfig is not None:
        yield kubeconfig
        return
    state_dir = Path(tempfile.mkdtemp(prefix="rlkube-opbench-cluster-"))
    cluster = LocalCluster(state_dir, pools, die_with_parent=True, log=log)
    try:
        started = time.monotonic()
        cluster.up(timeout=180)
        log(f"cluster ready in {time.monotonic() - started:.1f} s ({cluster.server})")
        yield cluster.kubeconfig
    finally:
        log("stopping the cluster")
        cluster.down(keep=keep_state)
        if not keep_state:
            shutil.rmtree(state_dir, ignore_errors=True)


def api_client(kubeconfig: Path, pool_size: int) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-samples", type=int, default=20, help="(a) jobs applied one at a time (0: skip)")
    parser.add_argument("--jobs", type=int, default=500, help="(b) RLJobs created at once (0: skip)")
    parser.add_argument("--workers", type=int, default=16, help="(b) threads creating the RLJobs")
    parser.add_argument("--progress-rate", type=float, default=50.0, help="(b) progress reports per second")
    parser.add_argument(
        "--scale-operator",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="(b) the operator's run (--no-scale-operator: only the floor)",
    )
    parser.add_argument(
        "--scale-floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="(b) after the operator's run, apply the same children directly, for comparison",
    )
    parser.add_argument("--settle", type=float, default=30.0, help="(b) seconds after all Running before idle")
    parser.add_argument("--idle-window", type=float, default=35.0, help="(b) seconds of idle CPU measurement")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for any one thing")
    parser.add_argument("--pools", type=Path, default=POOLS, help="node pools of the bench cluster")
    parser.add_argument("--kubeconfig", type=Path, help="use this running cluster instead of starting one")
    parser.add_argument("--keep-state", action="store_true", help="keep the cluster's state dir (logs, etcd)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--operator-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment of the operator process, for experiments (repeatable)",
    )
    args = parser.parse_args(argv)
    operator_env = dict(item.split("=", 1) for item in args.operator_env)
    signal.signal(signal.SIGTERM, _raise_interrupt)

    log_dir = Path(tempfile.mkdtemp(prefix="rlkube-opbench-logs-"))
    log(f"operator logs in {log_dir}")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO, check=False
    ).stdout.strip()
    latency: LatencyResult | None = None
    scale: ScaleResult | None = None
    floor: ScaleFloor | None = None
    loads: list[float] = []
    stop_load = threading.Event()

    def sample_load() -> None:
        while not stop_load.wait(5.0):
            loads.append(os.getloadavg()[0])

    threading.Thread(target=sample_load, name="load-sampler", daemon=True).start()
    with cluster_for(args.kubeconfig, args.pools, args.keep_state) as kubeconfig:
        api = api_client(kubeconfig, max(args.workers, 8) + 4)
        kubectl = Kubectl(kubeconfig)
        try:
            kubectl("apply", "--server-side", "-f", str(CRD_FILES[0]))
            established = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'

            def crd_established() -> bool:
                # check=False: the jsonpath errors out while the new CRD has no conditions yet.
                found = kubectl("get", "crd", "rljobs.rlkube.dev", "-o", established, check=False)
                return found.stdout.strip() == "True"

            wait_for(crd_established, "the RLJob CRD to be Established", timeout=60)
            if args.latency_samples > 0:
                log(f"(a) latency: {args.latency_samples} samples each, operator and floor")
                latency = run_latency(
                    api, kubectl, kubeconfig, args.latency_samples, log_dir, args.timeout, operator_env
                )
            if args.jobs > 0 and args.scale_operator:
                log(f"(b) scale: {args.jobs} RLJobs at once")
                scale = run_scale(
                    api,
                    kubeconfig,
                    args.jobs,
                    args.workers,
                    args.progress_rate,
                    args.idle_window,
                    args.settle,
                    log_dir,
                    args.timeout,
                    operator_env,
                )
            if args.jobs > 0 and args.scale_floor:
                log(f"(b) floor: the children of {args.jobs} jobs applied directly, no operator")
                floor = run_scale_floor(api, args.jobs, args.workers, args.timeout)
        finally:
            core = client.CoreV1Api(api)
            for listed in core.list_namespace(label_selector=f"{BENCH_LABEL}={BENCH}").items:
                if listed.metadata is not None and listed.metadata.name:
                    with contextlib.suppress(ApiException):
                        core.delete_namespace(listed.metadata.name)
            api.close()  # type: ignore[no-untyped-call]
    stop_load.set()
    results = report(latency, scale, floor)
    results["commit"] = commit
    results["argv"] = sys.argv
    results["operator_env"] = operator_env
    results["bench_cpu_s"] = time.process_time()
    results["load_average_1m"] = {"mean": statistics.fmean(loads) if loads else math.nan, "max": max(loads, default=0)}
    print(
        f"\ncommit {commit}; {os.cpu_count()} CPUs; 1-min load average during the run: mean "
        f"{results['load_average_1m']['mean']:.1f}, max {results['load_average_1m']['max']:.1f}; "
        f"this process's own CPU {results['bench_cpu_s']:.0f} s"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
