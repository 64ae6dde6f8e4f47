"""Advantage estimators, registered by verl's names (``algorithm.adv_estimator``).

Each takes ``[batch, response_len]`` token rewards and the response mask (and, as it needs them,
values, the group index, ...) and returns ``(advantages, returns)``; ppo.py calls the one the
config names with the arguments it declares (registry.call_with).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from rlkube_trainer.algos.masked import IndexLike, group_stats, masked_sum, masked_whiten
from rlkube_trainer.algos.registry import lookup, register

AdvEstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
_AdvT = TypeVar("_AdvT", bound=AdvEstimatorFn)

ADV_ESTIMATOR_REGISTRY: dict[str, AdvEstimatorFn] = {}


def register_adv_est(name: str) -> Callable[[_AdvT], _AdvT]:
    """Decorator registering an advantage estimator under ``name``; re-registering a different fn fails."""
    return register(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def get_adv_estimator_fn(name: str) -> AdvEstimatorFn:
    """Return the advantage estimator registered as ``name``; ValueError listing known names otherwise."""
    return lookup(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


@register_adv_est("gae")
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE backwards in time, state carried over masked tokens; returns (whitened adv, raw adv + values)."""
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        nextvalues = torch.zeros_like(values[:, 0])
        lastgaelam = torch.zeros_like(values[:, 0])
        reversed_adv = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            gae = delta + gamma * lam * lastgaelam
            m = mask[:, t]
            # Masked tokens (padding, tool/observation tokens) neither bootstrap nor reset the recursion.
            nextvalues = values[:, t] * m + (1 - m) * nextvalues
            lastgaelam = gae * m + (1 - m) * lastgaelam
            reversed_adv.append(lastgaelam)
        advantages = torch.stack(reversed_adv[::-1], dim=1)
        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


@register_adv_est("grpo")
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome score minus its group mean, over (std + eps) unless Dr.GRPO; broadcast over the mask."""
    with torch.no_grad():
        scores = masked_sum(token_level_rewards, response_mask, dim=-1)
        count, mean, std = group_stats(scores, index)
        # verl's convention: a lone sample has no baseline (mean 0, std 1).
        single = count == 1
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)
        scores = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
        advantages = scores.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@register_adv_est("rloo")
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out baseline ``s*n/(n-1) - mean*n/(n-1)`` per group (lone samples keep ``s``); broadcast."""
    del epsilon  # accepted for verl signature compatibility; RLOO never divides by a std
    with torch.no_grad():
        scores = masked_sum(token_level_rewards, response_mask, dim=-1)
        count, mean, _ = group_stats(scores, index)
        multi = count > 1
        n = torch.where(multi, count, torch.full_like(count, 2.0))
        loo = scores * n / (n - 1) - mean * n / (n - 1)
        scores = torch.where(multi, loo, scores)
        advantages = scores.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@register_adv_est("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Discounted return-to-go over model tokens; returns (masked-whitened returns * mask, returns).

    As verl 0.9.1: a masked token (a tool or user turn inside a multi-turn response, or padding)
    gets return 0 and carries the running return through unchanged, so a final reward reaches
    the model's turns before the tool's span, undiscounted by the span's length.
    """
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[-1])):
            new_running = token_level_rewards[:, t] + gamma * running
            returns[:, t] = new_running * mask[:, t]
            running = new_running * mask[:, t] + running * (1 - mask[:, t])
        advantages = masked_whiten(returns, response_mask) * mask
    return advantages, returns
