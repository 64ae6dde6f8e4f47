"""Per-role resources: replicas, GPUs, node pool, parallelism and placement.

The trainer reads replicas/GPUs/parallelism to shape its worker groups; the
operator also reads the pool to place each role's pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.kube_syntax import (
    LABEL_KEY_MAX,
    LABEL_VALUE_MAX,
    LABEL_VALUE_PATTERN,
    LabelValue,
    cel_is_label_key,
    cel_is_positive_quantity,
)
from rlkube_api.pod_template import PodTemplate

# Roles that can run in pods of their own or inside the actor's workers.
COLOCATABLE_ROLES = ("critic", "reference", "reward")
ALL_ROLES = ("actor", "critic", "reference", "reward", "rollout")

_GPUS_IMMUTABLE = CelRule(
    "has(self.gpusPerReplica) == has(oldSelf.gpusPerReplica)"
    " && (!has(self.gpusPerReplica) || self.gpusPerReplica == oldSelf.gpusPerReplica)",
    "gpusPerReplica is immutable",
    ".gpusPerReplica",
    transition=True,
)

# A running gang's ranks all share one world size; resizing needs a new job.
_REPLICAS_IMMUTABLE = CelRule(
    "self.replicas == oldSelf.replicas",
    "replicas is immutable (every rank of a running gang shares one world size)",
    ".replicas",
    transition=True,
)

_NO_PODS_NO_TEMPLATE = "a role inside the actor's workers has no pods: set the actor's podTemplate"

_WORLD_SIZE = "(self.replicas * (has(self.gpusPerReplica) && self.gpusPerReplica > 0 ? self.gpusPerReplica : 1))"
# The ranks one model replica spans (tensor × pipeline × sequence parallel); the world size over
# it is the data-parallel factor FSDP2 shards over.
_ACTOR_WORLD_SIZE = "(self.actor.replicas * (has(self.actor.gpusPerReplica) && self.actor.gpusPerReplica > 0 ? self.actor.gpusPerReplica : 1))"
_MODEL_PARALLEL = "(self.tensorParallelSize * self.pipelineParallelSize * self.ulyssesSequenceParallelSize)"
_MODEL_PARALLEL_FIELDS = (
    "tensorParallelSize",
    "pipelineParallelSize",
    "virtualPipelineParallelSize",
    "ulyssesSequenceParallelSize",
)


def _model_parallel_rules(guard: str) -> tuple[CelRule, ...]:
    """Admission of a training role's layout; `guard` is true where the role has pods of its own."""
    return (
        CelRule(
            f"{guard}{_WORLD_SIZE} % {_MODEL_PARALLEL} == 0",
            "tensorParallelSize × pipelineParallelSize × ulyssesSequenceParallelSize must divide replicas × "
            "gpusPerReplica (the role's world size; one rank per pod without GPUs)",
            ".tensorParallelSize",
        ),
        # A tensor-parallel group exchanges activations at every layer: it stays on one node's
        # GPUs. Without GPUs each pod is one rank, and tensor-parallel groups span pods.
        CelRule(
            f"{guard}!has(self.gpusPerReplica) || self.gpusPerReplica == 0"
            " || self.gpusPerReplica % self.tensorParallelSize == 0",
            "tensorParallelSize must divide gpusPerReplica (a tensor-parallel group stays inside one pod, "
            "so on one node)",
            ".tensorParallelSize",
        ),
        CelRule(
            "!has(self.virtualPipelineParallelSize) || self.pipelineParallelSize > 1",
            "virtualPipelineParallelSize needs pipelineParallelSize above 1 (it divides each stage's layers "
            "into interleaved chunks)",
            ".virtualPipelineParallelSize",
        ),
        CelRule(
            f"{guard}!has(self.fsdpSize) || ({_WORLD_SIZE} / {_MODEL_PARALLEL}) % self.fsdpSize == 0",
            "fsdpSize must divide the data-parallel ranks: replicas × gpusPerReplica / (tensorParallelSize × "
            "pipelineParallelSize × ulyssesSequenceParallelSize)",
            ".fsdpSize",
        ),
        *(
            CelRule(
                f"has(self.{name}) == has(oldSelf.{name}) && (!has(self.{name}) || self.{name} == oldSelf.{name})",
                f"{name} is immutable (every rank of a running gang holds its slice of the model)",
                f".{name}",
                transition=True,
            )
            for name in _MODEL_PARALLEL_FIELDS
        ),
    )


