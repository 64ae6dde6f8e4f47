"""Policy losses without a hard clip of the ratio: SAPO's smooth gate, GPG's plain policy
gradient and DRO's policy gradient with a quadratic log-ratio penalty.

Registered by name in policy_loss.py's registry on import.
"""

from __future__ import annotations

import torch

from rlkube_trainer.algos.aggregation import agg_loss
from rlkube_trainer.algos.masked import masked_mean
from rlkube_trainer.algos.policy_loss import FIXED_LOSS_AGG_MODES, register_policy_loss, weighted, zero_metric

__all__ = ["compute_policy_loss_dro", "compute_policy_loss_gpg", "compute_policy_loss_sapo"]


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAPO: a smooth gate instead of a hard clip, ``f(r) = sigmoid(tau*(r - 1)) * 4/tau`` of the
    token ratio (slope 1 at r = 1), with ``tau_pos`` for A > 0 and ``tau_neg`` otherwise; loss
    ``-f(r)*A``, always aggregated seq-mean-token-mean (as verl 0.9.1, whatever loss_agg_mode
    says). No clipping: both clip fractions are 0."""
    neg_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_approx_kl)
    taus = torch.where(
        advantages > 0,
        torch.as_tensor(tau_pos, dtype=advantages.dtype, device=advantages.device),
        torch.as_tensor(tau_neg, dtype=advantages.dtype, device=advantages.device),
    )
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    pg_losses = weighted(-gates * advantages, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, FIXED_LOSS_AGG_MODES["sapo"])
    ppo_kl = masked_mean(-neg_approx_kl, response_mask)
    return pg_loss, zero_metric(pg_loss), ppo_kl, zero_metric(pg_loss)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPG: plain policy gradient ``-log_prob * A`` (no ratio, no clip; the old log-probs are
    unused). verl reports no clip fraction or KL for it: all three metrics are 0."""
    del old_log_prob  # part of the policy-loss signature; not GPG's
    pg_losses = weighted(-log_prob * advantages, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    return pg_loss, zero_metric(pg_loss), zero_metric(pg_loss), zero_metric(pg_loss)


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
    dro_beta: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Direct Reward Optimization: ``-(log_prob*A - dro_beta/2 * (log_prob - old_log_prob)^2)``,
    a policy gradient with a quadratic log-ratio penalty; clip fractions are 0."""
    if dro_beta is None or dro_beta <= 0:
        raise ValueError("actor.dro_beta must be a positive number when actor.policy_loss is dro")
    log_ratio = log_prob - old_log_prob
    pg_losses = weighted(-(log_prob * advantages - 0.5 * dro_beta * log_ratio.square()), rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    return pg_loss, zero_metric(pg_loss), masked_mean(-log_ratio, response_mask), zero_metric(pg_loss)
