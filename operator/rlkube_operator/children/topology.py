"""Which roles get pods of their own, and how many processes each pod runs."""

from __future__ import annotations

from typing import Any

from rlkube_api.names import CONTROLLER_ROLE
from rlkube_api.rljob import RLJob
from rlkube_api.roles import RolePods, roles_with_pods

GPU_RESOURCE = "nvidia.com/gpu"


# The operator's name for a role with pods (the controller is one too).
PodRole = RolePods


def pod_roles(job: RLJob) -> list[PodRole]:
    """The controller first (the Ray head the others join), then the trainer's roles with pods."""
    spec = job.spec
    controller = PodRole(CONTROLLER_ROLE, 1, 0, spec.controller.pool, spec.controller.resources)
    return [controller, *roles_with_pods(spec.roles)]


def total_pods(job: RLJob) -> int:
    return sum(r.replicas for r in pod_roles(job))


def container_resources(role: PodRole) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if role.gpus_per_replica:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(role.gpus_per_replica)
    if role.resources is not None:
        if role.resources.cpu:
            requests["cpu"] = role.resources.cpu
        if role.resources.memory:
            requests["memory"] = limits["memory"] = role.resources.memory
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out