class Toleration(ApiModel):
    """A Kubernetes toleration."""

    # Kubernetes' own toleration rules (core/validation: ValidateTolerations), so that a
    # mistake is refused at apply and not when the StatefulSet creates pods.
    cel_rules = (
        CelRule(
            f"!has(self.key) || self.key == '' || {cel_is_label_key('self.key')}",
            "key must be a label key (an optional DNS subdomain and '/', then at most 63 characters: "
            "alphanumeric at both ends, '-', '_', '.' inside)",
            ".key",
        ),
        CelRule(
            "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
            "operator must be Exists when key is empty (it then matches every taint)",
            ".operator",
        ),
        CelRule(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "value must be empty when operator is Exists",
            ".value",
        ),
        CelRule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds is only allowed with effect NoExecute",
            ".tolerationSeconds",
        ),
    )

    key: str | None = Field(None, max_length=LABEL_KEY_MAX, description="Taint key (a label key).")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal (the default).")
    value: str | None = Field(
        None, max_length=LABEL_VALUE_MAX, pattern=LABEL_VALUE_PATTERN, description="Taint value (a label value)."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(None, description="Effect.")
    toleration_seconds: int | None = Field(None, description="NoExecute: seconds to stay.")


class Pool(ApiModel):
    """The node pool a role's pods go to."""

    cel_rules = (
        CelRule(
            f"!has(self.nodeSelector) || self.nodeSelector.all(k, {cel_is_label_key('k')})",
            "nodeSelector keys must be label keys (an optional DNS subdomain and '/', then at most 63 "
            "characters: alphanumeric at both ends, '-', '_', '.' inside)",
            ".nodeSelector",
        ),
    )

    node_selector: dict[str, LabelValue] | None = Field(
        None, max_length=64, description="Node labels the pods require (values are label values)."
    )
    tolerations: list[Toleration] | None = Field(None, max_length=64, description="Taints the pods tolerate.")
    affinity: dict[str, Any] | None = Field(None, description="A Kubernetes affinity, copied to the pods.")


class Resources(ApiModel):
    """CPU and memory per pod (requests; memory is also the limit)."""

    cel_rules = (
        CelRule(
            f"!has(self.cpu) || {cel_is_positive_quantity('self.cpu')}",
            "cpu must be a positive Kubernetes quantity, e.g. '8' or '500m'",
            ".cpu",
        ),
        CelRule(
            f"!has(self.memory) || {cel_is_positive_quantity('self.memory')}",
            "memory must be a positive Kubernetes quantity, e.g. '64Gi' or '500M' (not '64GB')",
            ".memory",
        ),
    )

    cpu: str | None = Field(None, max_length=32, description="CPU request, e.g. '8' or '500m'.")
    memory: str | None = Field(None, max_length=32, description="Memory request and limit, e.g. '64Gi'.")


class _PodRole(ApiModel):
    """Fields every role with pods of its own has."""

    replicas: int = Field(1, ge=1, le=4096, description="Pods of this role.")
    gpus_per_replica: int | None = Field(
        None, ge=0, le=64, description="nvidia.com/gpu per pod (0 on CPU); one worker per GPU."
    )
    pool: Pool | None = Field(None, description="Node pool: nodeSelector, tolerations, affinity.")
    resources: Resources | None = Field(None, description="CPU and memory per pod.")
    pod_template: PodTemplate | None = Field(None, description="Additions to this role's pods, over the job's.")


class _ModelParallel(ApiModel):
    """How a training role's ranks divide one model besides FSDP2's data-parallel sharding:
    tensor parallel (each layer's weights split across ranks), pipeline parallel (consecutive
    layers on consecutive stages) and Ulysses sequence parallel (each sequence split across
    ranks, attention heads exchanged). The remaining factor of the role's world size is the data-
    parallel dimension FSDP2 shards over; all of them form one device mesh."""

    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="Ranks each layer's weights are split over (tensor parallel)."
    )
    pipeline_parallel_size: int = Field(
        1, ge=1, le=64, description="Pipeline stages the model's layers are divided into."
    )
    virtual_pipeline_parallel_size: int | None = Field(
        None, ge=1, le=64, description="Model chunks per pipeline stage (interleaved schedule)."
    )
    ulysses_sequence_parallel_size: int = Field(
        1, ge=1, le=64, description="Ranks each sequence is split over (Ulysses sequence parallel)."
    )


