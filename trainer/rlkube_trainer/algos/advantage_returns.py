"""Advantage estimators over per-token returns, with no group of samples to compare against:
GAE (against the critic's values), REINFORCE++ (the discounted return-to-go, whitened over the
batch) and ReMax (the return-to-go minus the reward of the greedy response to the prompt).

Registered by name in advantage.py's registry on import.
"""

from __future__ import annotations

import torch

from rlkube_trainer.algos.advantage import AdvantageEstimator, broadcast, register_adv_est, reward_to_go
from rlkube_trainer.algos.masked import masked_whiten

__all__ = [
    "compute_gae_advantage_return",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
]


@register_adv_est(AdvantageEstimator.GAE)
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


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
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


@register_adv_est(AdvantageEstimator.REMAX)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: returns are the undiscounted reward-to-go; advantages the returns minus the reward
    of the greedy response to the same prompt (``reward_baselines``, ``[batch]``)."""
    with torch.no_grad():
        returns = reward_to_go(token_level_rewards, response_mask)
        advantages = returns - broadcast(reward_baselines.to(returns.dtype), response_mask)
    return advantages, returns
