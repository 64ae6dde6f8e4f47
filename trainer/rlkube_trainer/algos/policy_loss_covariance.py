"""The entropy-mechanism paper's policy losses, which keep entropy from collapsing by acting on
the tokens whose advantage and log-prob covary most: Clip-Cov (cuts their gradient) and KL-Cov
(adds a KL penalty on them).

Registered by name in policy_loss.py's registry on import.
"""

from __future__ import annotations

import torch

from rlkube_trainer.algos.aggregation import agg_loss
from rlkube_trainer.algos.masked import masked_mean
from rlkube_trainer.algos.policy_loss import clip_range, register_policy_loss, weighted, zero_metric

__all__ = ["compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov"]


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
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
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clip-Cov (the entropy-mechanism paper): the clipped PPO loss (no dual clip, no ratio
    clamp), with the gradient cut for a random ``clip_cov_ratio`` share of the tokens (at least
    one) whose covariance ``(A - mean A)(log_prob - mean log_prob)`` lies strictly inside
    (clip_cov_lb, clip_cov_ub) and which the PPO clip left alone. pg_clipfrac is the share cut."""
    assert clip_cov_ratio > 0, f"clip_cov_ratio must be > 0, got {clip_cov_ratio}"
    low, high = clip_range("compute_policy_loss_clip_cov", cliprange, cliprange_low, cliprange_high)
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    valid = response_mask > 0
    clipped_by_ppo = (pg_losses2 > pg_losses1) & valid

    cov = (advantages - masked_mean(advantages, response_mask)) * (
        log_prob.detach() - masked_mean(log_prob.detach(), response_mask)
    )
    candidates = torch.nonzero(valid & ~clipped_by_ppo & (cov > clip_cov_lb) & (cov < clip_cov_ub))
    clip_num = max(int(clip_cov_ratio * float(response_mask.sum().item())), 1)
    # A random subset, as verl: the candidates are many more than clip_num in practice.
    chosen = candidates[torch.randperm(len(candidates))[:clip_num].to(candidates.device)]
    corr = torch.ones_like(advantages)
    corr[chosen[:, 0], chosen[:, 1]] = 0

    pg_losses = weighted(torch.maximum(pg_losses1, pg_losses2) * corr, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    pg_clipfrac = masked_mean((corr == 0).to(log_prob.dtype), response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, zero_metric(pg_loss)


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL-Cov: the unclipped ratio loss ``-A*r``, plus ``ppo_kl_coef * |log r|`` on the
    ``kl_cov_ratio`` share of tokens (at least one) with the largest covariance
    ``(A - mean A)(log_prob - mean log_prob)``. ppo_kl is the mean |log r| (verl's kl_cov metric);
    the clip fractions are 0."""
    assert kl_cov_ratio > 0, f"kl_cov_ratio must be > 0, got {kl_cov_ratio}"
    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    pg_losses = -advantages * ratio
    valid = response_mask > 0
    n_valid = int(valid.sum().item())
    if n_valid:
        adv_v = advantages[valid].detach()
        logp_v = log_prob[valid].detach()
        cov = (adv_v - adv_v.mean()) * (logp_v - logp_v.mean())
        top = torch.topk(cov, max(1, int(n_valid * kl_cov_ratio))).indices
        penalised = torch.zeros(n_valid, dtype=torch.bool, device=advantages.device)
        penalised[top] = True
        chosen = torch.zeros_like(valid)
        chosen[valid] = penalised
        pg_losses = torch.where(chosen, pg_losses + ppo_kl_coef * abs_kl, pg_losses)
    pg_losses = weighted(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    return pg_loss, zero_metric(pg_loss), masked_mean(abs_kl, response_mask), zero_metric(pg_loss)