class ActorRoleSpec(_PodRole, _ModelParallel):
    """The actor: the policy being trained."""

    cel_rules = (
        CelRule(
            "has(self.gpusPerReplica)",
            "gpusPerReplica is required (0 for CPU)",
            ".gpusPerReplica",
            "FieldValueRequired",
        ),
        *_model_parallel_rules(""),
        _GPUS_IMMUTABLE,
        _REPLICAS_IMMUTABLE,
    )

    fsdp_size: int | None = Field(
        None, ge=1, description="Ranks each parameter is sharded over (default: the whole role)."
    )


class RoleSpec(_PodRole, _ModelParallel):
    """Critic, reference or reward: pods of their own, or colocated with the actor."""

    cel_rules = (
        CelRule(
            "!has(self.colocateWith) || (!has(self.pool) && !has(self.gpusPerReplica))",
            "a role colocated with another declares no pool or gpusPerReplica of its own",
            ".colocateWith",
        ),
        CelRule(
            "has(self.colocateWith) || has(self.gpusPerReplica)",
            "gpusPerReplica is required (0 for CPU) unless colocateWith is set",
            ".gpusPerReplica",
            "FieldValueRequired",
        ),
        *_model_parallel_rules("has(self.colocateWith) || "),
        _GPUS_IMMUTABLE,
        _REPLICAS_IMMUTABLE,
        CelRule("!has(self.colocateWith) || !has(self.podTemplate)", _NO_PODS_NO_TEMPLATE, ".podTemplate"),
        # A colocated role runs in the actor's workers: its own sizes would be ignored in silence.
        CelRule(
            "!has(self.colocateWith) || !has(self.resources)",
            "a role colocated with another has no pods: resources has no effect (set the actor's)",
            ".resources",
        ),
        CelRule(
            "!has(self.colocateWith) || !has(self.fsdpSize)",
            "a role colocated with another is sharded like its host: fsdpSize has no effect",
            ".fsdpSize",
        ),
        CelRule(
            "!has(self.colocateWith) || self.replicas == 1",
            "a role colocated with another has no pods: replicas has no effect",
            ".replicas",
        ),
    )

    colocate_with: Literal["actor"] | None = Field(
        None, description="Run inside the actor's workers instead of pods of its own."
    )
    fsdp_size: int | None = Field(None, ge=1, description="Ranks each parameter is sharded over.")


class RolloutRoleSpec(_PodRole):
    """vLLM rollout: inside the actor (colocated) or on pods of its own (separate)."""

    cel_rules = (
        CelRule(
            "self.placement == 'separate' || (!has(self.pool) && !has(self.gpusPerReplica))",
            "colocated rollout uses the actor's pods: it declares no pool or gpusPerReplica",
            ".placement",
        ),
        CelRule(
            "self.placement == 'colocated' || has(self.gpusPerReplica)",
            "gpusPerReplica is required (0 for CPU) when placement is separate",
            ".gpusPerReplica",
            "FieldValueRequired",
        ),
        CelRule(
            "!has(self.gpusPerReplica) || (self.gpusPerReplica == 0 ? self.replicas % self.tensorParallelSize == 0"
            " : self.gpusPerReplica % self.tensorParallelSize == 0)",
            "tensorParallelSize must divide gpusPerReplica (without GPUs: replicas, one process per pod)",
            ".tensorParallelSize",
        ),
        _GPUS_IMMUTABLE,
        # Elastic rollout capacity: separate rollout pods are scaled in place, each
        # engine on one pod's process; an engine spanning ranks has a fixed world size.
        CelRule(
            "self.replicas == oldSelf.replicas || self.tensorParallelSize == 1",
            "replicas may change while the job runs only with tensorParallelSize 1 (each rollout engine one "
            "process; an engine spanning ranks has a fixed world size)",
            ".replicas",
            transition=True,
        ),
        CelRule("self.placement == oldSelf.placement", "placement is immutable", ".placement", transition=True),
        CelRule(
            "self.tensorParallelSize == oldSelf.tensorParallelSize",
            "tensorParallelSize is immutable",
            ".tensorParallelSize",
            transition=True,
        ),
        CelRule("self.placement == 'separate' || !has(self.podTemplate)", _NO_PODS_NO_TEMPLATE, ".podTemplate"),
        # A colocated rollout runs in the actor's workers, one engine per tensorParallelSize of them.
        CelRule(
            "self.placement == 'separate' || !has(self.resources)",
            "colocated rollout has no pods: resources has no effect (set the actor's)",
            ".resources",
        ),
        CelRule(
            "self.placement == 'separate' || self.replicas == 1",
            "colocated rollout has no pods: replicas has no effect (its engines follow the actor's ranks)",
            ".replicas",
        ),
    )

    placement: Literal["colocated", "separate"] = Field(
        "colocated", description="colocated (hybrid engine in the actor's workers) or separate (own pods)."
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="GPUs (processes) per vLLM engine: each engine spans this many consecutive ranks of the "
        "group hosting the rollout, and each rank loads only its slice of the weights.",
    )


