"""RLJob specs that must be refused, shared by the pydantic tests and the API-server
tests so both are held to the same verdict. Each case mutates a valid job and
names the field the error message must mention."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
Job = dict[str, Any]


def example(name: str) -> Job:
    data: Job = yaml.safe_load((EXAMPLES / name).read_text())
    return data


def base_job() -> Job:
    return example("gpu-multipool.yaml")


@dataclass(frozen=True)
class Case:
    id: str
    mutate: Callable[[Job], None]
    # Substrings the error must contain: the field's path as the server reports it.
    fields: tuple[str, ...]

    def job(self) -> Job:
        job = copy.deepcopy(base_job())
        self.mutate(job)
        return job


def _set(path: str, value: Any) -> Callable[[Job], None]:
    def mutate(job: Job) -> None:
        *parents, leaf = path.split(".")
        node = job
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value

    return mutate


def _delete(path: str) -> Callable[[Job], None]:
    def mutate(job: Job) -> None:
        *parents, leaf = path.split(".")
        node = job
        for p in parents:
            node = node[p]
        del node[leaf]

    return mutate


def _all(*mutations: Callable[[Job], None]) -> Callable[[Job], None]:
    def mutate(job: Job) -> None:
        for m in mutations:
            m(job)

    return mutate


INVALID = [
    Case("replicas-zero", _set("spec.roles.actor.replicas", 0), ("spec.roles.actor.replicas",)),
    Case("actor-missing", _delete("spec.roles.actor"), ("spec.roles.actor",)),
    Case(
        "tp-does-not-divide-gpus",
        _set("spec.roles.rollout.tensorParallelSize", 3),
        ("spec.roles.rollout.tensorParallelSize",),
    ),
    Case(
        "colocated-tp-does-not-divide-actor-gpus",
        _all(
            _delete("spec.roles.rollout"),
            _set("spec.roles.rollout", {"placement": "colocated", "tensorParallelSize": 3}),
        ),
        ("spec.roles.rollout.tensorParallelSize",),
    ),
    Case("fsdp-does-not-fit", _set("spec.roles.actor.fsdpSize", 5), ("spec.roles.actor.fsdpSize",)),
    Case(
        "colocated-role-with-pool",
        _set("spec.roles.reference.pool", {"nodeSelector": {"a": "b"}}),
        ("spec.roles.reference.colocateWith",),
    ),
    Case(
        "colocated-role-with-gpus",
        _set("spec.roles.reference.gpusPerReplica", 1),
        ("spec.roles.reference.colocateWith",),
    ),
    Case("placement-unknown", _set("spec.roles.rollout.placement", "remote"), ("spec.roles.rollout.placement",)),
    Case(
        "colocated-rollout-with-pool",
        _set("spec.roles.rollout.placement", "colocated"),
        ("spec.roles.rollout.placement",),
    ),
    Case(
        "separate-rollout-without-gpus",
        _delete("spec.roles.rollout.gpusPerReplica"),
        ("spec.roles.rollout.gpusPerReplica",),
    ),
    Case("actor-without-gpus", _delete("spec.roles.actor.gpusPerReplica"), ("spec.roles.actor.gpusPerReplica",)),
    Case("name-too-long", _set("metadata.name", "a" * 42), ("metadata.name",)),
    Case("name-not-dns-label", _set("metadata.name", "9-grpo"), ("metadata.name",)),
    Case("adv-estimator-unknown", _set("spec.algorithm.advEstimator", "ppo2"), ("spec.algorithm.advEstimator",)),
    Case("grpo-needs-n-above-1", _set("spec.rollout.samplesPerPrompt", 1), ("spec.rollout.samplesPerPrompt",)),
    Case("gae-needs-critic", _set("spec.algorithm.advEstimator", "gae"), ("spec.roles", "critic")),
    Case("clip-ratio-c-at-most-1", _set("spec.actor.clipRatioC", 1.0), ("spec.actor.clipRatioC",)),
    Case("train-files-empty", _set("spec.data.trainFiles", []), ("spec.data.trainFiles",)),
    Case(
        "gpu-memory-utilization-above-1",
        _set("spec.rollout.gpuMemoryUtilization", 1.5),
        ("spec.rollout.gpuMemoryUtilization",),
    ),
    Case(
        "mini-batch-does-not-divide-batch",
        _set("spec.actor.ppoMiniBatchSize", 100),
        ("spec.actor.ppoMiniBatchSize",),
    ),
    Case(
        "reward-function-and-model",
        _set("spec.reward.model", {"path": "/models/rm"}),
        ("spec.reward", "at most one of reward.function and reward.model"),
    ),
    Case(
        "reward-function-path-and-configmap",
        _set("spec.reward.function.path", "/rewards/gsm8k.py"),
        ("spec.reward.function", "exactly one of path and configMap"),
    ),
    Case("image-missing", _delete("spec.image"), ("spec.image",)),
    Case("resume-unknown", _set("spec.checkpoint.resume", "latest"), ("spec.checkpoint.resume",)),
    Case("unknown-field", _set("spec.algorithm.advEstimatr", "grpo"), ("advEstimatr",)),
    Case(
        "env-sets-a-rendezvous-variable",
        _set("spec.env", [{"name": "MASTER_PORT", "value": "1234"}]),
        ("spec.env", "MASTER_PORT"),
    ),
    Case("kl-loss-type-unknown", _set("spec.actor.klLossType", "k4"), ("spec.actor.klLossType",)),
    Case(
        "volume-name-used-by-the-operator",
        _set("spec.volumes", [{"name": "config", "mountPath": "/x", "source": {"emptyDir": {}}}]),
        ("spec.volumes", "name", "used by the operator"),
    ),
    Case(
        "volume-names-repeat",
        _set(
            "spec.volumes",
            [
                {"name": "models", "mountPath": "/a", "source": {"emptyDir": {}}},
                {"name": "models", "mountPath": "/b", "source": {"emptyDir": {}}},
            ],
        ),
        ("spec.volumes", "volume names must be unique"),
    ),
    Case(
        "volume-mount-path-relative",
        _set("spec.volumes", [{"name": "models", "mountPath": "models", "source": {"emptyDir": {}}}]),
        ("spec.volumes", "mountPath"),
    ),
    Case("actor-strategy-unknown", _set("spec.actor.strategy", "zero3"), ("spec.actor.strategy",)),
]

# Changes refused on update: (id, mutation, field).
IMMUTABLE = [
    Case("model-path-changes", _set("spec.model.path", "/models/other"), ("spec.model",)),
    Case("actor-gpus-change", _set("spec.roles.actor.gpusPerReplica", 16), ("spec.roles.actor.gpusPerReplica",)),
    Case("actor-replicas-change", _set("spec.roles.actor.replicas", 4), ("spec.roles.actor.replicas",)),
    Case(
        "rollout-placement-changes",
        _set("spec.roles.rollout", {"placement": "colocated"}),
        ("spec.roles.rollout.placement", "placement is immutable"),
    ),
]
