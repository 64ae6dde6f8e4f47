"""The environment that lets a role's pods find each other: the role group's
torch.distributed rendezvous (MASTER_ADDR/PORT, WORLD_SIZE, and torchrun's node
rank and processes per node), the Ray head in the controller pod, and the
actor → rollout weight-sync group, all from `rlkube_api.placement`."""

from __future__ import annotations

from typing import Any

from rlkube_api.names import (
    CONTROLLER_ROLE,
    LABEL_POD_INDEX,
    RAY_PORT,
    RENDEZVOUS_PORT,
    WEIGHT_SYNC_PORT,
    Env,
    pod_dns_name,
)
from rlkube_api.placement import Role, placement_of
from rlkube_api.rljob import RLJob
from rlkube_operator.children.topology import PodRole

EnvList = list[dict[str, Any]]


def _value(name: str, value: str | int) -> dict[str, Any]:
    return {"name": name, "value": str(value)}


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def rendezvous_env(job: RLJob, role: PodRole, attempt: int) -> EnvList:
    namespace = job.metadata.namespace or "default"
    name = job.metadata.name or ""
    master = pod_dns_name(name, role.name, 0, namespace)
    pod_index = f"metadata.labels['{LABEL_POD_INDEX}']"
    env = [
        _value(Env.JOB_NAME, name),
        _field(Env.NAMESPACE, "metadata.namespace"),
        _value(Env.ROLE, role.name),
        _field(Env.POD_NAME, "metadata.name"),
        _field(Env.POD_UID, "metadata.uid"),
        _field(Env.POD_IP, "status.podIP"),
        _value(Env.ATTEMPT, attempt),
        _value(Env.RAY_ADDRESS, f"{pod_dns_name(name, CONTROLLER_ROLE, 0, namespace)}:{RAY_PORT}"),
        _value(Env.MASTER_ADDR, master),
        _value(Env.MASTER_PORT, RENDEZVOUS_PORT),
        _value(Env.WORLD_SIZE, role.world_size),
        _field(Env.PET_NODE_RANK, pod_index),
        _value(Env.PET_NPROC_PER_NODE, role.procs_per_pod),
    ]
    if job.metadata.uid:
        env.append(_value(Env.JOB_UID, job.metadata.uid))
    return env + weight_sync_env(job, role.name)


def weight_sync_env(job: RLJob, role: str) -> EnvList:
    """Separate rollout: where the weight-sync group meets, its size, and the first rank of
    this pod's group in it (placement decides all three). Every pod learns the address, so
    the driver can tell workers where it is."""
    sync = placement_of(job.spec).weight_sync
    if sync is None:
        return []
    namespace = job.metadata.namespace or "default"
    env = [
        _value(Env.WEIGHT_SYNC_ADDR, pod_dns_name(job.metadata.name or "", Role.ACTOR, 0, namespace)),
        _value(Env.WEIGHT_SYNC_PORT, WEIGHT_SYNC_PORT),
        _value(Env.WEIGHT_SYNC_WORLD_SIZE, sync.world_size),
    ]
    offset = sync.rank_offset(Role(role)) if role in tuple(Role) else None
    if offset is not None:
        env.append(_value(Env.WEIGHT_SYNC_RANK_OFFSET, offset))
    return env
