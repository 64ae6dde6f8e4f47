"""Which roles get pods of their own, and how many processes each pod runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlkube_api.names import CONTROLLER_ROLE
from rlkube_api.rljob import RLJob
from rlkube_api.roles import Pool, Resources

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class PodRole:
    """A role that has a StatefulSet: its pods, GPUs and pool."""

    name: str
    replicas: int
    gpus_per_replica: int
    pool: Pool | None
    resources: Resources | None

    @property
    def procs_per_pod(self) -> int:
        """One worker per GPU; one per pod on CPU."""
        return max(self.gpus_per_replica, 1)

    @property
    def world_size(self) -> int:
        return self.replicas * self.procs_per_pod


def pod_roles(job: RLJob) -> list[PodRole]:
    """The controller first, then every role not colocated with the actor."""
    spec = job.spec
    roles = [PodRole(CONTROLLER_ROLE, 1, 0, spec.controller.pool, spec.controller.resources)]
    actor = spec.roles.actor
    roles.append(PodRole("actor", actor.replicas, actor.gpus_per_replica or 0, actor.pool, actor.resources))
    for name in ("critic", "reference", "reward"):
        role = getattr(spec.roles, name)
        if role is not None and role.colocate_with is None:
            roles.append(PodRole(name, role.replicas, role.gpus_per_replica or 0, role.pool, role.resources))
    rollout = spec.roles.rollout
    if rollout.placement == "separate":
        roles.append(
            PodRole("rollout", rollout.replicas, rollout.gpus_per_replica or 0, rollout.pool, rollout.resources)
        )
    return roles


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
