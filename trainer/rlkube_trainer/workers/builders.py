"""The roles a rank hosts, each built from its own sections of the job's config: the one
place on a rank that reads the whole config for them, and hands each role what it reads."""

from __future__ import annotations

import torch
from torch import nn

from rlkube_api.config import TrainerConfig
from rlkube_api.placement import Role
from rlkube_trainer.model.fsdp import world_size
from rlkube_trainer.parallel.layout import ParallelLayout
from rlkube_trainer.parallel.mesh import RoleMesh
from rlkube_trainer.workers.actor import Actor
from rlkube_trainer.workers.critic import Critic
from rlkube_trainer.workers.reference import Reference
from rlkube_trainer.workers.training import Placement

# The critic's new weights (its value head, its adapters) and shuffles start from a seed of
# their own, so that they are not the actor's draws.
CRITIC_SEED_OFFSET = 1


def placement_of(config: TrainerConfig, role: Role, device: torch.device, seed: int) -> Placement:
    """Where `role`'s model lives on this rank: its FSDP2 group size and its parallel layout
    (tensor, pipeline, Ulysses sequence parallel) from roles.<role>, over the ranks of the group
    this rank is in (the role's own, or the actor's for a role colocated with it)."""
    workers = {
        Role.ACTOR: config.roles.actor,
        Role.CRITIC: config.roles.critic,
        Role.REFERENCE: config.roles.reference,
    }[role]
    if workers is None:
        return Placement(device, None, seed)
    layout = ParallelLayout.of(
        role.value,
        world_size(),
        workers.tensor_parallel_size,
        workers.pipeline_parallel_size,
        workers.ulysses_sequence_parallel_size,
        workers.virtual_pipeline_parallel_size,
        workers.fsdp_size,
    )
    return Placement(device, workers.fsdp_size, seed, layout)


def build_actor(config: TrainerConfig, device: torch.device, total_steps: int) -> Actor:
    placement = placement_of(config, Role.ACTOR, device, config.trainer.seed)
    return Actor(config.actor, config.model, config.rollout, config.rollout_correction, placement, total_steps)


def build_critic(config: TrainerConfig, device: torch.device, total_steps: int) -> Critic:
    placement = placement_of(config, Role.CRITIC, device, config.trainer.seed + CRITIC_SEED_OFFSET)
    return Critic(config.critic_applied, config.model, config.rollout.n, placement, total_steps)


def build_reference(
    config: TrainerConfig, device: torch.device, policy: nn.Module | None = None, policy_mesh: RoleMesh | None = None
) -> Reference:
    """`policy`: the actor's adapted model (LoRA), whose base is the reference, split as
    `policy_mesh` says (the actor's)."""
    placement = placement_of(config, Role.REFERENCE, device, config.trainer.seed)
    return Reference(config.ref, config.model, config.actor, config.rollout.temperature, placement, policy, policy_mesh)
