"""Placement: which process hosts each role, the ranks of every group, and the
weight-sync topology. One pure function of the trainer config, read by the
operator (the pods it creates and their env) and by the trainer (the groups it
forms and what each rank loads).

Vocabulary:
- a *role* is what the trainer computes: actor, critic, reference, reward (model),
  rollout (engine);
- a *group* is a role with pods of its own: a StatefulSet, and one rank per GPU of
  each pod (one per pod on CPU). Its ranks form one torch.distributed group.
  A group hosts its own role and every role colocated with it;
- the *weight sync* is the group over which every actor rank sends its shards of the new
  weights to every rank of a separate rollout group;
- an *engine* is one vLLM instance spanning `tensorParallelSize` consecutive ranks of the
  group hosting the rollout (the actor's when colocated): each rank holds a tensor-parallel
  slice of the weights, and the engines split the prompts data-parallel.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rlkube_api.config import TrainerConfig
from rlkube_api.layout import ParallelLayout
from rlkube_api.roles import RolePods, Roles, roles_with_pods


class Role(StrEnum):
    ACTOR = "actor"
    CRITIC = "critic"
    REFERENCE = "reference"
    REWARD = "reward"
    ROLLOUT = "rollout"


@dataclass(frozen=True)
class Group:
    """A role with pods of its own and the roles each of its ranks hosts."""

    pods: RolePods
    hosts: frozenset[Role]
    # How the group's ranks divide its model (roles colocated in it run in the same layout).
    layout: ParallelLayout | None = None

    @property
    def name(self) -> Role:
        return Role(self.pods.name)

    @property
    def world_size(self) -> int:
        return self.pods.world_size

    @property
    def procs_per_pod(self) -> int:
        return self.pods.procs_per_pod

    @property
    def uses_gpus(self) -> bool:
        return self.pods.gpus_per_replica > 0

    def pod_of(self, rank: int) -> int:
        return rank // self.procs_per_pod


@dataclass(frozen=True)
class WeightSync:
    """Separate rollout: actor rank a is rank a of this group (each sends its own shards of the
    weights), rollout rank r is (actor ranks) + r."""

    world_size: int
    # The first weight-sync rank of each group's ranks.
    rank_offsets: tuple[tuple[Role, int], ...]

    def rank_offset(self, role: Role) -> int | None:
        return dict(self.rank_offsets).get(role)

    def rank_of(self, role: Role, rank: int) -> int | None:
        """This process's rank in the weight-sync group, or None when it takes no part."""
        offset = self.rank_offset(role)
        if offset is None:
            return None
        return offset + rank


@dataclass(frozen=True)
class Engines:
    """The rollout engines over the ranks of the group that hosts the rollout: engine e spans
    ranks e*tp .. e*tp + tp - 1 (the order vLLM's external launcher forms tensor-parallel
    groups in, and, with tp dividing a pod's GPUs, the ranks of one pod)."""

    world_size: int
    tensor_parallel_size: int

    def __post_init__(self) -> None:
        if self.world_size % self.tensor_parallel_size:
            raise ValueError(
                f"tensorParallelSize {self.tensor_parallel_size} does not divide the "
                f"{self.world_size} ranks hosting the rollout"
            )

    @property
    def count(self) -> int:
        return self.world_size // self.tensor_parallel_size

    def engine_of(self, rank: int) -> int:
        return rank // self.tensor_parallel_size

    def tp_rank_of(self, rank: int) -> int:
        """The rank's place in its engine: which slice of the weights it holds."""
        return rank % self.tensor_parallel_size

    def ranks_of(self, engine: int) -> range:
        start = engine * self.tensor_parallel_size
        return range(start, start + self.tensor_parallel_size)


@dataclass(frozen=True)
class Placement:
    groups: tuple[Group, ...]
    weight_sync: WeightSync | None
    engines: Engines

    def group(self, name: Role) -> Group:
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(f"no group {name}")

    def host_of(self, role: Role) -> Group | None:
        """The group whose ranks run `role`, or None when the run does not use it."""
        return next((g for g in self.groups if role in g.hosts), None)

    @property
    def num_gpus(self) -> int:
        return sum(g.world_size for g in self.groups if g.uses_gpus)

    def in_one_process(self) -> Placement:
        """Every used role on one rank of the actor's group: `rlkube-trainer run --in-process`,
        tests and benchmarks (the rollout engine then lives beside the actor, as colocated)."""
        actor = self.group(Role.ACTOR)
        hosts = frozenset().union(*(g.hosts for g in self.groups))
        single = RolePods(Role.ACTOR, 1, min(actor.pods.gpus_per_replica, 1))
        return Placement((Group(single, hosts, ParallelLayout(1)),), None, Engines(1, 1))


def uses_reference(config: TrainerConfig) -> bool:
    return config.actor.use_kl_loss or config.algorithm.use_kl_in_reward


def used_roles(config: TrainerConfig) -> frozenset[Role]:
    """The roles a run computes: actor and rollout always; the rest when the algorithm needs them."""
    used = {Role.ACTOR, Role.ROLLOUT}
    if uses_reference(config):
        used.add(Role.REFERENCE)
    if config.roles.critic is not None:
        used.add(Role.CRITIC)
    if config.reward.model is not None:
        used.add(Role.REWARD)
    return frozenset(used)


def _colocated_with_actor(roles: Roles, role: Role) -> bool:
    if role == Role.ROLLOUT:
        return roles.rollout.placement == "colocated"
    spec = getattr(roles, role.value)
    # An undeclared reference or reward model runs beside the actor.
    return spec is None or spec.colocate_with == Role.ACTOR


def layout_of(roles: Roles, role: Role, pods: RolePods) -> ParallelLayout:
    """The layout of a group's ranks: a training role's declared sizes, or the rollout's engines
    (tensor parallel within an engine, data parallel across them)."""
    if role == Role.ROLLOUT:
        return ParallelLayout(pods.world_size, pods.procs_per_pod, tp=roles.rollout.tensor_parallel_size)
    spec = getattr(roles, role.value)
    return ParallelLayout(
        pods.world_size,
        pods.procs_per_pod,
        tp=spec.tensor_parallel_size,
        pp=spec.pipeline_parallel_size,
        sp=spec.ulysses_sequence_parallel_size,
        vpp=spec.virtual_pipeline_parallel_size,
    )


def placement_of(config: TrainerConfig) -> Placement:
    """The groups (the actor first, then every role with pods of its own, in the order the
    operator creates them) and the weight-sync group of a separate rollout."""
    used = used_roles(config)
    groups = []
    for pods in roles_with_pods(config.roles):
        role = Role(pods.name)
        hosts = {role}
        if role == Role.ACTOR:
            hosts |= {r for r in used if r != Role.ACTOR and _colocated_with_actor(config.roles, r)}
        groups.append(Group(pods, frozenset(hosts), layout_of(config.roles, role, pods)))
    weight_sync = None
    rollout = next((g for g in groups if g.name == Role.ROLLOUT), None)
    if rollout is not None:
        senders = groups[0].world_size  # the actor's ranks
        weight_sync = WeightSync(senders + rollout.world_size, ((Role.ACTOR, 0), (Role.ROLLOUT, senders)))
    host = next(g for g in groups if Role.ROLLOUT in g.hosts)
    engines = Engines(host.world_size, config.roles.rollout.tensor_parallel_size)
    return Placement(tuple(groups), weight_sync, engines)
