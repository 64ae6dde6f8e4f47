"""The status function: from the job and what is observed of its children to the
new status, the Events to emit and what to do next. Pure: no I/O, time passed in.

Lifecycle decided here:
- a pod of the current attempt fails (or its container restarts) → the gang
  restarts (restartCount + 1) until backoffLimit, then Failed/BackoffLimitExceeded;
- the controller pod's container exits 0 → Succeeded;
- activeDeadlineSeconds → Failed/DeadlineExceeded;
- pods Pending with no node that fits for pendingTimeoutSeconds → Unschedulable
  (naming the role); a bad image for that long → Failed;
- spec.suspend → Suspended, pods gone; a terminal job never gets pods again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from rlkube_api.names import CONTROLLER_ROLE
from rlkube_api.rljob import Condition, JobState, Progress, RLJob, RLJobStatus, RoleStatus
from rlkube_operator.children.topology import pod_roles
from rlkube_operator.observed import BAD_IMAGE_REASONS, PodView, parse_time

TERMINAL = ("Succeeded", "Failed")
# A child the API server refused is applied again this soon (nothing watched would wake the job).
APPLY_RETRY_SECONDS = 15.0
# Condition types that announce trouble when True.
_WARNING_WHEN_TRUE = frozenset({"Failed", "Restarting", "Unschedulable"})


@dataclass(frozen=True)
class Observed:
    """The facts the status function reads."""

    pods: list[PodView]
    now: datetime
    # "Kind/name" -> error, for children the API server refused.
    apply_errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Decision:
    status: RLJobStatus
    events: list[Event]
    # Whether the StatefulSets should have their replicas (False: suspended or finished).
    pods_wanted: bool
    # Delete the pods of every earlier attempt (set after a failure bumped the attempt).
    restart_gang: bool = False
    # ttlSecondsAfterFinished elapsed: delete the children.
    delete_children: bool = False
    # Come back after this many seconds even if nothing changes (deadlines, timeouts).
    requeue_after: float | None = None


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Conditions:
    """Sets conditions, keeping lastTransitionTime unless the status flips, and
    records an Event for every transition."""

    def __init__(self, existing: list[Condition], now: datetime, generation: int | None) -> None:
        self.by_type = {c.type: c for c in existing}
        self.now = now
        self.generation = generation
        self.events: list[Event] = []

    def is_true(self, type_: str) -> bool:
        c = self.by_type.get(type_)
        return c is not None and c.status == "True"

    def set(self, type_: str, status: Literal["True", "False"], reason: str, message: str) -> None:
        old = self.by_type.get(type_)
        changed = old is None or old.status != status or old.reason != reason
        warning = (status == "True" and type_ in _WARNING_WHEN_TRUE) or (type_ == "Created" and status == "False")
        if old is None and status == "False" and not warning:
            changed = False  # a condition that never held needs no Event, unless it reports trouble
        transition = self.now if old is None or old.status != status else parse_time(old.last_transition_time)
        self.by_type[type_] = Condition(
            type=type_,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=_iso(transition or self.now),
            observed_generation=self.generation,
        )
        # One Event per cause: finishing sets Succeeded and clears Running for the same reason.
        if changed and not any(e.reason == reason and e.message == message for e in self.events):
            self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def clear(self, type_: str, reason: str, message: str) -> None:
        """Sets False only if the condition exists (never adds a False condition)."""
        if type_ in self.by_type:
            self.set(type_, "False", reason, message)

    def as_list(self) -> list[Condition]:
        return list(self.by_type.values())


def _role_counts(job: RLJob, pods: list[PodView]) -> dict[str, RoleStatus]:
    counts = {}
    for role in pod_roles(job):
        mine = [p for p in pods if p.role == role.name]
        counts[role.name] = RoleStatus(
            replicas=role.replicas,
            active=sum(1 for p in mine if not (p.failed or p.succeeded)),
            ready=sum(1 for p in mine if p.ready),
            succeeded=sum(1 for p in mine if p.succeeded),
            failed=sum(1 for p in mine if p.failed),
        )
    return counts


def _progress(pods: list[PodView], previous: Progress | None) -> Progress | None:
    """The driver's latest report (the controller pod's progress annotation)."""
    reports = [p.progress for p in pods if p.role == CONTROLLER_ROLE and p.progress]
    if not reports:
        return previous
    latest = max(reports, key=lambda r: (r.get("step", 0), r.get("updatedAt", "")))
    known = {f.alias or name for name, f in Progress.model_fields.items()}
    try:
        # Fields a newer driver adds are ignored, not a reason to drop the report.
        return Progress.model_validate({k: v for k, v in latest.items() if k in known})
    except ValueError:
        return previous


def _age(pod: PodView, now: datetime) -> float:
    return (now - pod.created).total_seconds() if pod.created else 0.0


def _replaced_pods(current: list[PodView], gang: list[str] | None) -> list[PodView]:
    """Pods that were not part of the gang when it last ran: their predecessor died,
    even if the operator missed the failure (it was down, or the pod was deleted)."""
    if not gang:
        return []
    members = set(gang)
    return [p for p in current if p.uid and p.uid not in members]


def _wanted(status: RLJobStatus) -> int:
    return sum(r.replicas for r in status.roles.values())


def _restarting_message(ready: int, wanted: int) -> str:
    return f"the gang is restarting from its last checkpoint: {ready}/{wanted} pods are ready"


def compute_status(job: RLJob, observed: Observed) -> Decision:
    prev = job.status or RLJobStatus()
    now = observed.now
    policy = job.spec.run_policy
    conds = _Conditions(prev.conditions, now, job.metadata.generation)
    status = prev.model_copy(deep=True)
    status.observed_generation = job.metadata.generation
    current = [p for p in observed.pods if p.attempt == prev.restart_count and not p.deleting]
    status.roles = _role_counts(job, current)
    status.progress = _progress(observed.pods, prev.progress)

    def finish(state: JobState, cond: str, reason: str, message: str) -> Decision:
        conds.set(cond, "True", reason, message)
        conds.clear("Running", reason, message)
        conds.clear("Restarting", reason, message)
        status.state = state
        status.completion_time = _iso(now)
        status.conditions = conds.as_list()
        return Decision(status, conds.events, pods_wanted=False, requeue_after=policy.ttl_seconds_after_finished)

    if prev.state in TERMINAL:
        decision = Decision(status, [], pods_wanted=False)
        ttl = policy.ttl_seconds_after_finished
        done = parse_time(prev.completion_time)
        if ttl is not None and done is not None:
            left = ttl - (now - done).total_seconds()
            decision.delete_children = left <= 0
            decision.requeue_after = None if left <= 0 else left
        return decision

    if observed.apply_errors:
        detail = "; ".join(f"{k}: {v}" for k, v in sorted(observed.apply_errors.items()))
        conds.set("Created", "False", "CreateFailed", detail)
    else:
        conds.set("Created", "True", "ChildrenCreated", "StatefulSets, Services and ConfigMap are in place")

    if job.spec.suspend:
        conds.set("Suspended", "True", "Suspended", "spec.suspend is true: the job's pods are deleted")
        conds.clear("Running", "Suspended", "the job is suspended")
        status.state = "Suspended"
        status.start_time = None  # activeDeadlineSeconds counts from the next start, as for Jobs
        status.gang_pod_uids = None  # the pods are gone on purpose; the resumed gang is a new one
        status.conditions = conds.as_list()
        return Decision(status, conds.events, pods_wanted=False)
    conds.clear("Suspended", "Resumed", "spec.suspend is false: pods are recreated")

    requeue: list[float] = []
    if observed.apply_errors:
        requeue.append(APPLY_RETRY_SECONDS)  # e.g. a PodGroup CRD installed after the job
    # As for Jobs, the deadline counts from when the job first wanted pods, running or not.
    status.start_time = status.start_time or _iso(now)
    deadline = policy.active_deadline_seconds
    started = parse_time(status.start_time)
    if deadline is not None and started is not None:
        left = deadline - (now - started).total_seconds()
        if left <= 0:
            return finish(
                "Failed", "Failed", "DeadlineExceeded", f"the job ran longer than activeDeadlineSeconds={deadline}"
            )
        requeue.append(left)

    if any(p.succeeded for p in current if p.role == CONTROLLER_ROLE):
        return finish("Succeeded", "Succeeded", "DriverSucceeded", "the driver finished training")

    # A failed pod counts even while its StatefulSet deletes it.
    failed = [p for p in observed.pods if p.attempt == prev.restart_count and p.failed]
    replaced = _replaced_pods(current, prev.gang_pod_uids)
    if failed or replaced:
        pod = (failed or replaced)[0]
        cause = pod.failure_reason() if failed else "it was deleted or failed and its StatefulSet replaced it"
        what = f"pod {pod.name} (role {pod.role}) failed: {cause}"
        if prev.restart_count >= policy.backoff_limit:
            return finish(
                "Failed",
                "Failed",
                "BackoffLimitExceeded",
                f"{what}; {prev.restart_count} restarts reached backoffLimit={policy.backoff_limit}",
            )
        status.restart_count = prev.restart_count + 1
        status.gang_pod_uids = None
        # Counted for the new attempt, as the next pass will: the decision is a fixed point,
        # so the loop needs no further pass (nor the watch's echo of this write) to settle.
        status.roles = _role_counts(job, [p for p in observed.pods if p.attempt == status.restart_count])
        ready = sum(r.ready for r in status.roles.values())
        conds.set("Restarting", "True", "PodFailed", f"{what}; restarting the gang (restart {status.restart_count})")
        conds.set("Running", "False", "Restarting", _restarting_message(ready, _wanted(status)))
        status.state = "Restarting"
        status.conditions = conds.as_list()
        return Decision(status, conds.events, pods_wanted=True, restart_gang=True, requeue_after=1.0)

    pending_timeout = policy.pending_timeout_seconds
    bad_image = [p for p in current if p.waiting_reason in BAD_IMAGE_REASONS]
    for pod in bad_image:
        if _age(pod, now) >= pending_timeout:
            return finish(
                "Failed",
                "Failed",
                pod.waiting_reason or "ImagePullFailed",
                f"pod {pod.name} (role {pod.role}) cannot start its container for {pending_timeout}s: "
                f"{pod.waiting_message or pod.waiting_reason}",
            )
        requeue.append(pending_timeout - _age(pod, now))

    stuck = [p for p in current if p.unschedulable_message is not None]
    overdue = [p for p in stuck if _age(p, now) >= pending_timeout]
    if overdue:
        pod = overdue[0]
        conds.set(
            "Unschedulable",
            "True",
            "Unschedulable",
            f"role {pod.role}: pod {pod.name} has been Pending for over {pending_timeout}s: {pod.unschedulable_message}",
        )
    else:
        requeue += [pending_timeout - _age(p, now) for p in stuck]
        if not stuck:
            conds.clear("Unschedulable", "Scheduled", "every pod has a node")

    ready = sum(r.ready for r in status.roles.values())
    wanted = _wanted(status)
    if ready == wanted and wanted > 0:
        conds.set("Running", "True", "AllPodsReady", f"all {wanted} pods are ready")
        status.gang_pod_uids = sorted(p.uid for p in current if p.uid)
        conds.clear("Restarting", "Resumed", "the gang is running again")
        status.state = "Running"
    else:
        was_running = conds.is_true("Running")
        if conds.is_true("Restarting"):
            conds.set("Running", "False", "Restarting", _restarting_message(ready, wanted))
            status.state = "Restarting"
        else:
            reason = bad_image[0].waiting_reason if bad_image else "PodsNotReady"
            conds.set("Running", "False", reason or "PodsNotReady", f"{ready}/{wanted} pods are ready")
            # A running gang with a pod briefly not ready is still running; the condition says why.
            status.state = "Running" if was_running or prev.state == "Running" else "Created"
    status.conditions = conds.as_list()
    return Decision(status, conds.events, pods_wanted=True, requeue_after=min(requeue) if requeue else None)


def is_transition(prev: RLJobStatus, new: RLJobStatus) -> bool:
    """Whether `new` differs from `prev` in more than role counts and condition messages: a
    state, a condition's status or reason, the restart count, the driver's progress, times.
    Those are written at once; counts and messages alone may wait a moment, so that a gang
    whose pods turn ready one after another costs one status write, not one per pod."""

    def essentials(status: RLJobStatus) -> RLJobStatus:
        conditions = [c.model_copy(update={"message": "", "last_transition_time": ""}) for c in status.conditions]
        return status.model_copy(update={"roles": {}, "conditions": conditions})

    return essentials(prev) != essentials(new)


def status_write_delay(prev: RLJobStatus, new: RLJobStatus, since_last_write: float, interval: float) -> float | None:
    """When to write `new` over `prev`: None (nothing changed), 0 (now: a transition, or the
    job's last write is `interval` seconds old), or the seconds left until then."""
    if new == prev:
        return None
    if is_transition(prev, new) or since_last_write >= interval:
        return 0.0
    return interval - since_last_write
