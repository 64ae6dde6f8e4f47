"""What one reconcile pass does, as data: the actions the status function orders and
the reconciler carries out, in order, without deciding anything itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlkube_api.rljob import RLJobStatus


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class ApplyChildren:
    """Server-side apply of every child built for this attempt (what changed, or is missing).
    `pods_wanted` False keeps the StatefulSets at zero replicas (suspended, or held back while
    an object the pods name is missing)."""

    attempt: int
    pods_wanted: bool


@dataclass(frozen=True)
class DeletePods:
    """Deletes pods of earlier attempts, each only if it is still the object seen (its UID):
    a StatefulSet reuses a pod's name at once."""

    pods: tuple[tuple[str, str], ...]  # (name, uid)
    # SIGTERM to SIGKILL: running pods get the job's grace period to save the step in progress;
    # pods whose containers have ended have nothing to save and go at once.
    grace_period_seconds: int = 0


@dataclass(frozen=True)
class ScaleToZero:
    """Stops a finishing job's pods without re-applying (so recreating) any child."""

    stateful_sets: tuple[str, ...]


@dataclass(frozen=True)
class DeleteChildren:
    """ttlSecondsAfterFinished has elapsed."""


@dataclass(frozen=True)
class WriteStatus:
    status: RLJobStatus


@dataclass(frozen=True)
class CountRestart:
    """The restart counter metric, once per gang restart."""


@dataclass(frozen=True)
class ObserveTimeToRunning:
    """The time-to-running metric: from the job's creation to its first gang all ready."""

    seconds: float


Action = ApplyChildren | DeletePods | ScaleToZero | DeleteChildren | WriteStatus | CountRestart | ObserveTimeToRunning


@dataclass
class Plan:
    """The new status, the Events to post and the actions, in the order they are carried out."""

    status: RLJobStatus
    events: list[Event]
    actions: list[Action] = field(default_factory=list)
    # Come back after this many seconds even if nothing changes (deadlines, timeouts, a
    # status write held back).
    requeue_after: float | None = None

    @property
    def pods_wanted(self) -> bool:
        """Whether the StatefulSets keep their replicas (False: suspended, held back or finished)."""
        return any(isinstance(a, ApplyChildren) and a.pods_wanted for a in self.actions)

    @property
    def restart_gang(self) -> bool:
        """Whether this pass starts a new attempt of the gang."""
        return any(isinstance(a, CountRestart) for a in self.actions)

    @property
    def delete_children(self) -> bool:
        return any(isinstance(a, DeleteChildren) for a in self.actions)

    @property
    def written(self) -> RLJobStatus | None:
        """The status this plan writes, if it writes one."""
        return next((a.status for a in self.actions if isinstance(a, WriteStatus)), None)
