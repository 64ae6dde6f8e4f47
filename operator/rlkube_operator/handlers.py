"""kopf wiring: indexes of the pods and StatefulSets each job owns, one loop per
RLJob that reconciles when something changes (or a deadline comes due), and
start-up settings. The decisions live in status; reconcile carries them out;
nothing here decides."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from rlkube_api.event_message import fit_event_message
from rlkube_api.names import LABEL_JOB
from rlkube_api.rljob import GROUP, PLURAL, VERSION
from rlkube_api.runtime import CLUSTER_KIND, CLUSTER_PLURAL
from rlkube_api.runtime import PLURAL as RUNTIME_PLURAL
from rlkube_operator.job_state import JobKey, Manifest, TrackedJob
from rlkube_operator.kube import Kube, connect
from rlkube_operator.leader import Election
from rlkube_operator.metrics import METRICS
from rlkube_operator.node_loss import loss_message
from rlkube_operator.observed import PodView, as_lost, pods_to_judge, slim_pod, view_pod
from rlkube_operator.reconcile import Reconciler, ReconcileResult
from rlkube_operator.rollout_scaling import scaled_away_in_spec
from rlkube_operator.runtimes import runtime_ref
from rlkube_operator.status import pod_loss_breaks_gang

log = logging.getLogger(__name__)

# With nothing happening, a job is still looked at about this often, to repair drift of
# children nobody watches (Services, ConfigMap). Everything else wakes the loop: the
# watches (the job, its pods and StatefulSets) and the plan's requeue_after (deadlines,
# timeouts). Spread by +-10% so that jobs created together do not pass together.
IDLE_SECONDS = 300.0
IDLE_JITTER = 0.1
# The shortest wait between two passes over one job.
MIN_WAIT_SECONDS = 0.2
RECONCILE_THREADS = 16
# A first pass is a dozen API round trips; at 500 new jobs their latency, not CPU, sets the pace
# (in bench/operator_scale.py on 2 cores, 8 threads took twice as long as 16 to reconcile them
# all; 32 reconciled them in under a minute, docs/benchmarks.md).
NEW_SPEC_THREADS = 32


@dataclass
class OperatorState:
    """Everything the handlers share, kept in kopf's memo as `memo.rlkube`."""

    reconciler: Reconciler
    # Passes over a spec generation not reconciled yet (new jobs, edited specs) get threads
    # of their own, so that a burst of new jobs does not wait behind the passes of running ones.
    new_spec_executor: concurrent.futures.ThreadPoolExecutor
    jobs: dict[JobKey, TrackedJob] = field(default_factory=dict)
    # Set while this replica may reconcile: from the start, or, with leader election, once
    # it holds the Lease. Until then the watches and indexes run, warm for a take-over.
    leading: asyncio.Event = field(default_factory=asyncio.Event)

    def job(self, key: JobKey) -> TrackedJob:
        tracked = self.jobs.get(key)
        if tracked is None:
            tracked = self.jobs[key] = TrackedJob(*key)
        return tracked

    def publish_states(self) -> None:
        METRICS.set_job_states([j.state for j in self.jobs.values() if j.state is not None])


def _state(memo: Any) -> OperatorState:
    return cast(OperatorState, memo.rlkube)


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
    operator = memo.rlkube = OperatorState(
        Reconciler(Kube(connect(pool_size=RECONCILE_THREADS + NEW_SPEC_THREADS))),
        concurrent.futures.ThreadPoolExecutor(NEW_SPEC_THREADS, thread_name_prefix="new-spec"),
    )
    election: Election | None = memo.get("election")
    if election is None:
        operator.leading.set()
    else:
        loop = asyncio.get_running_loop()
        election.start(on_leading=lambda: loop.call_soon_threadsafe(operator.leading.set))


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
    tracked = _state(memo).jobs.get((namespace or "", labels[LABEL_JOB]))
    if type == "DELETED" and tracked is not None:
        tracked.wake()


@kopf.on.event("pods", labels={LABEL_JOB: kopf.PRESENT})
def pod_changed(
    type: str | None, namespace: str | None, labels: Mapping[str, str], body: kopf.Body, memo: Any, **_: Any
) -> None:
    operator, key, pod = _state(memo), (namespace or "", labels[LABEL_JOB]), dict(body)
    view = view_pod(pod)
    if view.failed:
        # Kept even before the job's own first event (watches start in any order).
        operator.job(key).lost_pods.setdefault(view.uid, slim_pod(pod))
    tracked = operator.jobs.get(key)
    if tracked is not None:
        if type == "DELETED" or view.deleting:
            _keep_if_lost(tracked, view, pod)
        tracked.wake()


def _keep_if_lost(tracked: TrackedJob, view: PodView, pod: Manifest) -> None:
    """A deleted pod may be replaced by its StatefulSet before the loop looks: remember it,
    when its loss breaks the gang, so the failure is not missed."""
    if view.failed:
        return  # kept already
    job = tracked.newest()
    status = job.get("status") or {}
    suspended = bool((job.get("spec") or {}).get("suspend"))
    if scaled_away_in_spec(job.get("spec") or {}, view.role, view.index):
        return  # the rollout scaled down: its StatefulSet removes its highest pods on purpose
    if pod_loss_breaks_gang(status.get("state"), int(status.get("restartCount", 0)), suspended, view.attempt):
        tracked.lost_pods.setdefault(view.uid, as_lost(slim_pod(pod), loss_message(view)))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_changed(
    type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: Any, **ix: Any
) -> None:
    """Keeps one reconcile loop per RLJob. A loop of our own rather than a kopf daemon:
    daemons put a finalizer on the job, which would leave RLJobs undeletable whenever
    the operator is not running; the children need no cleanup beyond their ownerReferences."""
    operator = _state(memo)
    key = (namespace or "", name)
    if type == "DELETED":
        gone = operator.jobs.pop(key, None)
        if gone is not None and gone.task is not None:
            gone.task.cancel()
        if gone is not None:
            METRICS.set_job(gone.namespace, gone.name, None, 0, was=gone.state)
        operator.publish_states()
        return
    tracked = operator.job(key)
    if not tracked.delivered(_without_managed_fields(body)):
        return  # the echo of our own status patch
    if tracked.task is None or tracked.task.done():
        tracked.task = asyncio.create_task(_job_loop(operator, tracked, ix["pods_by_job"], ix["sets_by_job"]))
    else:
        tracked.wake()


def _without_managed_fields(body: Mapping[str, Any]) -> Manifest:
    """The RLJob without metadata.managedFields (about half of a stored body; never read)."""
    job = dict(body)
    job["metadata"] = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    return job


@kopf.on.event(GROUP, VERSION, RUNTIME_PLURAL)
@kopf.on.event(GROUP, VERSION, CLUSTER_PLURAL)
def runtime_changed(body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    """A job held for this runtime (or not yet resolved against it) is looked at again now."""
    kind = body.get("kind")
    for tracked in _state(memo).jobs.values():
        ref = runtime_ref(tracked.body)
        if ref == (kind, name) and (kind == CLUSTER_KIND or tracked.namespace == namespace):
            tracked.wake()


@kopf.on.cleanup()
async def stop_loops(memo: Any, **_: Any) -> None:
    operator = _state(memo)
    tasks = [j.task for j in operator.jobs.values() if j.task is not None]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    operator.new_spec_executor.shutdown(wait=True)


async def _job_loop(
    operator: OperatorState,
    tracked: TrackedJob,
    pods_by_job: kopf.Index[JobKey, Any],
    sets_by_job: kopf.Index[JobKey, str],
) -> None:
    await operator.leading.wait()
    while operator.jobs.get(tracked.key) is tracked:
        tracked.wakeup.clear()
        result = await _pass(operator, tracked, pods_by_job, sets_by_job)
        if result is None:
            await asyncio.sleep(5)  # the pass raised; logged and counted
            continue
        if result.gone:
            if operator.jobs.get(tracked.key) is tracked:
                del operator.jobs[tracked.key]
                METRICS.set_job(tracked.namespace, tracked.name, None, 0, was=tracked.state)
                operator.publish_states()
            return
        if result.written is not None:
            tracked.remember_written(result.written)
        for event in result.events:
            kopf.event(
                kopf.Body(cast(kopf.RawBody, tracked.body)),
                type=event.type,
                reason=event.reason,
                # A longer message is refused and the Event lost (a pod's log tail is long).
                message=fit_event_message(event.message),
            )
        if result.state:
            was, tracked.state = tracked.state, result.state
            latest = result.written or tracked.body
            restarts = int((latest.get("status") or {}).get("restartCount") or 0)
            METRICS.set_job(tracked.namespace, tracked.name, tracked.state, restarts, was=was)
            operator.publish_states()
        idle = IDLE_SECONDS * random.uniform(1 - IDLE_JITTER, 1 + IDLE_JITTER)
        timeout = idle if result.requeue_after is None else min(result.requeue_after, idle)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tracked.wakeup.wait(), timeout=max(timeout, MIN_WAIT_SECONDS))


async def _pass(
    operator: OperatorState,
    tracked: TrackedJob,
    pods_by_job: kopf.Index[JobKey, Any],
    sets_by_job: kopf.Index[JobKey, str],
) -> ReconcileResult | None:
    """One reconcile pass in a worker thread, over the job's newest body and pods."""
    namespace, name = tracked.key
    body = tracked.newest()
    lost = tracked.take_lost_pods()
    pods = pods_to_judge(list(pods_by_job.get(tracked.key, [])), lost)
    sets = set(sets_by_job.get(tracked.key, []))
    new_spec = (body.get("status") or {}).get("observedGeneration") != body["metadata"].get("generation")
    executor = operator.new_spec_executor if new_spec else None
    with METRICS.reconcile_duration.time():
        METRICS.reconciles.labels(namespace=namespace).inc()
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                executor, operator.reconciler.reconcile, tracked, body, pods, sets
            )
        except Exception:
            METRICS.reconcile_errors.labels(namespace=namespace).inc()
            log.exception("reconcile of %s/%s failed", namespace, name)
            result = None
    if result is None or result.replan:
        for uid, pod in lost.items():  # still to be seen by a pass that completes
            tracked.lost_pods.setdefault(uid, pod)
    return result
