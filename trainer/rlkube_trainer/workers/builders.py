"""The roles a rank hosts, each built from its own sections of the job's config: the one
place on a rank that reads the whole config for them, and hands each role what it reads."""

from __future__ import annotations

import torch
from torch import nn

from rlkube_api.config import TrainerConfig
from rlkube_api.placement import Role
from rlkube_trainer.workers.actor import Actor
from rlkube_trainer.workers.critic import Critic
from rlkube_trainer.workers.reference import Reference
from rlkube_trainer.workers.training import Placement

# The critic's new weights (its value head, its adapters) and shuffles start from a seed of
# their own, so that they are not the actor's draws.
CRITIC_SEED_OFFSET = 1


def placement_of(config: TrainerConfig, role: Role, device: torch.device, seed: int) -> Placement:
    """Where `role`'s model lives on this rank: its FSDP2 group size from roles.<role>."""
    workers = {
        Role.ACTOR: config.roles.actor,
        Role.CRITIC: config.roles.critic,
        Role.REFERENCE: config.roles.reference,
    }[role]
    return Placement(device, workers.fsdp_size if workers is not None else None, seed)


def build_actor(config: TrainerConfig, device: torch.device, total_steps: int) -> Actor:
    placement = placement_of(config, Role.ACTOR, device, config.trainer.seed)
    return Actor(config.actor, config.model, config.rollout, config.rollout_correction, placement, total_steps)


def build_critic(config: TrainerConfig, device: torch.device, total_steps: int) -> Critic:
    placement = placement_of(config, Role.CRITIC, device, config.trainer.seed + CRITIC_SEED_OFFSET)
    return Critic(config.critic_applied, config.model, config.rollout.n, placement, total_steps)


def build_reference(config: TrainerConfig, device: torch.device, policy: nn.Module | None = None) -> Reference:
    """`policy`: the actor's adapted model (LoRA), whose base is the reference."""
    placement = placement_of(config, Role.REFERENCE, device, config.trainer.seed)
    return Reference(config.ref, config.model, config.actor, config.rollout.temperature, placement, policy)
