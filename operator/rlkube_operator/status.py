"""The status function: from the job and what is observed of its children to the
plan of one pass: the new status, the Events to emit and the actions, in order.
Pure: no I/O, time passed in.

The decision is a chain of small rules, tried in a fixed order; the first that
settles the job's fate ends it (RULES below):
- invalid child: the API server refused a child as invalid → Failed/InvalidChild, no pods
  (a later spec generation starts the job again);
- suspended: spec.suspend → Suspended, StatefulSets at zero;
- past deadline: activeDeadlineSeconds → Failed/DeadlineExceeded;
- driver succeeded: the controller pod's container exits 0 → Succeeded;
- restart begun: pods of a newer attempt than the status's (a restart whose status write
  was lost) → that restart is taken up;
- gang failed: a pod of the current attempt fails (or is replaced) → the failure policy
  (failure_policy.py) decides: Failed at once (the trainer's configuration error, a FailJob
  rule), or the gang restarts (restartCount + 1), counted against backoffLimit unless the
  pod was disrupted or an Ignore rule matched; past backoffLimit, Failed/BackoffLimitExceeded;
- missing reference: a ConfigMap, Secret or PersistentVolumeClaim the pods name does not
  exist (looked up only before the pods are created) → Pending, Created=False/MissingReference,
  StatefulSets at zero; the pods come once it exists; Failed after pendingTimeoutSeconds;
- does not fit: a role's memory estimate per rank exceeds its GPUs (spec.fit; looked up only
  before the pods are created) → Pending, Created=False/DoesNotFit with the numbers, no pods;
- bad image: a container that cannot start for pendingTimeoutSeconds → Failed;
- stuck before start: a scheduled pod whose containers do not start for
  pendingTimeoutSeconds, with the kubelet's reason (FailedMount, ...) → Failed;
- pods not created: a StatefulSet failing to create its pods (FailedCreate: a missing
  ServiceAccount, a quota, a Pod Security violation) → at once Running=False/PodsNotCreated,
  naming it with the controller's message (cleared once the pods are created); still failing
  after pendingTimeoutSeconds → Failed/PodsNotCreated;
- awaiting admission: pods held by Kueue's admission gate → Running=False/AwaitingAdmission,
  naming the queue; pendingTimeoutSeconds does not run out on a queue (it may hold a job for hours);
- unschedulable: pods Pending with no node that fits for that long → the Unschedulable
  condition, naming the role;
- readiness: Running once every pod is ready.
A terminal job never gets pods again: once its end is written, its StatefulSets go to zero and
every pod is deleted with FINISHED_GRACE_SECONDS; its children go after ttlSecondsAfterFinished.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum, auto
from typing import Literal

from rlkube_api.conditions import ConditionType, State, is_terminal, state_of
from rlkube_api.exit_codes import EXIT_CLASSES, ExitCode
from rlkube_api.names import CONTROLLER_ROLE, child_name
from rlkube_api.placement import Role, layout_of
from rlkube_api.rljob import Condition, Progress, RLJob, RLJobStatus, RoleStatus
from rlkube_operator.child_errors import describe
from rlkube_operator.children.references import Reference, job_references
from rlkube_operator.children.topology import pod_roles
from rlkube_operator.failure_policy import COUNTED, FailureAction, classify, gravest
from rlkube_operator.gang.kueue import ADMISSION_GATE
from rlkube_operator.node_loss import deletions_past_their_node
from rlkube_operator.observed import BAD_IMAGE_REASONS, STARTING_REASON, PodView, parse_time
from rlkube_operator.plan import (
    Action,
    ApplyChildren,
    CountRestart,
    DeleteChildren,
    DeletePods,
    Event,
    ObserveTimeToRunning,
    Plan,
    ScaleToZero,
    WriteStatus,
)
from rlkube_operator.rollout_scaling import (
    ROLLOUT,
    elastic_rollout,
    gang_rollout_replicas,
    new_engine,
    rollout_scaled,
    rollout_starting,
    scaled_away,
)

INVALID_CHILD = "InvalidChild"
CONTAINERS_NOT_STARTED = "ContainersNotStarted"
PODS_NOT_CREATED = "PodsNotCreated"
MISSING_REFERENCE = "MissingReference"
DOES_NOT_FIT = "DoesNotFit"
AWAITING_ADMISSION = "AwaitingAdmission"
# The trainer's full volume (exit_codes.ExitCode.STORAGE_FULL): permanent for the gang (a
# restart frees no space), but fixed once the user grows or cleans the volume and changes the
# spec (e.g. suspends and resumes the job).
STORAGE_FULL = next(c.reason for c in EXIT_CLASSES if c.code is ExitCode.STORAGE_FULL)
# Failed for these, a job starts again when its spec changes (a new generation).
FIXED_BY_A_SPEC_CHANGE = frozenset({INVALID_CHILD, STORAGE_FULL})
# While an object the pods name is missing, it is looked up again this often (nothing
# watched would wake the job when it is created).
REFERENCE_RECHECK_SECONDS = 5.0
# A child the API server refused is applied again this soon (nothing watched would wake the job).
APPLY_RETRY_SECONDS = 15.0
# A status change that is only counts and messages (not a transition) waits at most this
# long after the job's previous status write, collecting what happens meanwhile.
COUNTS_WRITE_INTERVAL = 1.0
# Condition types that announce trouble when True.
_WARNING_WHEN_TRUE = frozenset({ConditionType.FAILED, ConditionType.RESTARTING, ConditionType.UNSCHEDULABLE})
# Reasons that announce trouble whatever the condition says: the job waits on something a user must fix.
_WARNING_REASONS = frozenset({PODS_NOT_CREATED})
# SIGTERM to SIGKILL for the pods of a job that has ended. Its pods have nothing left to save: a
# succeeded driver wrote its last checkpoint before it recorded its success, and a failed job
# never runs again. A few seconds let the processes end cleanly; the job's own grace period
# (runPolicy.terminationGracePeriodSeconds, for saving the step in progress) would hold every
# pod, and the resources it asked for, that long after the end.
FINISHED_GRACE_SECONDS = 5


@dataclass(frozen=True)
class Observed:
    """The facts the status function reads."""

    pods: list[PodView]
    now: datetime
    # "Kind/name" -> error, for children the API server refused on the last apply.
    apply_errors: dict[str, str] = field(default_factory=dict)
    # Of those, the ones refused as invalid for the current spec generation.
    invalid_children: dict[str, str] = field(default_factory=dict)
    # Pod name -> its latest Warning Event ("Reason: message"), read for the pods
    # `pods_to_explain` names (scheduled, containers not started past the timeout).
    pod_warnings: dict[str, str] = field(default_factory=dict)
    # StatefulSet name -> its latest FailedCreate Warning Event (last seen, message), read
    # for the StatefulSets `stateful_sets_to_explain` names (short of pods past a short grace).
    create_failures: dict[str, tuple[datetime, str]] = field(default_factory=dict)
    # Pod name -> the gang member its StatefulSet replaced while no operator watched, as its
    # Events tell it (`observed.departed_pod`): read for the replaced pods of a running gang.
    departed: dict[str, PodView] = field(default_factory=dict)
    # The ConfigMaps, Secrets and claims the pods name that do not exist, looked up for the
    # jobs `references_to_check` names (pods yet to be created).
    missing_references: tuple[Reference, ...] = ()
    # Why a role's memory estimate exceeds its GPUs (fit.py), found for jobs whose pods are to come.
    fit_refusals: tuple[str, ...] = ()
    # Seconds since this operator last wrote the job's status (inf: not since it started).
    since_last_write: float = math.inf
    # The job's metadata.creationTimestamp, for the time-to-running metric.
    job_created: datetime | None = None


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

    def is_true(self, type_: ConditionType) -> bool:
        c = self.by_type.get(type_)
        return c is not None and c.status == "True"

    def set(self, type_: ConditionType, status: Literal["True", "False"], reason: str, message: str) -> None:
        old = self.by_type.get(type_)
        changed = old is None or old.status != status or old.reason != reason
        warning = (
            (status == "True" and type_ in _WARNING_WHEN_TRUE)
            or (type_ == ConditionType.CREATED and status == "False")
            or reason in _WARNING_REASONS
        )
        if old is None and status == "False" and not warning:
            changed = False  # a condition that never held needs no Event, unless it reports trouble
        transition = self.now if old is None or old.status != status else parse_time(old.last_transition_time)
        self.by_type[type_] = Condition(
            type=type_.value,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=_iso(transition or self.now),
            observed_generation=self.generation,
        )
        # One Event per cause: finishing sets Succeeded and clears Running for the same reason.
        if changed and not any(e.reason == reason and e.message == message for e in self.events):
            self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def clear(self, type_: ConditionType, reason: str, message: str) -> None:
        """Sets False only if the condition exists (never adds a False condition)."""
        if type_ in self.by_type:
            self.set(type_, "False", reason, message)

    def as_list(self) -> list[Condition]:
        return list(self.by_type.values())


def _role_counts(job: RLJob, pods: list[PodView]) -> dict[str, RoleStatus]:
    counts = {}
    for role in pod_roles(job):
        mine = [p for p in pods if p.role == role.name]
        layout = None if role.name == CONTROLLER_ROLE else layout_of(job.spec.roles, Role(role.name), role)
        counts[role.name] = RoleStatus(
            replicas=role.replicas,
            layout=None if layout is None else layout.describe(),
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
    # The newest attempt's report first: a dead gang's pod (still being deleted) may show a
    # later step than the new gang, which resumed from a checkpoint before it.
    latest = max(reports, key=lambda r: (_int(r.get("attempt")), _int(r.get("step")), str(r.get("updatedAt", ""))))
    known = {f.alias or name for name, f in Progress.model_fields.items()}
    try:
        # Fields a newer driver adds are ignored, not a reason to drop the report.
        return Progress.model_validate({k: v for k, v in latest.items() if k in known})
    except ValueError:
        return previous


def _without_estimate(progress: Progress | None) -> Progress | None:
    """An ended job's progress: nothing is left to estimate (the driver's last report still had)."""
    if progress is None:
        return None
    return progress.model_copy(update={"time_remaining": None, "estimated_completion_time": None})


def _int(value: object) -> int:
    return value if isinstance(value, int) else -1


def _first_step_pending(status: RLJobStatus) -> bool:
    """After a gang restart, whether the new gang's driver has yet to report a step: its reports
    carry their attempt. (Reports without one, from an older driver or none at all: not waited for.)"""
    progress = status.progress
    return progress is not None and progress.attempt is not None and progress.attempt < status.restart_count


def _age(pod: PodView, now: datetime) -> float:
    return (now - pod.created).total_seconds() if pod.created else 0.0


def _replaced_pods(job: RLJob, current: list[PodView], prev: RLJobStatus) -> list[PodView]:
    """Pods that were not part of the gang when it last ran: their predecessor died,
    even if the operator missed the failure (it was down, or the pod was deleted). A rollout
    that scales in place gains new pods as it grows, at ordinals the gang never had: those
    are new engines, not replacements (`new_engine`)."""
    if not prev.gang_pod_uids:
        return []
    members = set(prev.gang_pod_uids)
    return [p for p in current if p.uid and p.uid not in members and not new_engine(job, prev, p)]


def _wanted(status: RLJobStatus) -> int:
    return sum(r.replicas for r in status.roles.values())


def _restarting_message(ready: int, wanted: int) -> str:
    return f"the gang is restarting from its last checkpoint: {ready}/{wanted} pods are ready"


# --- one pass -------------------------------------------------------------------------------------


class Fate(Enum):
    """What a rule decided for the job's pods in this pass."""

    ACTIVE = auto()  # the gang runs (or starts) at its current attempt
    RESTART = auto()  # a new attempt: new templates, the old gang's pods deleted
    SUSPENDED = auto()  # StatefulSets kept, at zero replicas
    HELD = auto()  # no pods yet: something they name is missing; StatefulSets at zero replicas
    FINISHING = auto()  # the job ends now: its StatefulSets scale to zero


