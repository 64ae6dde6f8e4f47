"""Policy losses with one importance ratio per sequence rather than per token: GSPO (the
geometric mean of the token ratios, clipped PPO-style) and GMPO (geo_mean: each token's log-ratio
clipped before the geometric mean).

Registered by name in policy_loss.py's registry on import.
"""

from __future__ import annotations

import torch

from rlkube_trainer.algos.aggregation import agg_loss
from rlkube_trainer.algos.masked import masked_mean, masked_sum
from rlkube_trainer.algos.policy_loss import clip_range, register_policy_loss, weighted, zero_metric

__all__ = ["compute_policy_loss_geo_mean", "compute_policy_loss_gspo"]


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    loss_agg_mode: str = "seq-mean-token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al., 2025): the importance ratio of a whole sequence,
    ``s_i = exp(mean_t(log_prob - old_log_prob))`` (the geometric mean of the token ratios),
    clipped PPO-style. Each token carries ``sg[s_i] * pi(y_t) / sg[pi(y_t)]``: equal to s_i in
    value, with the gradient of the sequence's mean token log-prob. Aggregated with the
    configured ``loss_agg_mode`` as verl 0.9.1 (verl 0.6-0.9.0 always used seq-mean-token-mean,
    the paper's); no dual clip and ``pg_clipfrac_lower`` is 0."""
    low, high = clip_range("compute_policy_loss_gspo", cliprange, cliprange_low, cliprange_high)
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = masked_sum(negative_approx_kl, response_mask, dim=-1) / seq_lengths
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))  # clamped before exp: no overflow

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    pg_losses = weighted(torch.maximum(pg_losses1, pg_losses2), rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    pg_clipfrac = masked_mean((pg_losses2 > pg_losses1).to(log_prob.dtype), response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, zero_metric(pg_loss)


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GMPO: the geometric mean of the token ratios, each log-ratio clipped to [-low, high] on the
    side its advantage's sign makes pessimistic; the loss is ``-mean_t(A) * ratio`` per sequence,
    averaged over sequences (loss_agg_mode is not used, as in verl). Rollout-correction weights
    enter as their per-sequence geometric mean. pg_clipfrac / pg_clipfrac_lower: the share of
    tokens whose log-ratio was clipped, with A > 0 / A < 0."""
    low, high = clip_range("compute_policy_loss_geo_mean", cliprange, cliprange_low, cliprange_high)
    negative_approx_kl = log_prob - old_log_prob
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    sign = torch.sign(advantages)
    clamped = torch.clamp(negative_approx_kl, -low, high)
    pessimistic = sign * torch.minimum(sign * negative_approx_kl, sign * clamped)
    mask = response_mask.to(log_prob.dtype)
    lengths = mask.sum(dim=-1)
    ratio = torch.exp(masked_sum(pessimistic, response_mask, dim=-1) / (lengths + 1e-8))
    seq_advantage = masked_sum(advantages, response_mask, dim=-1) / (lengths + 1e-8)
    pg_losses = -seq_advantage * ratio
    if rollout_is_weights is not None:
        seq_weights = torch.exp(
            masked_sum(torch.log(rollout_is_weights + 1e-10), response_mask, dim=-1) / (lengths + 1e-8)
        )
        pg_losses = pg_losses * seq_weights
    # verl averages over all rows; here over rows with tokens, as the seq-mean modes count them
    # (the same number unless a micro-batch holds fully masked filler rows).
    pg_loss = masked_mean(pg_losses, (lengths > 0).to(log_prob.dtype))
    clipped = (negative_approx_kl != clamped).to(log_prob.dtype)
    pg_clipfrac = masked_mean(clipped * (advantages > 0), response_mask)
    pg_clipfrac_lower = masked_mean(clipped * (advantages < 0), response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower
