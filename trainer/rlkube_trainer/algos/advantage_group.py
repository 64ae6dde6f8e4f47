"""Outcome advantage estimators with a group baseline: each sequence's score (the sum of its
token rewards) against the other samples of the same prompt (``index``), broadcast over its
response tokens: GRPO (and Dr.GRPO), RLOO, REINFORCE++-baseline, OPO, pass@k GRPO, GPG and GDPO.

Registered by name in advantage.py's registry on import.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from rlkube_trainer.algos.advantage import AdvantageEstimator, broadcast, outcome_scores, register_adv_est
from rlkube_trainer.algos.masked import IndexLike, group_ids, group_onehot, group_stats, masked_sum, masked_whiten

__all__ = [
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
]


# grpo is vectorized already (one-hot matmuls), so verl's vectorized copy is the same function.
@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)
@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome score minus its group mean, over (std + eps) unless Dr.GRPO; broadcast over the mask."""
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards, response_mask)
        advantages = broadcast(_grpo_scores(scores, index, epsilon, norm_adv_by_std_in_grpo), response_mask)
    return advantages, advantages


def _grpo_scores(scores: torch.Tensor, index: IndexLike, epsilon: float, norm_adv_by_std_in_grpo: bool) -> torch.Tensor:
    """GRPO's per-sequence normalisation of ``[batch]`` scores within their groups."""
    count, mean, std = group_stats(scores, index)
    # verl's convention: a lone sample has no baseline (mean 0, std 1).
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean


@register_adv_est(AdvantageEstimator.RLOO)
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


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's rloo_vectorized: rloo's leave-one-out baseline, except that a lone sample gets 0
    (rloo keeps its score)."""
    del epsilon  # accepted for verl signature compatibility
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards, response_mask)
        count, mean, _ = group_stats(scores, index)
        multi = count > 1
        n = torch.where(multi, count, torch.full_like(count, 2.0))
        scores = torch.where(multi, (scores - mean) * n / (n - 1), torch.zeros_like(scores))
        advantages = broadcast(scores, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: score minus its group mean (a lone sample's mean is 0), on every
    response token, then whitened over all response tokens of the batch; returns = advantages."""
    del epsilon  # accepted for verl signature compatibility; the whitening has its own
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards, response_mask)
        count, mean, _ = group_stats(scores, index)
        scores = scores - torch.where(count == 1, torch.zeros_like(mean), mean)
        mask = response_mask.to(scores.dtype)
        advantages = masked_whiten(broadcast(scores, response_mask), response_mask) * mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.OPO)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: score minus the group's length-weighted mean score ``sum(len*s)/sum(len)`` (the
    optimal baseline for on-policy updates); a lone sample's baseline is 0."""
    del epsilon  # accepted for verl signature compatibility
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards, response_mask)
        lengths = response_mask.to(scores.dtype).sum(dim=-1)
        gid, onehot = group_onehot(index, scores.shape[0], scores)
        count = onehot.sum(dim=0)[gid]
        baseline = (((lengths * scores) @ onehot) / (lengths @ onehot))[gid]
        scores = scores - torch.where(count == 1, torch.zeros_like(baseline), baseline)
        advantages = broadcast(scores, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training: only each group's best response gets an advantage, ``r_max - r_second``
    (over the group's std + eps unless Dr.GRPO); every other sample gets 0. Groups need >= 2."""
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards, response_mask)
        rows: dict[Hashable, list[int]] = {}
        for row, key in enumerate(group_ids(index, scores.shape[0])):
            rows.setdefault(key, []).append(row)
        advantages = torch.zeros_like(scores)
        for key, members in rows.items():
            if len(members) < 2:
                raise ValueError(f"grpo_passk needs at least 2 samples per group; group {key!r} has {len(members)}")
            group = scores[members]
            top, top_idx = torch.topk(group, 2)
            advantage = top[0] - top[1]
            if norm_adv_by_std_in_grpo:
                advantage = advantage / (torch.std(group) + epsilon)
            advantages[members[int(top_idx[0])]] = advantage
        advantages = broadcast(advantages, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GPG)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: ``alpha * (s - group mean) / f_norm`` with ``alpha = batch / (samples with a non-zero
    score)``, which scales up the signal when most samples score 0; a lone sample's mean is 0."""
    del epsilon  # accepted for verl signature compatibility
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards, response_mask)
        alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
        count, mean, _ = group_stats(scores, index)
        mean = torch.where(count == 1, torch.zeros_like(mean), mean)
        advantages = broadcast(alpha * (scores - mean) / f_norm, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GDPO)
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    reward_components: Sequence[torch.Tensor] | None = None,
    reward_weights: Sequence[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO: each reward component (``[batch]`` scores, one per key of
    ``algorithm.gdpo_reward_keys``) is normalised within its group as GRPO does, the results are
    summed with ``reward_weights`` (default 1 each), and the sum is whitened over the batch's
    response tokens. Without components the token rewards are the one component."""
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        components = (
            [outcome_scores(token_level_rewards, response_mask)]
            if not reward_components
            else [c.to(token_level_rewards.dtype) for c in reward_components]
        )
        weights = [1.0] * len(components) if reward_weights is None else list(reward_weights)
        if len(weights) != len(components):
            raise ValueError(f"gdpo has {len(components)} reward components but {len(weights)} weights")
        total = torch.zeros_like(token_level_rewards)
        for weight, component in zip(weights, components, strict=True):
            normalised = _grpo_scores(component, index, epsilon, norm_adv_by_std_in_grpo)
            total = total + weight * broadcast(normalised, response_mask)
        advantages = masked_whiten(total, response_mask) * mask
    return advantages, advantages