@dataclass
class _Pass:
    """The state one compute_status call builds up while its rules run."""

    job: RLJob
    observed: Observed
    prev: RLJobStatus
    status: RLJobStatus
    conds: _Conditions
    # Pods of the current attempt that are not being deleted.
    current: list[PodView]
    requeue: list[float] = field(default_factory=list)

    @property
    def now(self) -> datetime:
        return self.observed.now

    def finish(self, state: State, cond: ConditionType, reason: str, message: str) -> Fate:
        self.conds.set(cond, "True", reason, message)
        self.conds.clear(ConditionType.RUNNING, reason, message)
        self.conds.clear(ConditionType.RESTARTING, reason, message)
        self.status.state = state.value
        self.status.completion_time = _iso(self.now)
        self.requeue = []
        ttl = self.job.spec.run_policy.ttl_seconds_after_finished
        if ttl is not None:
            self.requeue.append(ttl)
        return Fate.FINISHING


Rule = Callable[[_Pass], Fate | None]


def _record_gang(p: _Pass) -> None:
    """The running gang, as the next passes judge pods against it: its pods, and the rollout
    ordinals it has (a rollout pod at a higher one is a scale-up's new engine)."""
    p.status.gang_pod_uids = sorted(pod.uid for pod in p.current if pod.uid)
    p.status.gang_rollout_replicas = gang_rollout_replicas(p.job, p.current, p.prev.gang_rollout_replicas)


def _forget_gang(status: RLJobStatus) -> None:
    status.gang_pod_uids = None
    status.gang_rollout_replicas = None


def children_created(p: _Pass) -> None:
    """The Created condition reports the last apply (a refused child names itself), or the
    objects the pods name that are missing (no pod is created for now)."""
    if p.observed.missing_references:
        once = "it exists" if len(p.observed.missing_references) == 1 else "they exist"
        message = f"{_not_found(p)}: the job's pods are created once {once}"
        p.conds.set(ConditionType.CREATED, "False", MISSING_REFERENCE, message)
    elif p.observed.apply_errors:
        detail = "; ".join(f"{k}: {v}" for k, v in sorted(p.observed.apply_errors.items()))
        p.conds.set(ConditionType.CREATED, "False", "CreateFailed", detail)
    else:
        p.conds.set(
            ConditionType.CREATED, "True", "ChildrenCreated", "StatefulSets, Services and ConfigMap are in place"
        )


def invalid_child(p: _Pass) -> Fate | None:
    """A child the API server refuses as invalid: no pod was started (apply_children holds the
    StatefulSets back), and none will be until the spec changes."""
    if not p.observed.invalid_children:
        return None
    return p.finish(State.FAILED, ConditionType.FAILED, INVALID_CHILD, describe(p.job, p.observed.invalid_children))


def suspended(p: _Pass) -> Fate | None:
    if not p.job.spec.suspend:
        p.conds.clear(ConditionType.SUSPENDED, "Resumed", "spec.suspend is false: pods are recreated")
        if p.observed.apply_errors:
            p.requeue.append(APPLY_RETRY_SECONDS)  # e.g. a PodGroup CRD installed after the job
        return None
    p.conds.set(ConditionType.SUSPENDED, "True", "Suspended", "spec.suspend is true: the job's pods are deleted")
    p.conds.clear(ConditionType.RUNNING, "Suspended", "the job is suspended")
    p.status.state = State.SUSPENDED.value
    p.status.start_time = None  # activeDeadlineSeconds counts from the next start, as for Jobs
    _forget_gang(p.status)  # the pods are gone on purpose; the resumed gang is a new one
    return Fate.SUSPENDED


def _first_gang_held_for_admission(p: _Pass) -> bool:
    """The job's first gang, not yet admitted by Kueue (its pods carry the admission gate)."""
    never_ran = state_of(p.prev.state) in (None, State.PENDING, State.CREATED) and p.status.restart_count == 0
    return never_ran and any(ADMISSION_GATE in pod.scheduling_gates for pod in p.current)


def past_deadline(p: _Pass) -> Fate | None:
    if _first_gang_held_for_admission(p):
        # Counted from admission: as for a Job Kueue unsuspends, time in the queue is no run time.
        p.status.start_time = None
        return None
    # As for Jobs, the deadline counts from when the job first wanted pods, running or not.
    p.status.start_time = p.status.start_time or _iso(p.now)
    deadline = p.job.spec.run_policy.active_deadline_seconds
    started = parse_time(p.status.start_time)
    if deadline is None or started is None:
        return None
    left = deadline - (p.now - started).total_seconds()
    if left > 0:
        p.requeue.append(left)
        return None
    return p.finish(
        State.FAILED,
        ConditionType.FAILED,
        "DeadlineExceeded",
        f"the job ran longer than activeDeadlineSeconds={deadline}",
    )


def driver_succeeded(p: _Pass) -> Fate | None:
    if not any(pod.succeeded for pod in p.current if pod.role == CONTROLLER_ROLE):
        return None
    return p.finish(State.SUCCEEDED, ConditionType.SUCCEEDED, "DriverSucceeded", "the driver finished training")


def restart_begun(p: _Pass) -> Fate | None:
    """Pods of an attempt newer than the status's: a pass decided that restart (applied the
    new templates, maybe deleted the old gang) and its operator died before writing the
    status. The restart is taken up where it stopped, not decided again: the dying pass
    checked backoffLimit, and the old gang's pods are no failure of the new one. Without
    this, the job would re-apply the old templates and count a gang it does not have."""
    newest = max((pod.attempt for pod in p.observed.pods if not pod.deleting), default=0)
    if p.prev.state is None or newest <= p.prev.restart_count:
        return None
    status = p.status
    status.restart_count = newest
    _forget_gang(status)
    status.roles = _role_counts(p.job, [pod for pod in p.observed.pods if pod.attempt == newest and not pod.deleting])
    ready = sum(r.ready for r in status.roles.values())
    p.conds.set(
        ConditionType.RESTARTING,
        "True",
        "RestartTakenUp",
        f"pods of attempt {newest} exist while the status said {p.prev.restart_count}: a restart begun before the"
        f" operator stopped; restarting the gang (restart {newest})",
    )
    p.conds.set(ConditionType.RUNNING, "False", "Restarting", _restarting_message(ready, _wanted(status)))
    status.state = State.RESTARTING.value
    p.requeue = [1.0]
    return Fate.RESTART


def gang_failed(p: _Pass) -> Fate | None:
    prev, policy = p.prev, p.job.spec.run_policy
    # A failed pod counts even while its StatefulSet deletes it.
    # A rollout pod the spec scaled away ends on purpose (its SIGTERM exit code, a Failed phase).
    failed = [
        pod
        for pod in p.observed.pods
        if pod.attempt == prev.restart_count and pod.failed and not scaled_away(p.job, pod)
    ]
    replaced = _replaced_pods(p.job, p.current, prev)
    if not (failed or replaced):
        return None
    # A replaced member whose Events tell how it ended is judged as if it had been seen.
    departed = [p.observed.departed[pod.name] for pod in replaced if pod.name in p.observed.departed]
    unknown = [pod for pod in replaced if pod.name not in p.observed.departed]
    pod, verdict = gravest(
        [(pod, classify(pod, policy.pod_failure_policy)) for pod in failed + departed]
        + [(pod, COUNTED) for pod in unknown]
    )
    if not pod.failed:
        cause = "it was deleted or failed and its StatefulSet replaced it"
    elif pod.departed:
        cause = f"{pod.failure_reason()} (from its exit record and Events: its StatefulSet replaced it while no operator watched)"
    else:
        cause = pod.failure_reason()
    what = f"pod {pod.name} (role {pod.role}) failed: {cause}"
    if verdict.why:
        what = f"{what}; {verdict.why}"
    if verdict.action is FailureAction.FAIL_JOB:
        return p.finish(State.FAILED, ConditionType.FAILED, verdict.reason, what)
    uncounted = prev.uncounted_restarts or 0
    counted = prev.restart_count - uncounted
    if verdict.action is FailureAction.COUNT and counted >= policy.backoff_limit:
        return p.finish(
            State.FAILED,
            ConditionType.FAILED,
            "BackoffLimitExceeded",
            f"{what}; {counted} restarts reached backoffLimit={policy.backoff_limit}",
        )
    status = p.status
    status.restart_count = prev.restart_count + 1
    if verdict.action is FailureAction.IGNORE:
        status.uncounted_restarts = uncounted + 1
    _forget_gang(status)
    # Counted for the new attempt, as the next pass will: the decision is a fixed point,
    # so the loop needs no further pass (nor the watch's echo of this write) to settle.
    status.roles = _role_counts(p.job, [pod for pod in p.observed.pods if pod.attempt == status.restart_count])
    ready = sum(r.ready for r in status.roles.values())
    p.conds.set(
        ConditionType.RESTARTING,
        "True",
        verdict.reason,
        f"{what}; restarting the gang (restart {status.restart_count})",
    )
    p.conds.set(ConditionType.RUNNING, "False", "Restarting", _restarting_message(ready, _wanted(status)))
    status.state = State.RESTARTING.value
    p.requeue = [1.0]
    return Fate.RESTART


def _not_found(p: _Pass) -> str:
    missing = p.observed.missing_references
    verb = "does" if len(missing) == 1 else "do"
    return f"{', '.join(str(ref) for ref in missing)} {verb} not exist in namespace {p.job.metadata.namespace}"


def pods_to_come(job: RLJob, pods: list[PodView], present_sets: set[str]) -> bool:
    """Whether the job's pods are yet to be created (a new job, a resumed one, one still waiting
    for them): what they need is checked before this pass, and not once they exist."""
    status = job.status or RLJobStatus()
    if job.spec.suspend or (is_terminal(status.state) and not _failed_for_an_older_spec(job)):
        return False
    if any(not pod.deleting for pod in pods):
        return False
    created = next((c for c in status.conditions if c.type == ConditionType.CREATED), None)
    waiting = created is not None and created.status == "False" and created.reason in (MISSING_REFERENCE, DOES_NOT_FIT)
    resuming = state_of(status.state) is State.SUSPENDED
    sets = {child_name(job.metadata.name or "", role.name) for role in pod_roles(job)}
    # A terminal job here is one whose spec was fixed: it starts again.
    return waiting or resuming or not sets <= present_sets or is_terminal(status.state)


def references_to_check(job: RLJob, pods: list[PodView], present_sets: set[str]) -> list[Reference]:
    """The ConfigMaps, Secrets and claims to look up before this pass: only while the job's pods
    are yet to be created. Once pods exist, a ConfigMap deleted under them is the kubelet's to
    report (stuck_before_start)."""
    return job_references(job) if pods_to_come(job, pods, present_sets) else []


def does_not_fit(p: _Pass) -> Fate | None:
    """The memory estimate of a role exceeds its GPUs (looked up only before the pods are
    created): no pod is created, so none holds GPUs to run out of memory in its first step. The
    estimate is made again every few seconds (a node's label, spec.fit or the job's sizes may
    change) and the pods come once it fits."""
    if not p.observed.fit_refusals:
        return None
    message = (
        "; ".join(p.observed.fit_refusals)
        + ". No pod is created: change the layout, fsdpConfig (modelDtype, offload), the micro-batch or the "
        "GPUs (`kubectl rlkube plan` shows the estimate)"
    )
    p.conds.set(ConditionType.CREATED, "False", DOES_NOT_FIT, message)
    p.status.state = State.PENDING.value
    p.requeue.append(REFERENCE_RECHECK_SECONDS)
    return Fate.HELD


def missing_reference(p: _Pass) -> Fate | None:
    """An object the pods name does not exist: no pod is created (the StatefulSets stay at zero
    replicas, as when suspended), so none sits scheduled holding GPUs for a mount that cannot
    succeed. It is looked up again every few seconds and the pods come once it exists; after
    pendingTimeoutSeconds of waiting, Failed. The wait runs from when Created turned False."""
    if not p.observed.missing_references:
        return None
    timeout = p.job.spec.run_policy.pending_timeout_seconds
    created = p.conds.by_type[ConditionType.CREATED]  # children_created set it this pass
    since = parse_time(created.last_transition_time) or p.now
    waited = (p.now - since).total_seconds()
    if waited >= timeout:
        return p.finish(
            State.FAILED,
            ConditionType.FAILED,
            MISSING_REFERENCE,
            f"{_not_found(p)} after waiting pendingTimeoutSeconds={timeout}; no pod was created",
        )
    p.status.state = State.PENDING.value
    p.requeue.append(min(REFERENCE_RECHECK_SECONDS, timeout - waited))
    return Fate.HELD


def bad_image(p: _Pass) -> Fate | None:
    timeout = p.job.spec.run_policy.pending_timeout_seconds
    for pod in p.current:
        if pod.waiting_reason not in BAD_IMAGE_REASONS:
            continue
        if _age(pod, p.now) >= timeout:
            return p.finish(
                State.FAILED,
                ConditionType.FAILED,
                pod.waiting_reason or "ImagePullFailed",
                f"pod {pod.name} (role {pod.role}) cannot start its container for {timeout}s: "
                f"{pod.waiting_message or pod.waiting_reason}",
            )
        p.requeue.append(timeout - _age(pod, p.now))
    return None


# How soon a pod whose containers are still being created past the timeout, with nothing
# wrong reported (a large image still pulling), is looked at again.
STARTING_RECHECK_SECONDS = 30.0
CREATE_FAILURE_RECHECK_SECONDS = 5.0
# A StatefulSet (podManagementPolicy Parallel) creates all its pods within a second or so of
# being applied: only one still short of them this long after the attempt asked for them has
# its FailedCreate Events read. Earlier, nearly every new job would cost an Events list per role
# while its pods are merely on their way.
CREATE_FAILURE_GRACE_SECONDS = 5.0


def _starting_too_long(job: RLJob, pod: PodView, now: datetime) -> bool:
    return (
        pod.waiting_reason == STARTING_REASON
        and pod.scheduled_at is not None
        and (now - pod.scheduled_at).total_seconds() >= job.spec.run_policy.pending_timeout_seconds
    )


def pods_to_explain(job: RLJob, pods: list[PodView], now: datetime) -> list[PodView]:
    """Pods scheduled for pendingTimeoutSeconds whose containers have not started and whose
    status says nothing more: the kubelet's reason is in their Warning Events (FailedMount...)."""
    return [
        pod
        for pod in pods
        if pod.attempt == (job.status.restart_count if job.status else 0)
        and not pod.deleting
        and not pod.waiting_message
        and _starting_too_long(job, pod, now)
    ]


_MOUNT_FAILED = re.compile(r'for volume "([^"]+)"')


def name_volume_source(job: RLJob, cause: str) -> str:
    """The kubelet's mount error names the pod's volume, not what the user wrote ("configmap
    references non-existent config key" says nothing of which ConfigMap): the volume's
    source is added from the job's pods."""
    mount = _MOUNT_FAILED.search(cause)
    if mount is None:
        return cause
    sources = [f"{ref.kind} {ref.name}" for ref in job_references(job) if ref.use == f"volume {mount[1]}"]
    return f"{cause} (volume {mount[1]}: {', '.join(sources)})" if sources else cause


def stuck_before_start(p: _Pass) -> Fate | None:
    """A scheduled pod whose containers never start (a ConfigMap, Secret or claim that cannot
    be mounted, say) ends the job after pendingTimeoutSeconds with the kubelet's message. A pod
    with nothing wrong reported is only still pulling its image: it is left alone."""
    timeout = p.job.spec.run_policy.pending_timeout_seconds
    for pod in p.current:
        if pod.waiting_reason != STARTING_REASON or pod.scheduled_at is None:
            continue
        if not _starting_too_long(p.job, pod, p.now):
            p.requeue.append(timeout - (p.now - pod.scheduled_at).total_seconds())
            continue
        cause = pod.waiting_message or p.observed.pod_warnings.get(pod.name)
        if not cause:
            p.requeue.append(STARTING_RECHECK_SECONDS)
            continue
        cause = name_volume_source(p.job, cause)
        return p.finish(
            State.FAILED,
            ConditionType.FAILED,
            CONTAINERS_NOT_STARTED,
            f"pod {pod.name} (role {pod.role}) has been scheduled for over {timeout}s without starting its "
            f"containers: {cause}",
        )
    return None


def _pods_awaited_since(job: RLJob, state: str | None, conditions: Iterable[Condition]) -> datetime | None:
    """When the current attempt's pods were asked for: the StatefulSets going in (Created), or
    the gang's restart; None before the children exist, or for a job that wants no pods."""
    if job.spec.suspend or is_terminal(state):
        return None
    wanted = (ConditionType.CREATED, ConditionType.RESTARTING)
    times = [parse_time(c.last_transition_time) for c in conditions if c.type in wanted and c.status == "True"]
    return max((t for t in times if t is not None), default=None)


def _present(job: RLJob, pods: list[PodView]) -> Counter[str]:
    attempt = job.status.restart_count if job.status else 0
    return Counter(pod.role for pod in pods if pod.attempt == attempt and not pod.deleting)


def _gang_rollout(job: RLJob) -> int | None:
    """The rollout pods a running gang needs, where its rollout scales in place: the ordinals it
    has (status.gangRolloutReplicas). A scale-up's pods past them are new engines the gang trains
    without, so their StatefulSet failing to create them must not fail the job."""
    status = job.status
    if status is None or status.gang_rollout_replicas is None or state_of(status.state) is not State.RUNNING:
        return None
    return status.gang_rollout_replicas


def _roles_missing_pods(job: RLJob, pods: list[PodView]) -> list[str]:
    """The StatefulSets short of the pods the gang needs."""
    present, gang_rollout = _present(job, pods), _gang_rollout(job)
    return [
        child_name(job.metadata.name or "", role.name)
        for role in pod_roles(job)
        if present.get(role.name, 0)
        < (role.replicas if role.name != ROLLOUT or gang_rollout is None else min(role.replicas, gang_rollout))
    ]


def _new_engines_missing(job: RLJob, pods: list[PodView]) -> str | None:
    """The rollout StatefulSet of a running gang that is short of a scale-up's new engines."""
    gang_rollout = _gang_rollout(job)
    if gang_rollout is None or _present(job, pods).get(ROLLOUT, 0) >= job.spec.roles.rollout.replicas:
        return None
    return child_name(job.metadata.name or "", ROLLOUT)


