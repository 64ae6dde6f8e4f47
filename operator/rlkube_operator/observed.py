"""What the operator sees of a job's pods, reduced to the facts the status
function decides on. Parsing Kubernetes dicts happens here, once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rlkube_api.names import (
    ANNOTATION_ATTEMPT,
    ANNOTATION_EXIT_CODE,
    ANNOTATION_PROGRESS,
    ANNOTATION_RUN_FINISHED,
    EVENT_TRAINER_EXITED,
    LABEL_ROLE,
)

# The waiting reason of a scheduled pod whose containers have not started: pulling its image,
# or stuck (a volume that cannot be mounted, a sandbox that cannot be made).
STARTING_REASON = "ContainerCreating"
# Waiting reasons that will not fix themselves.
BAD_IMAGE_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"}
)


# The pod condition that marks a disruption: preempted, evicted, deleted with its node.
DISRUPTION_TARGET = "DisruptionTarget"
# The condition Kueue sets on a pod it stops (its Workload preempted or evicted) before deleting
# it: a disruption too, and the gang goes back to its queue.
KUEUE_TERMINATION_TARGET = "TerminationTarget"
# The most of a termination message a condition and an Event carry (its end: where the error is).
MESSAGE_TAIL = 1024


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    role: str
    attempt: int
    phase: str
    created: datetime | None
    deleting: bool = False
    # When its deletion's grace period ends (metadata.deletionTimestamp): by then a live
    # kubelet has ended the pod's containers and confirmed.
    deletion_due: datetime | None = None
    node: str = ""
    # The reason of its DisruptionTarget=True condition (DeletionByTaintManager: evicted from a
    # node whose NoExecute taint outlasted the pod's toleration).
    disruption_reason: str | None = None
    ready: bool = False
    # When the pod was bound to a node (its PodScheduled condition turned True).
    scheduled_at: datetime | None = None
    unschedulable_message: str | None = None
    # spec.schedulingGates: what holds the pod back from the scheduler (Kueue's admission gate).
    scheduling_gates: tuple[str, ...] = ()
    waiting_reason: str | None = None
    waiting_message: str | None = None
    # A container that ended: (exit code, reason), from its state or, after a restart, its last state.
    terminated: tuple[int, str] | None = None
    # That container's termination message (what it wrote, or its log's last lines with
    # terminationMessagePolicy FallbackToLogsOnError).
    termination_message: str = ""
    # (type, status) of the pod's conditions, for podFailurePolicy's onPodConditions. A pod
    # its kubelet evicted counts as carrying DisruptionTarget=True.
    conditions: frozenset[tuple[str, str]] = frozenset()
    restarts: int = 0
    # Set for a pod the gang lost while running (deleted, evicted): phase Failed, this reason.
    lost_reason: str | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    # Rebuilt from the Events about a pod replaced while no operator watched (`departed_pod`).
    departed: bool = False
    # The driver recorded its run's success on its pod and idles (ANNOTATION_RUN_FINISHED).
    run_finished: bool = False

    @property
    def index(self) -> int | None:
        """The pod's ordinal in its StatefulSet (the end of its name)."""
        _, _, tail = self.name.rpartition("-")
        return int(tail) if tail.isdigit() else None

    @property
    def failed(self) -> bool:
        if self.phase == "Failed":
            return True
        return self.terminated is not None and self.terminated[0] != 0

    @property
    def succeeded(self) -> bool:
        if self.phase == "Succeeded" or self.run_finished:
            return True
        return self.terminated is not None and self.terminated[0] == 0

    def failure_reason(self) -> str:
        if self.terminated is not None:
            code, reason = self.terminated
            said = f"{reason or 'Error'} (exit code {code})"
            message = self.termination_message.strip()
            if len(message) > MESSAGE_TAIL:
                message = "…" + message[-MESSAGE_TAIL:]
            return f"{said}: {message}" if message else said
        if self.lost_reason:
            return self.lost_reason
        return "pod failed"


def _stopped_by_kueue(status: dict[str, Any]) -> bool:
    return any(
        c.get("type") == KUEUE_TERMINATION_TARGET and c.get("status") == "True" for c in status.get("conditions") or []
    )