class Roles(ApiModel):
    """The worker groups of the job. actor is required."""

    cel_rules = (
        CelRule(
            "self.rollout.placement != 'colocated' || !has(self.actor.gpusPerReplica)"
            " || (self.actor.gpusPerReplica == 0"
            " ? self.actor.replicas % self.rollout.tensorParallelSize == 0"
            " : self.actor.gpusPerReplica % self.rollout.tensorParallelSize == 0)",
            "colocated rollout: tensorParallelSize must divide the actor's gpusPerReplica (without GPUs: its replicas)",
            ".rollout.tensorParallelSize",
        ),
        CelRule(
            # The trainer loads the reward model whole on each rank; a size to shard it by would be ignored.
            "!has(self.reward) || !has(self.reward.fsdpSize)",
            "the reward model is not sharded: roles.reward.fsdpSize has no effect",
            ".reward.fsdpSize",
        ),
        *(
            CelRule(
                f"!has(self.reward) || self.reward.{name} == 1",
                f"the reward model is loaded whole on each rank: roles.reward.{name} has no effect",
                f".reward.{name}",
            )
            for name in ("tensorParallelSize", "pipelineParallelSize", "ulyssesSequenceParallelSize")
        ),
        CelRule(
            "!has(self.reward) || !has(self.reward.virtualPipelineParallelSize)",
            "the reward model is loaded whole on each rank: roles.reward.virtualPipelineParallelSize has no effect",
            ".reward.virtualPipelineParallelSize",
        ),
        # A role colocated with the actor runs on the actor's ranks, in a layout of its own.
        *(
            CelRule(
                f"!has(self.{role}) || !has(self.{role}.colocateWith) || {_ACTOR_WORLD_SIZE} % "
                f"(self.{role}.tensorParallelSize * self.{role}.pipelineParallelSize"
                f" * self.{role}.ulyssesSequenceParallelSize) == 0",
                "a role colocated with the actor runs on the actor's ranks: tensorParallelSize × "
                "pipelineParallelSize × ulyssesSequenceParallelSize must divide the actor's world size",
                f".{role}.tensorParallelSize",
            )
            for role in ("critic", "reference")
        ),
        CelRule(
            "!has(self.reference) || self.reference.pipelineParallelSize == 1",
            "the reference runs without pipeline stages: roles.reference.pipelineParallelSize must be 1",
            ".reference.pipelineParallelSize",
        ),
    )

    actor: ActorRoleSpec = Field(description="The policy.")
    critic: RoleSpec | None = Field(None, description="The value model (required for gae).")
    reference: RoleSpec | None = Field(
        None, description="The frozen reference policy for KL (default: colocated with the actor when KL is used)."
    )
    reward: RoleSpec | None = Field(None, description="The reward model, when reward.model is set.")
    rollout: RolloutRoleSpec = Field(
        default_factory=RolloutRoleSpec, description="Generation: placement and resources."
    )


@dataclass(frozen=True)
class RolePods:
    """A role with pods of its own: the operator gives it a StatefulSet, the trainer's
    driver places one worker per process on those pods. One definition for both."""

    name: str
    replicas: int
    gpus_per_replica: int
    pool: Pool | None = None
    resources: Resources | None = None

    @property
    def procs_per_pod(self) -> int:
        """One worker per GPU; one per pod on CPU."""
        return max(self.gpus_per_replica, 1)

    @property
    def world_size(self) -> int:
        return self.replicas * self.procs_per_pod


def roles_with_pods(roles: Roles) -> list[RolePods]:
    """The actor, then every role not colocated with it (critic, reference, reward,
    a separate rollout), in that order."""
    actor = roles.actor
    out = [RolePods("actor", actor.replicas, actor.gpus_per_replica or 0, actor.pool, actor.resources)]
    for name in COLOCATABLE_ROLES:
        role = getattr(roles, name)
        if role is not None and role.colocate_with is None:
            out.append(RolePods(name, role.replicas, role.gpus_per_replica or 0, role.pool, role.resources))
    rollout = roles.rollout
    if rollout.placement == "separate":
        out.append(
            RolePods("rollout", rollout.replicas, rollout.gpus_per_replica or 0, rollout.pool, rollout.resources)
        )
    return out
