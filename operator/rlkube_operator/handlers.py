"""kopf wiring: indexes of the pods and StatefulSets each job owns, one loop per
RLJob that reconciles when something changes (or a deadline comes due), and
start-up settings. The decisions live in reconcile/status; nothing here decides."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes import client, config

from rlkube_api.names import ANNOTATION_ATTEMPT, LABEL_JOB
from rlkube_api.rljob import GROUP, PLURAL, VERSION
from rlkube_operator.kube import Kube
from rlkube_operator.metrics import METRICS
from rlkube_operator.observed import as_lost, slim_pod, view_pod
from rlkube_operator.reconcile import Reconciler, ReconcileResult

JobKey = tuple[str, str]
# With nothing happening, a job is still looked at about this often, to repair drift of
# children nobody watches (Services, ConfigMap). Everything else wakes the loop: the
# watches (the job, its pods and StatefulSets) and the status function's requeue_after
# (deadlines, timeouts). Spread by +-10% so that jobs created together do not pass together.
IDLE_SECONDS = 300.0
IDLE_JITTER = 0.1
RECONCILE_THREADS = 16
# A first pass is a dozen API round trips; at 500 new jobs their latency, not CPU, sets the pace
# (8 threads here took twice as long as 16 to reconcile them all, docs/benchmarks.md run 9).
NEW_SPEC_THREADS = 16


def _api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    configuration = client.Configuration.get_default_copy()
    # One pooled connection per reconcile thread (the default, CPUs x 5, is 10 on 2 cores).
    configuration.connection_pool_maxsize = RECONCILE_THREADS + NEW_SPEC_THREADS
    return client.ApiClient(configuration)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf logs every handled watch event at INFO; the operator's own log says what matters.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # kopf's own bookkeeping goes to annotations: the status belongs to the status function.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.rlkube.dev")
    # No change handlers, so no diff base: kopf would otherwise deep-copy every pod and
    # StatefulSet body on every event to build one (a fifth of its event-loop time at scale).
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Watches can go silent behind load balancers; reconnect if nothing arrives.
    settings.watching.inactivity_timeout = 600
    settings.execution.max_workers = 16
    # Reconcile passes run in the loop's default executor (run_in_executor(None)): min(32, CPUs + 4)
    # threads, 6 on 2 cores. A first pass is a dozen API round trips, mostly waiting, so a
    # burst of new jobs queues behind them; more threads keep the API server busy instead.
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(RECONCILE_THREADS, thread_name_prefix="reconcile")
    )
    # Passes over a spec generation not reconciled yet (new jobs, edited specs) get threads of
    # their own, so that a burst of new jobs does not wait behind the passes of running ones.
    memo.new_spec_executor = concurrent.futures.ThreadPoolExecutor(NEW_SPEC_THREADS, thread_name_prefix="new-spec")
    memo.reconciler = Reconciler(Kube(_api_client()))
    memo.wakeups = {}
    memo.failed_pods = {}
    memo.latest = {}
    memo.states = {}
    memo.bodies = {}
    memo.tasks = {}


def _wake(memo: kopf.Memo, key: JobKey) -> None:
    event = memo.wakeups.get(key)
    if event is not None:
        event.set()


class NoDiffBase(kopf.DiffBaseStorage):
    """A diff base for an operator without change handlers: nothing built, stored or read."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.index("pods", labels={LABEL_JOB: kopf.PRESENT})
