"""The state one pass of the status function builds up while its rules run: the facts it
reads (`Observed`), the conditions it sets (with an Event for each transition), the job's
`Fate`, and the small helpers more than one group of rules shares."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum, auto
from typing import Literal

from rlkube_api.conditions import ConditionType, State
from rlkube_api.names import CONTROLLER_ROLE
from rlkube_api.placement import Role, layout_of
from rlkube_api.rljob import Condition, RLJob, RLJobStatus, RoleStatus
from rlkube_operator.children.references import Reference
from rlkube_operator.children.topology import pod_roles
from rlkube_operator.observed import PodView, parse_time
from rlkube_operator.plan import Event

PODS_NOT_CREATED = "PodsNotCreated"
# Condition types that announce trouble when True.
_WARNING_WHEN_TRUE = frozenset({ConditionType.FAILED, ConditionType.RESTARTING, ConditionType.UNSCHEDULABLE})
# Reasons that announce trouble whatever the condition says: the job waits on something a user must fix.
_WARNING_REASONS = frozenset({PODS_NOT_CREATED})


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


def iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Conditions:
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
            last_transition_time=iso(transition or self.now),
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


def role_counts(job: RLJob, pods: list[PodView]) -> dict[str, RoleStatus]:
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


def replicas_wanted(status: RLJobStatus) -> int:
    return sum(r.replicas for r in status.roles.values())


# --- one pass -------------------------------------------------------------------------------------


class Fate(Enum):
    """What a rule decided for the job's pods in this pass."""

    ACTIVE = auto()  # the gang runs (or starts) at its current attempt
    RESTART = auto()  # a new attempt: new templates, the old gang's pods deleted
    SUSPENDED = auto()  # StatefulSets kept, at zero replicas
    HELD = auto()  # no pods yet: something they name is missing; StatefulSets at zero replicas
    FINISHING = auto()  # the job ends now: its StatefulSets scale to zero


@dataclass
class Pass:
    """The state one compute_status call builds up while its rules run."""

    job: RLJob
    observed: Observed
    prev: RLJobStatus
    status: RLJobStatus
    conds: Conditions
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
        self.status.completion_time = iso(self.now)
        self.requeue = []
        ttl = self.job.spec.run_policy.ttl_seconds_after_finished
        if ttl is not None:
            self.requeue.append(ttl)
        return Fate.FINISHING


Rule = Callable[[Pass], Fate | None]


def forget_gang(status: RLJobStatus) -> None:
    status.gang_pod_uids = None
    status.gang_rollout_replicas = None
