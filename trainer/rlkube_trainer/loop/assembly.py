"""A run's rank groups and the roles the loop calls over them. The placement
(rlkube_api.placement) says which groups there are and which roles each hosts; a `Launch`
starts a group's ranks (Ray actors, or objects in this process) and returns its handle; the
roles over them (cluster/dispatch.py) are what PPOTrainer.step calls.
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Callable
from typing import Any

from rlkube_api.config import TrainerConfig
from rlkube_api.placement import Group, Placement, Role
from rlkube_trainer.cluster.dispatch import (
    ColocatedRollout,
    DataParallelActor,
    DataParallelCritic,
    DataParallelReference,
    DataParallelRewardModel,
    SeparateRollout,
)
from rlkube_trainer.cluster.elastic_rollout import ElasticRollout, Fleet
from rlkube_trainer.cluster.rank_group import LocalRankGroup, RankGroup
from rlkube_trainer.loop.roles import Roles, Rollout
from rlkube_trainer.model.fsdp import Rendezvous
from rlkube_trainer.workers.rank import Rank, RankSpec

log = logging.getLogger("rlkube.trainer")

# Starts a group's ranks (already described by their specs) and returns its handle.
Launch = Callable[[Group, list[RankSpec], dict[str, Any]], RankGroup]
# Where elastic rollout engines come from: the rollout group, a rank's spec, the config.
FleetOf = Callable[[Group, Callable[[int], RankSpec], dict[str, Any]], Fleet]
Groups = dict[Role, RankGroup]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_specs(placement: Placement, group: Group, total_steps: int) -> list[RankSpec]:
    """What each rank of `group` is told. The rendezvous given here is the local fallback;
    in pods the operator's env (from the same placement) names the real address."""
    port = free_port()
    sync = placement.weight_sync
    return [
        RankSpec(
            group=group.name,
            rank=rank,
            rendezvous=Rendezvous("127.0.0.1", port, group.world_size, rank),
            hosts=group.hosts,
            total_steps=total_steps,
            weight_sync_rank=sync.rank_of(group.name, rank) if sync else None,
            weight_sync_world_size=sync.world_size if sync else 0,
            tensor_parallel_size=placement.engines.tensor_parallel_size if Role.ROLLOUT in group.hosts else 1,
        )
        for rank in range(group.world_size)
    ]


def engine_spec(placement: Placement, total_steps: int, rank: int) -> RankSpec:
    """A rollout engine that joins while the job runs (elastic rollout): a rank of its own,
    numbered in the weight-sync group by the driver when it joins."""
    group = placement.group(Role.ROLLOUT)
    return RankSpec(
        group=group.name,
        rank=rank,
        rendezvous=Rendezvous("127.0.0.1", 0, 1, 0),
        hosts=group.hosts,
        total_steps=total_steps,
        tensor_parallel_size=placement.engines.tensor_parallel_size,
    )


def training_sample_multiple(placement: Placement, groups: Groups) -> int:
    """What a batch's sample count must be a multiple of for each group that splits it over its
    ranks (actor, critic, reference) to give every rank an equal share: a rank with more
    samples would run more mini- or micro-batches, and wait in a collective the others never
    enter. Batches of whole prompts are multiples by the batch rules; a sampler that drops
    samples (rollout.harness) keeps to it."""
    sizes = [len(groups[g.name]) for g in placement.groups if g.hosts & {Role.ACTOR, Role.CRITIC, Role.REFERENCE}]
    return math.lcm(*sizes) if sizes else 1


def launch_local(group: Group, specs: list[RankSpec], config: dict[str, Any]) -> RankGroup:
    """The group's ranks as objects in this process."""
    return LocalRankGroup(group.name, [Rank(config, spec) for spec in specs])


def start_groups(config: TrainerConfig, placement: Placement, launch: Launch, total_steps: int) -> Groups:
    config_dict = config.model_dump(mode="json")
    groups = {g.name: launch(g, rank_specs(placement, g, total_steps), config_dict) for g in placement.groups}
    # Ranks of a group must start together: their process group forms across them.
    pending = {role: group.submit("setup", [()] * len(group)) for role, group in groups.items()}
    for role, started in pending.items():
        for where in groups[role].wait(started):
            log.info("ready: %s", where)
    return groups


def build_roles(
    config: TrainerConfig,
    placement: Placement,
    groups: Groups,
    function_reward: Any,
    fleet: Callable[[], Fleet] | None = None,
) -> Roles:
    """The roles the loop calls, each over the group placement puts it on. With `fleet`, a
    separate rollout of one-process engines is elastic (elastic_rollout.py)."""

    def host(role: Role) -> RankGroup | None:
        group = placement.host_of(role)
        return groups[group.name] if group is not None else None

    actor = groups[Role.ACTOR]
    rollout: Rollout
    if placement.weight_sync is not None:
        rollout_group = groups[Role.ROLLOUT]
        # All ranks: gathering a sharded policy's full shapes is a collective.
        manifest = actor.call_all("weight_manifest")[0]
        port = free_port()
        joins = [g.submit("join_weight_sync", [("127.0.0.1", port)] * len(g)) for g in (actor, rollout_group)]
        for group, joined in zip((actor, rollout_group), joins, strict=True):
            group.wait(joined)
        bucket = config.rollout.update_weights_bucket_megabytes * 2**20
        if fleet is not None and placement.engines.tensor_parallel_size == 1:
            rollout = ElasticRollout(actor, rollout_group, fleet(), manifest, bucket, ("127.0.0.1", port))
        else:
            rollout = SeparateRollout(actor, rollout_group, manifest, bucket, placement.engines)
    else:
        rollout = ColocatedRollout(actor, placement.engines)
    reference, critic, reward_model = host(Role.REFERENCE), host(Role.CRITIC), host(Role.REWARD)
    return Roles(
        actor=DataParallelActor(actor),
        rollout=rollout,
        # Function rewards run in the driver; a reward model on the ranks that host it.
        reward=DataParallelRewardModel(reward_model) if reward_model is not None else function_reward,
        reference=DataParallelReference(reference) if reference is not None else None,
        critic=DataParallelCritic(critic) if critic is not None else None,
    )


def close(groups: Groups) -> None:
    """Engines closed where the ranks still answer; a lost rank was reported already."""
    for group in groups.values():
        try:
            group.call_all("close")
        except Exception as error:  # the run's own error (if any) is the one to raise
            log.debug("closing %s: %s", group.role, error)
