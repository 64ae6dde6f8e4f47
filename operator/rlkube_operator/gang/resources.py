"""What a whole gang asks for (PodGroups' minResources) and the PodGroup object around it."""

from __future__ import annotations

import math
from typing import Any

from rlkube_api.rljob import RLJob
from rlkube_operator.children.labels import job_labels
from rlkube_operator.children.topology import container_resources, pod_roles, total_pods


def _parse_quantity(value: str) -> float:
    suffixes = {
        "m": 1e-3,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "Pi": 2**50,
        "Ei": 2**60,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "P": 1e15,
        "E": 1e18,
    }
    for suffix in sorted(suffixes, key=len, reverse=True):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * suffixes[suffix]
    return float(value)


def _format(name: str, amount: float) -> str:
    if name == "cpu":
        return f"{round(amount * 1000)}m" if amount % 1 else str(int(amount))
    if name == "memory":
        # Rounded up: a gang's minimum must never be below what its pods request.
        return f"{math.ceil(amount / 2**20)}Mi" if amount % 2**30 else f"{int(amount / 2**30)}Gi"
    return str(int(amount))


def gang_requests(job: RLJob) -> dict[str, str]:
    """The sum of every pod's requests."""
    totals: dict[str, float] = {}
    for role in pod_roles(job):
        for name, value in container_resources(role).get("requests", {}).items():
            totals[name] = totals.get(name, 0.0) + _parse_quantity(value) * role.replicas
    return {name: _format(name, amount) for name, amount in sorted(totals.items())}


def pod_group(job: RLJob, api_version: str, **spec: Any) -> dict[str, Any]:
    """A PodGroup named after the job for the whole gang: every pod is needed (minMember) and
    the gang's summed requests (minResources), plus the scheduler's own fields."""
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": {"name": job.metadata.name, "namespace": job.metadata.namespace, "labels": job_labels(job)},
        "spec": {"minMember": total_pods(job), "minResources": gang_requests(job), **spec},
    }