def _disruption_reason(conditions: dict[Any, dict[str, Any]]) -> str | None:
    disruption = conditions.get(DISRUPTION_TARGET) or {}
    return str(disruption.get("reason") or "") if disruption.get("status") == "True" else None


def view_pod(pod: dict[str, Any]) -> PodView:
    meta = pod.get("metadata", {})
    status = pod.get("status", {}) or {}
    annotations = meta.get("annotations") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled", {})
    unschedulable = None
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        unschedulable = scheduled.get("message") or "no node fits"
    elif not scheduled and not (pod.get("spec") or {}).get("nodeName") and status.get("phase", "Pending") == "Pending":
        # No scheduler has looked at the pod at all (e.g. a gang scheduler that isn't installed).
        scheduler = (pod.get("spec") or {}).get("schedulerName", "default-scheduler")
        unschedulable = f"no scheduler has picked the pod up (schedulerName {scheduler})"
    waiting_reason = waiting_message = None
    terminated: tuple[int, str] | None = None
    termination_message = ""
    restarts = 0
    for cs in status.get("containerStatuses") or []:
        restarts += int(cs.get("restartCount", 0))
        state = cs.get("state") or {}
        if "waiting" in state:
            waiting_reason = state["waiting"].get("reason")
            waiting_message = state["waiting"].get("message")
        ended = state.get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if ended is not None and terminated is None:
            terminated = (int(ended.get("exitCode", 1)), str(ended.get("reason", "")))
            termination_message = str(ended.get("message") or "")
    try:
        progress = json.loads(annotations.get(ANNOTATION_PROGRESS, "{}"))
    except json.JSONDecodeError:
        progress = {}
    return PodView(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        role=(meta.get("labels") or {}).get(LABEL_ROLE, ""),
        attempt=int(annotations.get(ANNOTATION_ATTEMPT, "0")),
        phase=status.get("phase", "Pending"),
        created=parse_time(meta.get("creationTimestamp")),
        deleting=bool(meta.get("deletionTimestamp")),
        deletion_due=parse_time(meta.get("deletionTimestamp")),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        disruption_reason=_disruption_reason(conditions),
        scheduled_at=parse_time(scheduled.get("lastTransitionTime")) if scheduled.get("status") == "True" else None,
        ready=conditions.get("Ready", {}).get("status") == "True",
        unschedulable_message=unschedulable,
        scheduling_gates=tuple(str(g.get("name", "")) for g in (pod.get("spec") or {}).get("schedulingGates") or []),
        waiting_reason=waiting_reason,
        waiting_message=waiting_message,
        terminated=terminated,
        termination_message=termination_message,
        conditions=frozenset(
            [(str(c.get("type")), str(c.get("status"))) for c in status.get("conditions") or []]
            + ([(DISRUPTION_TARGET, "True")] if status.get("reason") == "Evicted" or _stopped_by_kueue(status) else [])
        ),
        restarts=restarts,
        progress=progress if isinstance(progress, dict) else {},
        lost_reason=status.get("message") if status.get("reason") == LOST_REASON else None,
        run_finished=ANNOTATION_RUN_FINISHED in annotations,
    )


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The parts of a pod the operator reads (`view_pod`, stale-attempt deletion), for its
    in-memory index: a pod body is ~10 KB of JSON (half of it managedFields) and ~70 KB as
    Python objects; this keeps a tenth. `view_pod(slim_pod(p)) == view_pod(p)`."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    slim_meta = {
        key: meta[key] for key in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp") if key in meta
    }
    slim_meta["labels"] = {k: v for k, v in labels.items() if k == LABEL_ROLE}
    slim_meta["annotations"] = {
        k: v for k, v in annotations.items() if k in (ANNOTATION_ATTEMPT, ANNOTATION_PROGRESS, ANNOTATION_RUN_FINISHED)
    }
    slim_status = {key: status[key] for key in ("phase", "reason", "message") if key in status}
    # Every condition: podFailurePolicy rules may name any type (DisruptionTarget, say).
    slim_status["conditions"] = [
        {k: c[k] for k in ("type", "status", "reason", "message", "lastTransitionTime") if k in c}
        for c in status.get("conditions") or []
    ]
    slim_status["containerStatuses"] = [
        {k: cs[k] for k in ("restartCount", "state", "lastState") if k in cs}
        for cs in status.get("containerStatuses") or []
    ]
    return {
        "metadata": slim_meta,
        "spec": {key: spec[key] for key in ("nodeName", "schedulerName", "schedulingGates") if key in spec},
        "status": slim_status,
    }