def stateful_sets_to_explain(job: RLJob, pods: list[PodView], now: datetime) -> list[str]:
    """The StatefulSets still short of pods CREATE_FAILURE_GRACE_SECONDS (or a shorter
    pendingTimeoutSeconds) after the attempt asked for them: why is in their controller's
    FailedCreate Events."""
    since = _pods_awaited_since(job, job.status.state, job.status.conditions) if job.status else None
    grace = min(CREATE_FAILURE_GRACE_SECONDS, job.spec.run_policy.pending_timeout_seconds)
    if since is None or (now - since).total_seconds() < grace:
        return []
    scaling = _new_engines_missing(job, pods)
    return _roles_missing_pods(job, pods) + ([scaling] if scaling else [])


def pods_not_created(p: _Pass) -> Fate | None:
    """A StatefulSet that cannot create its pods (its controller's FailedCreate Event of this
    attempt: a missing ServiceAccount, a quota, a Pod Security violation) says so at once,
    Running=False/PodsNotCreated naming it with the controller's message, while the job waits
    for the cause to be fixed (the pods come, the condition clears). Still short of its pods
    pendingTimeoutSeconds after the attempt asked for them, it ends the job with that reason:
    its other roles' pods would otherwise hold their GPUs waiting for it forever."""
    # This pass's conditions: the pass that creates the children starts the wait, and must
    # come back when it is over (the watch may bring nothing: a StatefulSet that cannot create
    # pods may never change).
    since = _pods_awaited_since(p.job, p.status.state, p.conds.by_type.values())
    missing = _roles_missing_pods(p.job, p.observed.pods)
    if since is None or not missing:
        return None
    failures = [
        (name, message)
        for name, (last_seen, message) in sorted(p.observed.create_failures.items())
        if name in missing and last_seen >= since  # this attempt's failure, not an earlier one's
    ]
    timeout = p.job.spec.run_policy.pending_timeout_seconds
    waited = (p.now - since).total_seconds()
    if waited >= timeout:
        if failures:
            name, message = failures[0]
            return p.finish(
                State.FAILED,
                ConditionType.FAILED,
                PODS_NOT_CREATED,
                f"StatefulSet {name} has not created its pods for over {timeout}s: {message}",
            )
        # No failure reported yet: the controller-manager posts its Events asynchronously (late
        # under load), and nothing else wakes the job when one arrives.
        p.requeue.append(CREATE_FAILURE_RECHECK_SECONDS)
        return None
    p.requeue.append(timeout - waited)
    if not failures:
        # Nothing wakes the job when an Event arrives: it looks once the grace is over, then again
        # after a quarter of the wait so far (at least every 5 s), so that a StatefulSet short of
        # pods with no Event (a busy controller-manager) costs some 15 Events lists over the
        # default timeout, not 60.
        if waited < CREATE_FAILURE_GRACE_SECONDS:
            p.requeue.append(CREATE_FAILURE_GRACE_SECONDS - waited)
        else:
            p.requeue.append(max(CREATE_FAILURE_RECHECK_SECONDS, waited / 4))
        return None
    if p.conds.is_true(ConditionType.RUNNING):
        return None  # a running gang's rollout adding engines: the gang trains on (readiness)
    name, message = failures[0]
    others = [other for other, _ in failures[1:]]
    also = f" (nor can {', '.join(others)})" if others else ""
    p.conds.set(
        ConditionType.RUNNING,
        "False",
        PODS_NOT_CREATED,
        f"StatefulSet {name} cannot create its pods{also}: {message}; the job fails if they are still "
        f"missing after runPolicy.pendingTimeoutSeconds={timeout}",
    )
    restarting = p.conds.is_true(ConditionType.RESTARTING)
    p.status.state = State.RESTARTING.value if restarting else State.CREATED.value
    return Fate.ACTIVE


def _why_new_engines_are_missing(p: _Pass) -> str:
    """A scale-up's rollout pods that their StatefulSet reported it cannot create (a quota, say):
    the gang trains on without them, and the Running condition says why they are not coming."""
    name = _new_engines_missing(p.job, p.observed.pods)
    since = _pods_awaited_since(p.job, p.prev.state, p.prev.conditions)
    failure = p.observed.create_failures.get(name) if name else None
    if failure is None or since is None or failure[0] < since:
        return ""
    return f"; StatefulSet {name} cannot create the new ones: {failure[1]}"


def awaiting_admission(p: _Pass) -> Fate | None:
    """Pods Kueue holds back (its admission gate) until the queue admits the whole gang: the
    job waits, however long the queue takes; no pending timeout runs out meanwhile."""
    gated = [pod for pod in p.current if ADMISSION_GATE in pod.scheduling_gates]
    if not gated:
        return None
    gang = p.job.spec.run_policy.gang
    queue = f"queue {gang.queue}" if gang is not None and gang.queue else "the namespace's default queue"
    wanted = _wanted(p.status)
    p.conds.set(
        ConditionType.RUNNING,
        "False",
        AWAITING_ADMISSION,
        f"waiting for Kueue admission in {queue}: {len(gated)}/{wanted} pods are held by the {ADMISSION_GATE} gate",
    )
    p.conds.clear(ConditionType.UNSCHEDULABLE, AWAITING_ADMISSION, "the pods wait for Kueue admission")
    restarting = p.conds.is_true(ConditionType.RESTARTING)
    p.status.state = State.RESTARTING.value if restarting else State.CREATED.value
    return Fate.ACTIVE


def unschedulable(p: _Pass) -> Fate | None:
    """Only a condition: the job waits for a node (the deadline, if any, ends it)."""
    timeout = p.job.spec.run_policy.pending_timeout_seconds
    stuck = [pod for pod in p.current if pod.unschedulable_message is not None]
    overdue = [pod for pod in stuck if _age(pod, p.now) >= timeout]
    if overdue:
        pod = overdue[0]
        p.conds.set(
            ConditionType.UNSCHEDULABLE,
            "True",
            "Unschedulable",
            f"role {pod.role}: pod {pod.name} has been Pending for over {timeout}s: {pod.unschedulable_message}",
        )
        return None
    p.requeue += [timeout - _age(pod, p.now) for pod in stuck]
    if not stuck:
        p.conds.clear(ConditionType.UNSCHEDULABLE, "Scheduled", "every pod has a node")
    return None


