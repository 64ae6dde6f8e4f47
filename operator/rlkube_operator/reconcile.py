"""One reconcile pass, in the one direction the design asks for:

spec → validated model → observed pods (and, before pods are created, whether the objects
they name exist) → pure status function → plan → the plan's actions carried out in order
(apply children, delete old pods, scale down, delete children, write status). Nothing here
decides; status.compute_status does.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException

from rlkube_api.conditions import is_terminal
from rlkube_api.rljob import RLJob, RLJobStatus
from rlkube_api.validation import InvalidSpec, parse_rljob
from rlkube_operator.desired import desired_children
from rlkube_operator.fit import fit_refusals
from rlkube_operator.job_state import Manifest, TrackedJob, digest
from rlkube_operator.kube import Cluster
from rlkube_operator.metrics import METRICS
from rlkube_operator.observed import PodView, departed_pod, parse_time, view_pod
from rlkube_operator.plan import (
    ApplyChildren,
    CountRestart,
    DeleteChildren,
    DeletePods,
    Event,
    ObserveTimeToRunning,
    ScaleToZero,
    WriteStatus,
)
from rlkube_operator.rollout_scaling import new_engine
from rlkube_operator.runtimes import Held, held_status, resolve_checked, runtime_ref
from rlkube_operator.status import Observed, compute_status
from rlkube_operator.status.before_pods import pods_to_come, references_to_check
from rlkube_operator.status.starting import CREATE_FAILURE_RECHECK_SECONDS, pods_to_explain, stateful_sets_to_explain

log = logging.getLogger(__name__)


def status_patch(status: RLJobStatus) -> dict[str, Any]:
    """A merge patch from which the stored status comes out as `status`: present fields set,
    and every field now unset removed (null), in nested objects too (an ended job's progress
    drops the driver's last time remaining). Lists are replaced whole by a merge patch, so their
    items carry no nulls, only what they hold. (A role the spec drops would keep its key in
    `roles`: the patch names only the keys the status has.)"""
    patch: dict[str, Any] = _removing_unset(status.model_dump(by_alias=True, mode="json"))
    return patch


def _removing_unset(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _removing_unset(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_unset(item) for item in value]
    return value


def _without_unset(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_unset(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_unset(item) for item in value]
    return value


@dataclass
class ReconcileResult:
    events: list[Event] = field(default_factory=list)
    # The RLJob as returned by our status patch, newer than the watch may have delivered yet.
    written: dict[str, Any] | None = None
    state: str | None = None
    requeue_after: float | None = None
    # The pass stopped after applying, its plan out of date: nothing it saw has been used up.
    replan: bool = False
    # The RLJob is gone (its status patch found nothing): the job's loop ends.
    gone: bool = False


# After an apply whose refusals differ from what the plan assumed, the pass stops before
# writing and the next one comes this soon, to report them.
REPLAN_SECONDS = 0.0
# A short StatefulSet's FailedCreate Events are read at most this often (the pods of its job's
# other roles may wake the job many times a second); a little under the status function's
# recheck, so that the pass its requeue brings always reads them afresh.
CREATE_FAILURE_READ_SECONDS = CREATE_FAILURE_RECHECK_SECONDS - 1.0
# A job held for its runtime is looked at again this often, besides the runtimes' watch.
RUNTIME_RECHECK_SECONDS = 30.0


class Reconciler:
    def __init__(self, kube: Cluster) -> None:
        self.kube = kube

    def reconcile(
        self,
        tracked: TrackedJob,
        body: Manifest,
        pods: list[Manifest],
        present_sets: set[str],
        now: datetime | None = None,
    ) -> ReconcileResult:
        now = now or datetime.now(UTC)
        meta = body["metadata"]
        if runtime_ref(body) is not None:
            resolved = resolve_checked(body, self.kube.read_runtime, tracked.runtime_checked)
            if isinstance(resolved, Held):
                return self.hold(body, resolved, now)
            job, tracked.runtime_checked = resolved
        else:
            try:
                job = parse_rljob(body, f"RLJob {meta['namespace']}/{meta['name']}", admitted=True)
            except InvalidSpec as exc:
                # The CRD refuses invalid specs; this only happens with an older CRD installed.
                return ReconcileResult([Event("Warning", "InvalidSpec", str(exc))])
        tracked.adopt(meta["uid"])
        views = [view_pod(p) for p in pods]
        stuck = pods_to_explain(job, views, now)
        short = set(stateful_sets_to_explain(job, views, now))
        observed = Observed(
            pods=views,
            now=now,
            apply_errors=dict(tracked.apply_errors),
            invalid_children=(
                dict(tracked.invalid_children) if tracked.invalid_generation == job.metadata.generation else {}
            ),
            since_last_write=time.monotonic() - tracked.last_write,
            job_created=parse_time(meta.get("creationTimestamp")),
            pod_warnings={
                pod.name: warning for pod in stuck if (warning := self.kube.pod_warning(meta["namespace"], pod.uid))
            },
            create_failures=self.create_failures(tracked, meta["namespace"], short & present_sets, now),
            departed=self.departed_pods(meta["namespace"], job, views),
            missing_references=tuple(
                ref
                for ref in references_to_check(job, views, present_sets)
                if not self.kube.exists(meta["namespace"], ref.kind, ref.name)
            ),
            fit_refusals=fit_refusals(job, self.kube.node_labels) if pods_to_come(job, views, present_sets) else (),
        )
        plan = compute_status(job, observed)
        namespace, name = meta["namespace"], meta["name"]
        written = None
        for action in plan.actions:
            match action:
                case ApplyChildren(attempt=attempt, pods_wanted=pods_wanted):
                    tracked.apply_errors = self.apply_children(tracked, job, attempt, pods_wanted, present_sets)
                    if set(tracked.apply_errors) != set(observed.apply_errors):
                        # The plan's Created condition is out of date: stop before writing it;
                        # the next pass, at once, reports what was refused (or that all went in).
                        return ReconcileResult(requeue_after=REPLAN_SECONDS, replan=True)
                case DeletePods(pods=stale, grace_period_seconds=grace):
                    self.kube.delete_pods(namespace, stale, grace)
                case ScaleToZero(stateful_sets=sets):
                    self.kube.scale_to_zero(namespace, sets)
                case DeleteChildren():
                    self.kube.delete_children(namespace, name)
                case WriteStatus(status=status):
                    try:
                        written = self.kube.patch_status(namespace, name, status_patch(status))
                    except ApiException as exc:
                        if exc.status != 404:
                            raise
                        # Deleted while this pass ran (or its DELETED event was missed).
                        log.info("RLJob %s/%s is gone; its loop ends", namespace, name)
                        return ReconcileResult(gone=True)
                    tracked.last_write = time.monotonic()
                case CountRestart():
                    METRICS.restarts.labels(namespace=namespace).inc()
                case ObserveTimeToRunning(seconds=seconds):
                    METRICS.time_to_running.observe(seconds)
        if is_terminal(plan.status.state):
            tracked.forget_children()  # none are applied again, and every later write is a transition
        return ReconcileResult(plan.events, written, plan.status.state, plan.requeue_after)

    def hold(self, body: Manifest, held: Held, now: datetime) -> ReconcileResult:
        """A job its runtime cannot resolve now: its status says why; nothing else is touched.
        The runtimes' watch wakes it when one changes; the recheck covers a missed event."""
        status, events = held_status(body, held, now)
        meta = body["metadata"]
        if status.model_dump() == RLJobStatus.model_validate(body.get("status") or {}).model_dump():
            return ReconcileResult(events, state=status.state, requeue_after=RUNTIME_RECHECK_SECONDS)
        try:
            written = self.kube.patch_status(meta["namespace"], meta["name"], status_patch(status))
        except ApiException as exc:
            if exc.status != 404:
                raise
            return ReconcileResult(gone=True)
        return ReconcileResult(events, written, status.state, RUNTIME_RECHECK_SECONDS)

    def create_failures(
        self, tracked: TrackedJob, namespace: str, short: set[str], now: datetime
    ) -> dict[str, tuple[datetime, str]]:
        """The latest FailedCreate Event of each StatefulSet short of pods, read at most once
        every CREATE_FAILURE_READ_SECONDS; in between, the last read stands."""
        read = {}
        for name in sorted(short):
            last = tracked.create_failures_read.get(name)
            if last is None or not timedelta(0) <= now - last[0] < timedelta(seconds=CREATE_FAILURE_READ_SECONDS):
                last = (now, self.kube.create_failure(namespace, name))
            read[name] = last
        tracked.create_failures_read = read  # a StatefulSet no longer short is read afresh next time
        return {name: failure for name, (_, failure) in read.items() if failure is not None}

    def departed_pods(self, namespace: str, job: RLJob, views: list[PodView]) -> dict[str, PodView]:
        """The running gang's members that are gone, replaced unseen (the operator was down):
        what their Events tell of how they ended, by pod name. Asks only while a member is
        missing and a pod stands in its place, so almost never."""
        if job.status is None:
            return {}
        gang = set(job.status.gang_pod_uids or [])
        # A scale-up's new rollout engine replaced no one.
        replacements = {v.name: v for v in views if v.uid and v.uid not in gang and not new_engine(job, job.status, v)}
        if not gang or not replacements:
            return {}
        missing = gang - {v.uid for v in views}
        if not missing:
            return {}
        records = self.kube.exit_records(namespace, job.metadata.name or "")
        found = (
            departed_pod(self.kube.pod_events(namespace, uid), replacements, records.get(uid))
            for uid in sorted(missing)
        )
        return {view.name: view for view in found if view is not None}

    def apply_children(
        self, tracked: TrackedJob, job: RLJob, attempt: int, pods_wanted: bool, present_sets: set[str]
    ) -> dict[str, str]:
        """Applies what changed (or is missing); returns 'Kind/name' -> error for refusals.

        All or nothing: the StatefulSets (the only children that make pods) go in only after
        every other child did, and a spec generation's first StatefulSets are sent as a dry run
        first, so a child the API server refuses leaves no pod running. Refusals of the spec
        itself (400, 422) are kept apart in `tracked.invalid_children`: they end the job."""
        now = time.monotonic()
        key = (job.metadata.generation, attempt, pods_wanted)
        if tracked.children_in_place(key, present_sets, now):
            return {}
        errors: dict[str, str] = {}
        invalid: dict[str, str] = {}
        built = self.build(tracked, job, key)
        sets = [(child, d) for child, d in built if child["kind"] == "StatefulSet"]
        for child, child_digest in [(child, d) for child, d in built if child["kind"] != "StatefulSet"]:
            kind, name = child["kind"], child["metadata"]["name"]
            if not tracked.needs_apply(child, child_digest, now):
                continue
            try:
                if kind == "Secret":
                    # Created, never applied or read: one that exists already (an earlier
                    # operator's) keeps its token, which the pods take from it by reference.
                    self.kube.create(child)
                else:
                    self.kube.apply(child)
                tracked.applied[(kind, name)] = (child_digest, now)
            except ApiException as exc:
                errors[f"{kind}/{name}"] = _api_error(exc)
                if _refuses_the_spec(exc):
                    invalid[f"{kind}/{name}"] = errors[f"{kind}/{name}"]
        due = [
            (child, d)
            for child, d in sets
            if child["metadata"]["name"] not in present_sets or tracked.needs_apply(child, d, now)
        ]
        if not errors and due and tracked.validated_generation != job.metadata.generation:
            for child, _ in due:
                try:
                    self.kube.apply(child, dry_run=True)
                except ApiException as exc:
                    key_ = f"StatefulSet/{child['metadata']['name']}"
                    errors[key_] = _api_error(exc)
                    if _refuses_the_spec(exc):
                        invalid[key_] = errors[key_]
            if not errors:
                tracked.validated_generation = job.metadata.generation
        if not errors:
            for child, child_digest in due:
                name = child["metadata"]["name"]
                try:
                    self.kube.apply(child)
                    tracked.applied[("StatefulSet", name)] = (child_digest, now)
                except ApiException as exc:
                    errors[f"StatefulSet/{name}"] = _api_error(exc)
                    if _refuses_the_spec(exc):
                        invalid[f"StatefulSet/{name}"] = errors[f"StatefulSet/{name}"]
        tracked.invalid_children = invalid
        tracked.invalid_generation = job.metadata.generation
        return errors

    def build(self, tracked: TrackedJob, job: RLJob, key: tuple[int | None, int, bool]) -> list[tuple[Manifest, str]]:
        """desired_children with their digests. They depend only on `key` (spec generation,
        attempt, pods wanted): name and namespace are immutable, the Ray token fixed per uid."""
        _, attempt, pods_wanted = key
        built = desired_children(job, tracked.uid, attempt, pods_wanted, self.ray_token(tracked))
        tracked.built_for = key
        tracked.child_keys = [(child["kind"], child["metadata"]["name"]) for child in built]
        return [(child, digest(child)) for child in built]

    def ray_token(self, tracked: TrackedJob) -> str:
        """A token for the job's Secret, made once per job uid. Only the Secret carries it,
        and only when this operator creates the Secret: the operator never reads a Secret, so
        it holds no permission that would return a Secret's data."""
        if tracked.ray_token is None:
            tracked.ray_token = secrets.token_urlsafe(32)
        return tracked.ray_token


def _refuses_the_spec(exc: ApiException) -> bool:
    """The API server refused the object itself (invalid, or not decodable): applying it again
    cannot succeed until the RLJob's spec changes. Anything else (a missing CRD, permissions,
    the server busy) may pass on a later try."""
    return exc.status in (400, 422)


def _api_error(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason)
    except (ValueError, TypeError):
        return str(exc.reason)
