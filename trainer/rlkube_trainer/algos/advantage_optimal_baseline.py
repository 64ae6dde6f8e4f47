"""The optimal token baseline (verl's optimal_token_baseline and its multi-turn form,
tir_optimal_token_baseline): a baseline per response position, the group's reward-to-go at that
position weighted by how much each sample's score function has varied up to it.

Registered by name in advantage.py's registry on import.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from rlkube_trainer.algos.advantage import AdvantageEstimator, register_adv_est, reward_to_go
from rlkube_trainer.algos.masked import IndexLike, group_ids

__all__ = [
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_optimal_token_baseline_advantage",
]


def _optimal_baseline(
    returns: torch.Tensor,
    w_cumulative: torch.Tensor,
    mask: torch.Tensor,
    index: IndexLike,
    handle_zero_tail: bool,
    epsilon: float,
) -> torch.Tensor:
    """Per group and position ``sum(G_t * W_t) / (sum(W_t) + eps)`` over the group's samples; lone
    samples get 0. With ``handle_zero_tail`` the one longest sample's positions past the
    second-longest get 0 (no other sample estimates them)."""
    rows: dict[Hashable, list[int]] = {}
    for row, key in enumerate(group_ids(index, returns.shape[0])):
        rows.setdefault(key, []).append(row)
    baselines = torch.zeros_like(returns)
    for members in rows.values():
        if len(members) == 1:
            continue
        g_ret, g_w, g_mask = returns[members], w_cumulative[members], mask[members]
        baseline = (g_ret * g_w * g_mask).sum(dim=0) / ((g_w * g_mask).sum(dim=0) + epsilon)
        baselines[members] = baseline.to(baselines.dtype).unsqueeze(0).expand(len(members), -1)
        if handle_zero_tail:
            lengths = g_mask.sum(dim=-1)
            ordered = torch.sort(lengths).values
            longest, second = int(ordered[-1].item()), int(ordered[-2].item())
            at_longest = (lengths == longest).nonzero(as_tuple=True)[0]
            if at_longest.numel() == 1 and longest > second:
                baselines[members[int(at_longest[0])], second:] = 0.0
    return baselines


def _path_variance(
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """``W_t = sum_{j<=t} (1 - 2*pi_j + sum(pi^2))``, each term times the squared rollout-correction
    weight when given: how much the score function has varied up to t."""
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights**2
    return (w * mask).cumsum(dim=-1)


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE)
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline: a baseline per position, ``B_t = sum(G_t*W_t) / sum(W_t)`` over the
    group at the same position t, with G_t the reward-to-go and W_t the path variance
    (``_path_variance``; ``sum_pi_squared`` is the actor's sum over the vocabulary of pi^2).
    Returns ((G - B) * mask, G)."""
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = reward_to_go(token_level_rewards, response_mask)
        w_cumulative = _path_variance(old_log_probs, sum_pi_squared, mask, rollout_is_weights)
        baselines = _optimal_baseline(returns, w_cumulative, mask, index, handle_zero_tail, epsilon)
        advantages = (returns - baselines) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE)
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimal token baseline for multi-turn (tool-integrated) responses: positions are
    counted over the model's own tokens only, so the k-th model token of each sample shares a
    baseline whatever tool output came before it. Samples without tokens are left out."""
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        token_returns = reward_to_go(token_level_rewards, response_mask)
        w_cumulative = _path_variance(old_log_probs, sum_pi_squared, mask, rollout_is_weights)
        lengths = mask.sum(dim=-1).long()
        width = int(lengths.max().item()) if lengths.numel() else 0
        # Each sample's model tokens moved to the front, in order.
        packed_w = w_cumulative.new_zeros((len(lengths), width))
        packed_g = torch.zeros_like(packed_w)
        packed_mask = torch.zeros_like(packed_w)
        keep = response_mask.bool()
        for row, length in enumerate(lengths.tolist()):
            packed_w[row, :length] = w_cumulative[row, keep[row]]
            packed_g[row, :length] = token_returns[row, keep[row]]
            packed_mask[row, :length] = 1
        present = [row for row, length in enumerate(lengths.tolist()) if length > 0]
        keys = group_ids(index, len(lengths))
        baselines = torch.zeros_like(packed_g)
        if present:
            baselines[present] = _optimal_baseline(
                packed_g[present],
                packed_w[present],
                packed_mask[present],
                [keys[r] for r in present],
                handle_zero_tail,
                epsilon,
            )
        packed_adv = packed_g - baselines
        advantages = torch.zeros_like(token_returns)
        for row in present:
            advantages[row, keep[row]] = packed_adv[row, : int(lengths[row])]
    return advantages * mask, token_returns