def readiness(p: _Pass) -> Fate:
    status, conds = p.status, p.conds
    ready = sum(r.ready for r in status.roles.values())
    wanted = _wanted(status)
    if ready == wanted and wanted > 0 and conds.is_true(ConditionType.RESTARTING) and _first_step_pending(status):
        # Restarting until the new gang trains: its pods are up, its driver resumes.
        _record_gang(p)
        conds.set(
            ConditionType.RUNNING,
            "False",
            "Restarting",
            f"all {wanted} pods are ready; waiting for the new gang's first step (restart {status.restart_count})",
        )
        status.state = State.RESTARTING.value
    elif ready == wanted and wanted > 0:
        conds.set(ConditionType.RUNNING, "True", "AllPodsReady", f"all {wanted} pods are ready")
        _record_gang(p)
        conds.clear(ConditionType.RESTARTING, "Resumed", "the gang is running again")
        status.state = State.RUNNING.value
    elif (
        state_of(p.prev.state) is State.RUNNING
        and not conds.is_true(ConditionType.RESTARTING)
        and elastic_rollout(p.job)
        and rollout_starting(status.roles)
    ):
        # A rollout scaling: the gang trains on while new engines start (and join it) or
        # removed ones go.
        rollout = status.roles[ROLLOUT]
        conds.set(
            ConditionType.RUNNING,
            "True",
            "AllPodsReady",
            f"the gang is running; the rollout is scaling: {rollout.ready}/{rollout.replicas} rollout pods are ready"
            + _why_new_engines_are_missing(p),
        )
        _record_gang(p)
        status.state = State.RUNNING.value
    elif conds.is_true(ConditionType.RESTARTING):
        conds.set(ConditionType.RUNNING, "False", "Restarting", _restarting_message(ready, wanted))
        status.state = State.RESTARTING.value
    else:
        was_running = conds.is_true(ConditionType.RUNNING)
        waiting = [pod.waiting_reason for pod in p.current if pod.waiting_reason in BAD_IMAGE_REASONS]
        reason = waiting[0] if waiting else "PodsNotReady"
        conds.set(ConditionType.RUNNING, "False", reason or "PodsNotReady", f"{ready}/{wanted} pods are ready")
        # A running gang with a pod briefly not ready is still running; the condition says why.
        running = was_running or state_of(p.prev.state) is State.RUNNING
        status.state = State.RUNNING.value if running else State.CREATED.value
    return Fate.ACTIVE


# The rules, in the order they are tried; the first to return a Fate decides the pass.
RULES: tuple[Rule, ...] = (
    invalid_child,
    suspended,
    past_deadline,
    driver_succeeded,
    restart_begun,
    gang_failed,
    missing_reference,
    does_not_fit,
    bad_image,
    stuck_before_start,
    pods_not_created,
    awaiting_admission,
    unschedulable,
    readiness,
)


def compute_status(job: RLJob, observed: Observed) -> Plan:
    prev = job.status or RLJobStatus()
    status = prev.model_copy(deep=True)
    status.observed_generation = job.metadata.generation
    current = [pod for pod in observed.pods if pod.attempt == prev.restart_count and not pod.deleting]
    status.roles = _role_counts(job, current)
    status.progress = _progress(observed.pods, prev.progress)
    p = _Pass(job, observed, prev, status, _Conditions(prev.conditions, observed.now, job.metadata.generation), current)

    if is_terminal(prev.state) and not _spec_fixed(p):
        status.progress = _without_estimate(status.progress)
        return _finished(p)
    children_created(p)
    if (scaled := rollout_scaled(job, prev)) is not None:
        p.conds.events.append(scaled)
    fate = Fate.ACTIVE
    for rule in RULES:
        if (decided := rule(p)) is not None:
            fate = decided
            break
    status.conditions = p.conds.as_list()
    if is_terminal(status.state):
        status.progress = _without_estimate(status.progress)

    if fate is Fate.FINISHING:
        # The terminal state is written first: the pods are its evidence (the driver's exit
        # code or finished run) until it is stored.
        return _with_write(p, [], fate, then=_release(job, observed.pods))
    # For a restart: the new templates first (the attempt annotation), then the old gang goes.
    actions: list[Action] = [ApplyChildren(status.restart_count, pods_wanted=fate not in (Fate.SUSPENDED, Fate.HELD))]
    actions += _stale_pods(observed, status, job.spec.run_policy.termination_grace_period_seconds)
    gone, events, waits = deletions_past_their_node(observed.pods, status.restart_count, observed.now)
    actions += gone
    p.conds.events += events
    p.requeue += waits
    return _with_write(p, actions, fate)


def _failed(job: RLJob) -> Condition | None:
    """The job's Failed condition, if it is True."""
    conditions = job.status.conditions if job.status else []
    failed = next((c for c in conditions if c.type == ConditionType.FAILED), None)
    return failed if failed is not None and failed.status == "True" else None


def _failed_for_an_older_spec(job: RLJob) -> bool:
    """Failed for a reason a spec change may fix (FIXED_BY_A_SPEC_CHANGE), and the spec has
    changed since."""
    failed = _failed(job)
    if failed is None or failed.reason not in FIXED_BY_A_SPEC_CHANGE:
        return False
    return failed.observed_generation != job.metadata.generation


