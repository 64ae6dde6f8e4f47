"""What the node reports in a pod's status, decided from its containers' records (no I/O).

Readiness: a container counts as ready while its process runs; readiness,
liveness and startup probes are not run.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# The conditions this node owns; others (PodScheduled, DisruptionTarget) are kept as they are.
OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    state: dict[str, Any] = {"reason": reason}
    if message:
        state["message"] = message
    return {"waiting": state}


def running(started_at: str) -> dict[str, Any]:
    return {"running": {"startedAt": started_at}}


def terminated(
    exit_code: int, started_at: str, finished_at: str, reason: str = "", message: str = ""
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason or ("Completed" if exit_code == 0 else "Error"),
        "startedAt": started_at,
        "finishedAt": finished_at,
    }
    if message:
        state["message"] = message
    return {"terminated": state}


@dataclass
class ContainerRecord:
    """One container of a pod as the node last saw it."""

    name: str
    image: str
    restart_count: int = 0
    state: dict[str, Any] = field(default_factory=lambda: waiting("ContainerCreating"))
    last_state: dict[str, Any] = field(default_factory=dict)
    container_id: str = ""
    # No further run will follow (restart policy, or the pod is going away).
    done: bool = False

    @property
    def is_running(self) -> bool:
        return "running" in self.state

    @property
    def exit_code(self) -> int | None:
        state = self.state.get("terminated")
        return None if state is None else int(state["exitCode"])

    @property
    def has_run(self) -> bool:
        return self.is_running or "terminated" in self.state or bool(self.last_state) or self.restart_count > 0

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.is_running,
            "started": self.is_running,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


def pod_phase(init: Sequence[ContainerRecord], containers: Sequence[ContainerRecord], *, init_failed: bool) -> str:
    """Pending until a container has run, Running while any runs or will restart, then Succeeded/Failed."""
    if init_failed:
        return "Failed"
    if any(record.exit_code != 0 or not record.done for record in init):
        return "Pending"
    if containers and all(record.done for record in containers):
        return "Succeeded" if all(record.exit_code == 0 for record in containers) else "Failed"
    if any(record.has_run for record in containers):
        return "Running"
    return "Pending"


def pod_conditions(
    previous: Sequence[dict[str, Any]],
    *,
    phase: str,
    sandbox_ready: bool,
    init: Sequence[ContainerRecord],
    containers: Sequence[ContainerRecord],
) -> list[dict[str, Any]]:
    """The pod's conditions; a condition keeps its lastTransitionTime while its status stays the same."""
    initialized = all(record.done and record.exit_code == 0 for record in init)
    unready = [record.name for record in containers if not record.is_running]
    if phase in ("Succeeded", "Failed"):
        ready_reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
    else:
        ready_reason = "ContainersNotReady"
    ready_message = f"containers with unready status: [{' '.join(unready)}]"
    wanted: dict[str, tuple[bool, str, str]] = {
        "PodReadyToStartContainers": (sandbox_ready, "", ""),
        "Initialized": (
            initialized,
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(r.name for r in init if not r.done)}]",
        ),
        "ContainersReady": (not unready, ready_reason, ready_message),
        "Ready": (not unready, ready_reason, ready_message),
    }
    by_type = {condition["type"]: condition for condition in previous}
    conditions = [condition for condition in previous if condition["type"] not in OWN_CONDITIONS]
    for kind, (ok, reason, message) in wanted.items():
        status = "True" if ok else "False"
        old = by_type.get(kind)
        condition: dict[str, Any] = {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status else now(),
        }
        if not ok and reason:
            condition["reason"] = reason
            condition["message"] = message
        conditions.append(condition)
    return conditions


def pod_status(
    *,
    phase: str,
    conditions: list[dict[str, Any]],
    pod_ip: str,
    host_ip: str,
    start_time: str,
    init: Sequence[ContainerRecord],
    containers: Sequence[ContainerRecord],
    message: str = "",
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [record.status() for record in containers],
        "message": message or None,
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if init:
        status["initContainerStatuses"] = [record.status() for record in init]
    return status
