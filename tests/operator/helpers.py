"""Shared builders for the operator's pure-function tests: RLJobs from the examples
(with mutations applied to the wire dict), Kubernetes pod dicts as the API server
returns them, and fixed points in time."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from rlkube_api.names import ANNOTATION_ATTEMPT, ANNOTATION_PROGRESS, LABEL_JOB, LABEL_POD_INDEX, LABEL_ROLE
from rlkube_api.rljob import RLJob
from rlkube_api.validation import parse_rljob
from rlkube_operator.children.topology import pod_roles
from rlkube_operator.desired import desired_children

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GPU = "gpu-multipool.yaml"
CPU = "tiny-cpu.yaml"
NAMESPACE = "ml"
UID = "5f0e7d52-2b1c-4c1e-9d0a-3f6f2f5d9a11"
RAY_TOKEN = "test-ray-token"
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)

Obj = dict[str, Any]
Mutation = Callable[[Obj], None]


def at(seconds: float) -> datetime:
    """T0 plus `seconds`."""
    return T0 + timedelta(seconds=seconds)


def iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def example(name: str) -> Obj:
    data: Obj = yaml.safe_load((EXAMPLES / name).read_text())
    return data


def set_path(path: str, value: Any) -> Mutation:
    """Sets a dotted path of the wire dict (creating parents), e.g. 'spec.runPolicy.gang'."""

    def mutate(obj: Obj) -> None:
        *parents, leaf = path.split(".")
        node = obj
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = copy.deepcopy(value)

    return mutate


# Parsing evaluates the CEL rules in Python (tens of ms each time), so jobs and their
# children are built once per session. Both are shared: never mutate them (model_copy).
_JOBS: dict[tuple[Any, ...], RLJob] = {}
_CHILDREN: dict[tuple[int, int, bool], tuple[RLJob, list[Obj]]] = {}


def load_job(name: str, *mutations: Mutation, generation: int = 1, namespace: str | None = NAMESPACE) -> RLJob:
    """An example RLJob as the API server would hand it over (namespace, uid, generation set)."""
    key = (name, mutations, generation, namespace)
    if key not in _JOBS:
        obj = example(name)
        meta = obj["metadata"]
        meta.update(uid=UID, generation=generation)
        if namespace is not None:
            meta["namespace"] = namespace
        for mutate in mutations:
            mutate(obj)
        _JOBS[key] = parse_rljob(obj)
    return _JOBS[key]


def children_of(job: RLJob, *, attempt: int = 0, pods_wanted: bool = True) -> list[Obj]:
    """desired_children(job, UID, attempt, pods_wanted), computed once per job object."""
    key = (id(job), attempt, pods_wanted)
    cached = _CHILDREN.get(key)
    if cached is None or cached[0] is not job:
        cached = (job, desired_children(job, UID, attempt, pods_wanted, RAY_TOKEN))
        _CHILDREN[key] = cached  # holds the job, so its id is not reused
    return cached[1]


def pod(
    job: str,
    role: str,
    index: int = 0,
    *,
    attempt: int = 0,
    phase: str = "Running",
    ready: bool = True,
    created: datetime = T0,
    unschedulable: str | None = None,
    waiting: tuple[str, str] | None = None,
    terminated: tuple[int, str] | None = None,
    last_terminated: tuple[int, str] | None = None,
    restarts: int = 0,
    progress: dict[str, Any] | str | None = None,
    deleting: bool = False,
) -> Obj:
    """A pod of a job's StatefulSet as the API server returns it."""
    annotations = {ANNOTATION_ATTEMPT: str(attempt)}
    if progress is not None:
        annotations[ANNOTATION_PROGRESS] = progress if isinstance(progress, str) else json.dumps(progress)
    meta: Obj = {
        "name": f"{job}-{role}-{index}",
        # A recreated pod (another attempt or creation time) is another object.
        "uid": f"uid-{job}-{role}-{index}-{attempt}-{iso(created)}",
        "namespace": NAMESPACE,
        "labels": {LABEL_JOB: job, LABEL_ROLE: role, LABEL_POD_INDEX: str(index)},
        "annotations": annotations,
        "creationTimestamp": iso(created),
    }
    if deleting:
        meta["deletionTimestamp"] = iso(created + timedelta(seconds=1))
    if unschedulable is not None:
        scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        return {
            "metadata": meta,
            "status": {"phase": "Pending", "conditions": [scheduled]},
        }
    if terminated is not None:
        state: Obj = {"terminated": {"exitCode": terminated[0], "reason": terminated[1]}}
    elif waiting is not None:
        state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    elif phase == "Running":
        state = {"running": {"startedAt": iso(created)}}
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    container: Obj = {"name": "trainer", "ready": ready, "restartCount": restarts, "state": state}
    if last_terminated is not None:
        container["lastState"] = {"terminated": {"exitCode": last_terminated[0], "reason": last_terminated[1]}}
    conditions = [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True" if ready else "False"},
    ]
    return {
        "metadata": meta,
        "status": {"phase": phase, "conditions": conditions, "containerStatuses": [container]},
    }


def gang_pods(job: RLJob, *, attempt: int = 0, ready: bool = True, created: datetime = T0) -> list[Obj]:
    """One healthy pod per replica of every role with pods of its own (controller included)."""
    name = job.metadata.name or ""
    return [
        pod(name, role.name, i, attempt=attempt, ready=ready, created=created, phase="Running" if ready else "Pending")
        for role in pod_roles(job)
        for i in range(role.replicas)
    ]


def replace_pod(pods: list[Obj], new: Obj) -> list[Obj]:
    """`pods` with the one of the same name swapped for `new`."""
    name = new["metadata"]["name"]
    assert any(p["metadata"]["name"] == name for p in pods), name
    return [new if p["metadata"]["name"] == name else p for p in pods]
