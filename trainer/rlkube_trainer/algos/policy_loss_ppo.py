"""Token-level PPO and the losses that bound each token's importance ratio their own way:
verl's dual-clip PPO loss (vanilla), DPPO's trust-region mask with a truncated ratio (dppo_tv,
dppo_kl) and CISPO's clipped, detached ratio as a weight on the log-prob.

Registered by name in policy_loss.py's registry on import.
"""

from __future__ import annotations

import torch

from rlkube_trainer.algos.aggregation import agg_loss
from rlkube_trainer.algos.masked import masked_mean
from rlkube_trainer.algos.policy_loss import clip_range, register_policy_loss, weighted, zero_metric

__all__ = [
    "compute_policy_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_vanilla",
]


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dual-clip PPO policy loss, each token's loss times its rollout-correction weight when
    given (rollout_correction.py); returns (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)."""
    assert clip_ratio_c > 1.0, f"clip_ratio_c (dual-clip lower bound) must be greater than 1.0, got {clip_ratio_c}"
    low, high = clip_range("compute_policy_loss", cliprange, cliprange_low, cliprange_high)

    # Clamp before exp so a stale or diverged token cannot overflow the ratio.
    neg_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_approx_kl)
    ppo_kl = masked_mean(-neg_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean((pg_losses2 > pg_losses1).to(log_prob.dtype), response_mask)

    # Dual clip bounds the loss of negative-advantage tokens whose ratio has blown up.
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
    negative = advantages < 0
    pg_clipfrac_lower = masked_mean(((clip_pg_losses1 > pg_losses3) & negative).to(log_prob.dtype), response_mask)

    pg_losses = weighted(torch.where(negative, clip_pg_losses2, clip_pg_losses1), rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


# verl's older public name of the vanilla loss, still imported by callers.
compute_policy_loss = compute_policy_loss_vanilla


def _dppo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    valid: torch.Tensor,
    clip_ratio_c: float,
    loss_agg_mode: str,
    rollout_is_weights: torch.Tensor | None,
    loss_scale_factor: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPPO's shared part: a REINFORCE-style term on the tokens inside the trust region
    (``valid``), weighed by the truncated, detached importance ratio."""
    neg_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_approx_kl)
    ppo_kl = masked_mean(-neg_approx_kl, response_mask)
    # Truncated importance sampling instead of the dual clip (DPPO §5.4): no gradient through it.
    truncated_ratio = torch.clamp(ratio, max=clip_ratio_c).detach()
    valid_mask = valid.detach().to(log_prob.dtype)
    pg_losses = weighted(-advantages * truncated_ratio * log_prob * valid_mask, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    pg_clipfrac = masked_mean(1.0 - valid_mask, response_mask)
    pg_clipfrac_lower = masked_mean((ratio > clip_ratio_c).to(log_prob.dtype) * valid_mask, response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 20.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPPO-Binary-TV: a token counts when its probability moved by at most the clip range in the
    advantage's direction (``p - p_old <= high`` for A > 0, ``>= -low`` otherwise); the clip
    ranges are total-variation thresholds here, and ``clip_ratio_c`` truncates the ratio.
    pg_clipfrac is the share of tokens left out."""
    low, high = clip_range("compute_policy_loss_dppo_tv", cliprange, cliprange_low, cliprange_high)
    moved = torch.exp(log_prob) - torch.exp(old_log_prob)
    valid = torch.where(advantages > 0, moved <= high, moved >= -low)
    return _dppo(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        valid,
        clip_ratio_c,
        loss_agg_mode,
        rollout_is_weights,
        loss_scale_factor,
    )


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 20.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPPO-Binary-KL: as dppo_tv with the KL between the Bernoulli distributions
    (token sampled or not) under the old and current policy as divergence; a token moving
    against the advantage's direction always counts."""
    low, high = clip_range("compute_policy_loss_dppo_kl", cliprange, cliprange_low, cliprange_high)
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
    )
    valid = torch.where(
        advantages > 0, (binary_kl <= high) | (prob <= old_prob), (binary_kl <= low) | (prob >= old_prob)
    )
    return _dppo(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        valid,
        clip_ratio_c,
        loss_agg_mode,
        rollout_is_weights,
        loss_scale_factor,
    )


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO: ``-sg[clip(r, 1-low, 1+high)] * A * log_prob``; the clipped ratio only weighs the
    token, so every token keeps a gradient (through log_prob). pg_clipfrac: the share of tokens
    whose ratio was clipped; pg_clipfrac_lower is 0."""
    low, high = clip_range("compute_policy_loss_cispo", cliprange, cliprange_low, cliprange_high)
    neg_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_approx_kl)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = weighted(-clipped_ratio.detach() * advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    pg_clipfrac = masked_mean((ratio != clipped_ratio).to(log_prob.dtype), response_mask)
    return pg_loss, pg_clipfrac, masked_mean(-neg_approx_kl, response_mask), zero_metric(pg_loss)
