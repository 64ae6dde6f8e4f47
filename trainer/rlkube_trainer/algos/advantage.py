"""Advantage estimators, registered by verl's names (``algorithm.adv_estimator``).

Each takes ``[batch, response_len]`` token rewards and the response mask (and, as it needs them,
values, the group index, ...) and returns ``(advantages, returns)``; ppo.py calls the one the
config names with the arguments it declares (registry.call_with).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from enum import Enum, StrEnum
from typing import TypeVar

import torch

from rlkube_trainer.algos.masked import IndexLike, group_ids, group_onehot, group_stats, masked_sum, masked_whiten
from rlkube_trainer.algos.registry import lookup, register

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "AdvEstimatorFn",
    "AdvantageEstimator",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "get_adv_estimator_fn",
    "register_adv_est",
]

AdvEstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
_AdvT = TypeVar("_AdvT", bound=AdvEstimatorFn)

ADV_ESTIMATOR_REGISTRY: dict[str, AdvEstimatorFn] = {}


class AdvantageEstimator(StrEnum):
    """verl's enum of its estimators' names; register_adv_est and get_adv_estimator_fn take a
    member or the plain name."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


def _name(name_or_enum: str | Enum) -> str:
    # Any enum whose values are the names: ours, or verl's own AdvantageEstimator.
    return str(name_or_enum.value) if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(name_or_enum: str | Enum) -> Callable[[_AdvT], _AdvT]:
    """Decorator registering an advantage estimator under a name or an AdvantageEstimator member;
    re-registering a different fn fails."""
    return register(ADV_ESTIMATOR_REGISTRY, "advantage estimator", _name(name_or_enum))


def get_adv_estimator_fn(name_or_enum: str | Enum) -> AdvEstimatorFn:
    """Return the advantage estimator registered as a name or AdvantageEstimator member;
    ValueError listing known names otherwise."""
    return lookup(ADV_ESTIMATOR_REGISTRY, "advantage estimator", _name(name_or_enum))


def _outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's score: the sum of its token rewards."""
    return masked_sum(token_level_rewards, response_mask, dim=-1)


def _broadcast(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A per-sequence number on each of its response tokens (0 elsewhere)."""
    return scores.unsqueeze(-1) * response_mask.to(scores.dtype)


def _reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Undiscounted return from each position to the end: reversed cumulative sum of the masked rewards."""
    masked = token_level_rewards * response_mask.to(token_level_rewards.dtype)
    return masked.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])


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
        scores = _outcome_scores(token_level_rewards, response_mask)
        advantages = _broadcast(_grpo_scores(scores, index, epsilon, norm_adv_by_std_in_grpo), response_mask)
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
        scores = _outcome_scores(token_level_rewards, response_mask)
        count, mean, _ = group_stats(scores, index)
        multi = count > 1
        n = torch.where(multi, count, torch.full_like(count, 2.0))
        scores = torch.where(multi, (scores - mean) * n / (n - 1), torch.zeros_like(scores))
        advantages = _broadcast(scores, response_mask)
    return advantages, advantages


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
        scores = _outcome_scores(token_level_rewards, response_mask)
        count, mean, _ = group_stats(scores, index)
        scores = scores - torch.where(count == 1, torch.zeros_like(mean), mean)
        mask = response_mask.to(scores.dtype)
        advantages = masked_whiten(_broadcast(scores, response_mask), response_mask) * mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REMAX)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: returns are the undiscounted reward-to-go; advantages the returns minus the reward
    of the greedy response to the same prompt (``reward_baselines``, ``[batch]``)."""
    with torch.no_grad():
        returns = _reward_to_go(token_level_rewards, response_mask)
        advantages = returns - _broadcast(reward_baselines.to(returns.dtype), response_mask)
    return advantages, returns


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
        scores = _outcome_scores(token_level_rewards, response_mask)
        lengths = response_mask.to(scores.dtype).sum(dim=-1)
        gid, onehot = group_onehot(index, scores.shape[0], scores)
        count = onehot.sum(dim=0)[gid]
        baseline = (((lengths * scores) @ onehot) / (lengths @ onehot))[gid]
        scores = scores - torch.where(count == 1, torch.zeros_like(baseline), baseline)
        advantages = _broadcast(scores, response_mask)
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
        scores = _outcome_scores(token_level_rewards, response_mask)
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
        advantages = _broadcast(advantages, response_mask)
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
        scores = _outcome_scores(token_level_rewards, response_mask)
        alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
        count, mean, _ = group_stats(scores, index)
        mean = torch.where(count == 1, torch.zeros_like(mean), mean)
        advantages = _broadcast(alpha * (scores - mean) / f_norm, response_mask)
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
            [_outcome_scores(token_level_rewards, response_mask)]
            if not reward_components
            else [c.to(token_level_rewards.dtype) for c in reward_components]
        )
        weights = [1.0] * len(components) if reward_weights is None else list(reward_weights)
        if len(weights) != len(components):
            raise ValueError(f"gdpo has {len(components)} reward components but {len(weights)} weights")
        total = torch.zeros_like(token_level_rewards)
        for weight, component in zip(weights, components, strict=True):
            normalised = _grpo_scores(component, index, epsilon, norm_adv_by_std_in_grpo)
            total = total + weight * _broadcast(normalised, response_mask)
        advantages = masked_whiten(total, response_mask) * mask
    return advantages, advantages


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
        returns = _reward_to_go(token_level_rewards, response_mask)
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
        token_returns = _reward_to_go(token_level_rewards, response_mask)
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