def pods_by_job(namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict[JobKey, Any]:
    return {(namespace or "", labels[LABEL_JOB]): slim_pod(dict(body))}


@kopf.index("statefulsets", labels={LABEL_JOB: kopf.PRESENT})
def sets_by_job(namespace: str | None, labels: Mapping[str, str], name: str, **_: Any) -> dict[JobKey, str]:
    return {(namespace or "", labels[LABEL_JOB]): name}


@kopf.on.event("statefulsets", labels={LABEL_JOB: kopf.PRESENT})
def statefulset_changed(
    type: str | None, namespace: str | None, labels: Mapping[str, str], memo: Any, **_: Any
) -> None:
    # Only a deletion needs a pass (to recreate it); its status changes follow the pods' own events.
    if type == "DELETED":
        _wake(memo, (namespace or "", labels[LABEL_JOB]))


@kopf.on.event("pods", labels={LABEL_JOB: kopf.PRESENT})
def pod_changed(
    type: str | None, namespace: str | None, labels: Mapping[str, str], body: kopf.Body, memo: Any, **_: Any
) -> None:
    key = (namespace or "", labels[LABEL_JOB])
    pod = dict(body)
    # A failed or deleted pod may be replaced by its StatefulSet before the loop looks;
    # remember it so the failure is not missed.
    if view_pod(pod).failed:
        memo.failed_pods.setdefault(key, {}).setdefault(pod["metadata"]["uid"], slim_pod(pod))
    elif (type == "DELETED" or pod["metadata"].get("deletionTimestamp")) and _gang_lost(memo, key, pod):
        lost = as_lost(slim_pod(pod), "the pod was deleted while the job ran")
        memo.failed_pods.setdefault(key, {}).setdefault(pod["metadata"]["uid"], lost)
    _wake(memo, key)


def _gang_lost(memo: Any, key: JobKey, pod: dict[str, Any]) -> bool:
    """A pod of the current attempt deleted while the job wants pods: the operator never
    deletes those (it deletes older attempts, or scales to zero when suspended or done)."""
    job = memo.latest.get(key) or memo.bodies.get(key)
    if job is None:
        return False
    status = job.get("status") or {}
    if job.get("spec", {}).get("suspend") or status.get("state") in ("Succeeded", "Failed", "Suspended", None):
        return False
    attempt = int((pod["metadata"].get("annotations") or {}).get(ANNOTATION_ATTEMPT, "0"))
    return attempt == int(status.get("restartCount", 0))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_changed(
    type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: Any, **indices: Any
) -> None:
    """Keeps one reconcile loop per RLJob. A loop of our own rather than a kopf daemon:
    daemons put a finalizer on the job, which would leave RLJobs undeletable whenever
    the operator is not running; the children need no cleanup beyond their ownerReferences."""
    key = (namespace or "", name)
    if type == "DELETED":
        task = memo.tasks.pop(key, None)
        if task is not None:
            task.cancel()
        memo.reconciler.forget(body.get("metadata", {}).get("uid", ""))
        return
    live = _without_managed_fields(body)
    memo.bodies[key] = live
    written = memo.latest.get(key)
    if written is not None and _version(live) >= _version(written):
        # The watch caught up with the loop's own status patch: one copy is enough.
        memo.latest.pop(key, None)
        if _version(live) == _version(written):
            return  # the echo of that patch: nothing new to look at
    task = memo.tasks.get(key)
    if task is None or task.done():
        memo.tasks[key] = asyncio.create_task(_job_loop(key, memo, indices["pods_by_job"], indices["sets_by_job"]))
    else:
        _wake(memo, key)


def _version(body: Mapping[str, Any]) -> int:
    try:
        return int(body["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return -1


def _without_managed_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The RLJob without metadata.managedFields (about half of a stored body; never read)."""
    job = dict(body)
    job["metadata"] = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    return job


@kopf.on.cleanup()
async def stop_loops(memo: Any, **_: Any) -> None:
    for task in memo.tasks.values():
        task.cancel()
    await asyncio.gather(*memo.tasks.values(), return_exceptions=True)
    memo.new_spec_executor.shutdown(wait=True)


def _newest(live: Mapping[str, Any], written: Mapping[str, Any] | None) -> dict[str, Any]:
    """The live body, unless our own last status patch is newer than what the watch delivered."""
    if written is not None and _version(written) > _version(live):
        return dict(written)
    return dict(live)


async def _job_loop(
    key: JobKey, memo: Any, pods_by_job: kopf.Index[JobKey, Any], sets_by_job: kopf.Index[JobKey, str]
) -> None:
    namespace, name = key
    wakeup = memo.wakeups.setdefault(key, asyncio.Event())
    reconciler: Reconciler = memo.reconciler
    try:
        while True:
            wakeup.clear()
            current = _newest(memo.bodies[key], memo.latest.get(key))
            pods = list(pods_by_job.get(key, []))
            seen = {p["metadata"]["uid"] for p in pods}
            failed = memo.failed_pods.pop(key, {})
            pods += [p for uid, p in failed.items() if uid not in seen]
            with METRICS.reconcile_duration.time():
                METRICS.reconciles.labels(namespace=namespace).inc()
                new_spec = (current.get("status") or {}).get("observedGeneration") != current["metadata"].get(
                    "generation"
                )
                executor = memo.new_spec_executor if new_spec else None
                try:
                    result: ReconcileResult = await asyncio.get_running_loop().run_in_executor(
                        executor, reconciler.reconcile, current, pods, set(sets_by_job.get(key, []))
                    )
                except Exception:
                    METRICS.reconcile_errors.labels(namespace=namespace).inc()
                    logging.getLogger(__name__).exception("reconcile of %s/%s failed", namespace, name)
                    await asyncio.sleep(5)
                    continue
            # Kept until the watch delivers it (or something newer), unless it already has.
            if result.written is not None and _version(result.written) > _version(memo.bodies[key]):
                memo.latest[key] = _without_managed_fields(result.written)
            for event in result.events:
                kopf.event(
                    kopf.Body(cast(kopf.RawBody, current)), type=event.type, reason=event.reason, message=event.message
                )
            if result.state:
                memo.states[key] = result.state
                METRICS.set_job_states(list(memo.states.values()))
            idle = IDLE_SECONDS * random.uniform(1 - IDLE_JITTER, 1 + IDLE_JITTER)
            timeout = min(result.requeue_after or idle, idle)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), timeout=max(timeout, 0.2))
    finally:
        memo.wakeups.pop(key, None)
        memo.latest.pop(key, None)
        memo.bodies.pop(key, None)
        memo.states.pop(key, None)
        METRICS.set_job_states(list(memo.states.values()))
