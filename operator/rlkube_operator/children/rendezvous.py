"""The environment that lets a role's pods find each other: the role group's
torch.distributed rendezvous (PyTorchJob's names and torchrun's PET_*), the Ray
head in the controller pod, and the actor → rollout weight-sync group."""

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
from rlkube_api.rljob import RLJob
from rlkube_operator.children.topology import PodRole, pod_roles

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
        _field(Env.POD_IP, "status.podIP"),
        _value(Env.ATTEMPT, attempt),
        _value(Env.RAY_ADDRESS, f"{pod_dns_name(name, CONTROLLER_ROLE, 0, namespace)}:{RAY_PORT}"),
        _value(Env.MASTER_ADDR, master),
        _value(Env.MASTER_PORT, RENDEZVOUS_PORT),
        _value(Env.WORLD_SIZE, role.world_size),
        _field(Env.RANK, pod_index),
        _value(Env.PET_MASTER_ADDR, master),
        _value(Env.PET_MASTER_PORT, RENDEZVOUS_PORT),
        _value(Env.PET_NNODES, role.replicas),
        _field(Env.PET_NODE_RANK, pod_index),
        _value(Env.PET_NPROC_PER_NODE, role.procs_per_pod),
    ]
    return env + weight_sync_env(job, role.name)


def weight_sync_env(job: RLJob, role: str) -> EnvList:
    """Actor rank 0 broadcasts to every rollout worker; rollout ranks start at 1.
    Every pod gets the group's address so the driver can tell workers where it is."""
    rollout = next((r for r in pod_roles(job) if r.name == "rollout"), None)
    if rollout is None:
        return []
    namespace = job.metadata.namespace or "default"
    offsets = {"actor": 0, "rollout": 1}
    env = [
        _value(Env.WEIGHT_SYNC_ADDR, pod_dns_name(job.metadata.name or "", "actor", 0, namespace)),
        _value(Env.WEIGHT_SYNC_PORT, WEIGHT_SYNC_PORT),
        _value(Env.WEIGHT_SYNC_WORLD_SIZE, 1 + rollout.world_size),
    ]
    if role in offsets:
        env.append(_value(Env.WEIGHT_SYNC_RANK_OFFSET, offsets[role]))
    return env