# The reason a lost pod's recorded status carries (see as_lost).
LOST_REASON = "RLJobPodLost"


def as_lost(pod: dict[str, Any], why: str) -> dict[str, Any]:
    """A copy of a pod the gang lost while it ran (deleted, evicted), marked failed so the
    status function restarts the gang even after its StatefulSet replaced it. It stays marked
    as being deleted: it is no member of any gang any more, and no pass deletes it again (a
    second delete, at grace 0, would cut short the grace period it has to save its step)."""
    lost = dict(pod)
    lost["status"] = {**(pod.get("status") or {}), "phase": "Failed", "reason": LOST_REASON, "message": why}
    return lost


def pods_to_judge(indexed: list[dict[str, Any]], kept: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods a pass judges: the index's, with the pods kept since the last pass (by uid).
    A kept failed pod the index no longer has is added (its StatefulSet replaced it). A pod
    kept as lost (`as_lost`) stands in for the index's copy even while that one is still there:
    a member deleted while the job ran keeps running through its grace period (it serves its
    driver until the driver has saved), and judged as it is, it would look like a healthy
    member until it ended, by when the driver may have finished the job without it."""
    lost = {uid for uid, pod in kept.items() if (pod.get("status") or {}).get("reason") == LOST_REASON}
    pods = [pod for pod in indexed if pod["metadata"]["uid"] not in lost]
    present = {pod["metadata"]["uid"] for pod in pods}
    return pods + [pod for uid, pod in kept.items() if uid not in present]


# Reasons of the Events that say a pod was disrupted rather than failed on its own: its kubelet
# evicted it (node pressure), the scheduler preempted it, the taint manager deleted it with
# its unreachable node. A pod seen while it ran says so in its DisruptionTarget condition.
DISRUPTION_EVENT_REASONS = frozenset({"Evicted", "Preempted", "TaintManagerEviction"})


def event_time(event: dict[str, Any]) -> str:
    """When an Event was last seen, as its RFC 3339 text (which sorts as time does)."""
    return str(event.get("lastTimestamp") or event.get("eventTime") or "")


def departed_pod(
    events: list[dict[str, Any]], replacements: dict[str, PodView], exit_record: dict[str, Any] | None = None
) -> PodView | None:
    """A gang member that failed and was replaced while no operator watched, as far as what
    is known of it (one pod UID's) tells: the exit its trainer recorded (`exit_record`, from
    the job's exit-record ConfigMap, which only the job's own ServiceAccount may write), and
    whether it was disrupted (the Events about it). `TrainerExited` Events are not trusted:
    whoever may create Events in the namespace could post one about any pod. `replacements`:
    by name, the pods its StatefulSet made in place of gang members; the departed pod's role
    and attempt are its replacement's. None when neither says anything, or the pod has not
    been replaced."""
    events = [e for e in events if e.get("reason") != EVENT_TRAINER_EXITED]
    known = events + ([exit_record] if exit_record is not None else [])
    if not known:
        return None
    involved = known[0].get("involvedObject") or {}
    replacement = replacements.get(str(involved.get("name", "")))
    if replacement is None:
        return None
    exits = [exit_record] if exit_record is not None else []
    disruptions = [e for e in events if e.get("reason") in DISRUPTION_EVENT_REASONS]
    terminated, message = None, ""
    if exits:
        last = max(exits, key=event_time)
        code = ((last.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_EXIT_CODE, "")
        if code.lstrip("-").isdigit():
            terminated, message = (int(code), "Error"), str(last.get("message") or "")
    lost_reason = None
    if disruptions:
        last = max(disruptions, key=event_time)
        lost_reason = f"{last.get('reason')}: {last.get('message', '')}"
    if terminated is None and lost_reason is None:
        return None
    return PodView(
        name=replacement.name,
        uid=str(involved.get("uid", "")),
        role=replacement.role,
        attempt=replacement.attempt,
        phase="Failed",
        created=None,
        terminated=terminated,
        termination_message=message,
        conditions=frozenset([(DISRUPTION_TARGET, "True")] if lost_reason else []),
        lost_reason=lost_reason,
        departed=True,
    )