def _spec_fixed(p: _Pass) -> bool:
    """A job Failed for an invalid child or a full volume whose spec has changed since: it
    starts again (the Failed condition cleared, the new spec's children applied). After a full
    volume the gang ran: it starts as a new attempt, not counted against backoffLimit (the
    failed gang's pods are an older attempt's, no failure of the new one), and its driver
    resumes from the last complete checkpoint."""
    if not _failed_for_an_older_spec(p.job):
        return False
    message = "the spec changed: its children are applied again"
    failed = _failed(p.job)
    if failed is not None and failed.reason == STORAGE_FULL:
        status = p.status
        status.restart_count = p.prev.restart_count + 1
        status.uncounted_restarts = (p.prev.uncounted_restarts or 0) + 1
        _forget_gang(status)
        p.prev = p.prev.model_copy(update={"restart_count": status.restart_count, "gang_pod_uids": None})
        p.current = []
        status.roles = _role_counts(p.job, [])
        message = (
            "the spec changed after the volume filled up: the gang starts again "
            f"(restart {status.restart_count}, not counted) from its last complete checkpoint"
        )
    p.conds.set(ConditionType.FAILED, "False", "SpecChanged", message)
    p.status.state = State.CREATED.value
    p.status.completion_time = None
    return True


def _finished(p: _Pass) -> Plan:
    """A terminal job: no children applied, no pod left (those still there, say after the
    operator stopped between writing the terminal state and deleting them, are deleted);
    the children are deleted once the TTL elapses."""
    actions = _release(p.job, p.observed.pods)
    ttl = p.job.spec.run_policy.ttl_seconds_after_finished
    done = parse_time(p.prev.completion_time)
    if ttl is not None and done is not None:
        left = ttl - (p.now - done).total_seconds()
        if left <= 0:
            actions.append(DeleteChildren())
        else:
            p.requeue.append(left)
    return _with_write(p, actions, None)


def _release(job: RLJob, pods: list[PodView]) -> list[Action]:
    """An ended job lets go of its pods at once: every pod still there is deleted with
    FINISHED_GRACE_SECONDS (those whose containers ended at once), then its StatefulSets go to
    zero replicas so that nothing recreates them. Deleted first, the pods get the short grace
    period as their only one: scaled down first, the StatefulSet controller would delete them
    with the pods' own (the job's, for saving a step), and only a kubelet that honours a
    shortened grace period would cut that. A StatefulSet recreates no pod while its
    predecessor terminates, so the scale-down right after comes in time. Pods already being
    deleted get the short grace period too (it shortens a longer one); nothing once the pods
    are gone."""
    if not pods:
        return []
    ended = tuple((pod.name, pod.uid) for pod in pods if pod.failed or (pod.succeeded and not pod.run_finished))
    running = tuple((pod.name, pod.uid) for pod in pods if (pod.name, pod.uid) not in ended)
    actions: list[Action] = []
    if ended:
        actions.append(DeletePods(ended))
    if running:
        actions.append(DeletePods(running, FINISHED_GRACE_SECONDS))
    actions.append(ScaleToZero(tuple(child_name(job.metadata.name or "", r.name) for r in pod_roles(job))))
    return actions


def _stale_pods(observed: Observed, status: RLJobStatus, grace_period_seconds: int) -> list[Action]:
    """Pods of an earlier attempt still around (a restart's old gang): those whose containers
    ended at once, the running ones with the grace period to save the step in progress."""
    stale = [pod for pod in observed.pods if pod.attempt < status.restart_count and not pod.deleting]
    ended = tuple((pod.name, pod.uid) for pod in stale if pod.failed or pod.succeeded)
    running = tuple((pod.name, pod.uid) for pod in stale if not (pod.failed or pod.succeeded))
    actions: list[Action] = []
    if ended:
        actions.append(DeletePods(ended))
    if running:
        actions.append(DeletePods(running, grace_period_seconds))
    return actions


def _with_write(p: _Pass, actions: list[Action], fate: Fate | None, then: Iterable[Action] = ()) -> Plan:
    """Adds the status write (now, or a requeue for when it is due), the actions that come
    after it (`then`) and the metrics."""
    events = p.conds.events if fate is not None else []
    requeue = list(p.requeue)
    delay = status_write_delay(p.prev, p.status, p.observed.since_last_write, COUNTS_WRITE_INTERVAL)
    if delay == 0:
        actions.append(WriteStatus(p.status))
    elif delay is not None:
        # Nothing is lost: the next pass computes the status afresh from the pods.
        requeue.append(delay)
    actions += then
    if fate is Fate.RESTART:
        actions.append(CountRestart())
    first_run = state_of(p.prev.state) in (None, State.PENDING, State.CREATED) and p.status.restart_count == 0
    if state_of(p.status.state) is State.RUNNING and first_run and p.observed.job_created is not None:
        actions.append(ObserveTimeToRunning((p.now - p.observed.job_created).total_seconds()))
    return Plan(p.status, events, actions, min(requeue) if requeue else None)


def pod_loss_breaks_gang(job_state: str | None, restart_count: int, suspended: bool, pod_attempt: int) -> bool:
    """Whether a pod being deleted means the gang lost a member: a pod of the current attempt
    while the job wants pods. The operator never deletes those itself (it deletes older
    attempts, or scales to zero when suspended or done), so someone else did."""
    state = state_of(job_state)
    if suspended or state is None or state.terminal or state is State.SUSPENDED:
        return False
    return pod_attempt == restart_count


def is_transition(prev: RLJobStatus, new: RLJobStatus) -> bool:
    """Whether `new` differs from `prev` in more than role counts and condition messages: a
    state, a condition's status or reason, the restart count, the driver's progress, times,
    a role's wanted replicas.
    Those are written at once; counts and messages alone may wait a moment, so that a gang
    whose pods turn ready one after another costs one status write, not one per pod."""

    def essentials(status: RLJobStatus) -> RLJobStatus:
        conditions = [c.model_copy(update={"message": "", "last_transition_time": ""}) for c in status.conditions]
        # The wanted replicas are kept: a rollout scaling is written at once (its Event is told once).
        wanted = {name: RoleStatus(replicas=role.replicas, layout=role.layout) for name, role in status.roles.items()}
        return status.model_copy(update={"roles": wanted, "conditions": conditions})

    return essentials(prev) != essentials(new)


def status_write_delay(prev: RLJobStatus, new: RLJobStatus, since_last_write: float, interval: float) -> float | None:
    """When to write `new` over `prev`: None (nothing changed), 0 (now: a transition, or the
    job's last write is `interval` seconds old), or the seconds left until then."""
    if new == prev:
        return None
    if is_transition(prev, new) or since_last_write >= interval:
        return 0.0
    return interval - since_last_write
