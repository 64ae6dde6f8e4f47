"""Rollout correction, as verl 0.9.1 computes it (``verl/trainer/ppo/rollout_corr_helper.py``):
importance weights and rejection masks from ``log_ratio = log pi_train - log pi_rollout`` of the
tokens the engine sampled, and the ``rollout_corr/*`` diagnostics.

Pure torch functions. Shapes are ``[batch, response_len]``; ``response_mask`` is 1 on generated
tokens. The thresholds are parsed by the API (rlkube_api.config), which refuses bad ones by name.
Two modes, as in verl: decoupled (the actor's old log-probs are pi_train; weights and mask are
computed once per batch, ``correct_batch``) and bypass (the engine's log-probs are the old ones;
``bypass_policy_loss`` computes them against the current policy inside the loss).
"""

from __future__ import annotations

import math

import torch

from rlkube_api.config import (
    RolloutCorrectionConfig,
    parse_rollout_is_threshold,
    parse_rollout_rs_options,
    parse_rollout_rs_thresholds,
)
from rlkube_trainer.algos.aggregation import agg_loss
from rlkube_trainer.algos.masked import masked_mean, masked_sum
from rlkube_trainer.algos.policy_loss_ppo import compute_policy_loss

# verl's SAFETY_BOUND: log-ratios are clamped to +-20 before exp (exp(20) ~ 4.9e8).
SAFETY_BOUND = 20.0
Metrics = dict[str, float]


def _masked_max(x: torch.Tensor, mask: torch.Tensor) -> float:
    return x.masked_fill(~mask.bool(), float("-inf")).max().item()


def _masked_min(x: torch.Tensor, mask: torch.Tensor) -> float:
    return x.masked_fill(~mask.bool(), float("inf")).min().item()


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: str = "2.0",
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, Metrics]:
    """Importance weights pi_train/pi_rollout, per token or per sequence (exp of the summed
    log-ratio, the same on every token), zero on padding; truncated to the upper bound (TIS) or,
    with "lower_upper", zeroed outside the bounds (IcePop); detached; optionally scaled to mean 1.
    Metrics without the rollout_corr/ prefix (verl's names)."""
    if rollout_is not in ("token", "sequence"):
        raise ValueError(f"rollout_is must be token or sequence, not {rollout_is!r}")
    upper, lower = parse_rollout_is_threshold(rollout_is_threshold)
    if rollout_is == "token":
        log_ratio_for_metrics = log_ratio
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        log_ratio_for_metrics = masked_sum(log_ratio, response_mask, dim=-1).unsqueeze(-1)
        raw = torch.exp(log_ratio_for_metrics.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * response_mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = compute_is_metrics(weights, raw, log_ratio_for_metrics, response_mask, rollout_is, upper, lower)
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = masked_mean(((raw < lower) | (raw > upper)).float(), response_mask).item()
    # Weights change the measure, not the objective: no gradient through them.
    weights = weights.detach()
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = masked_mean(weights, response_mask)
        else:  # one weight per sequence
            present = (response_mask.sum(dim=-1) > 0).to(weights.dtype)
            mean = (masked_mean(weights, response_mask, dim=-1) * present).sum() / present.sum().clamp_min(1e-8)
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = mean.item()
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def compute_is_metrics(
    weights: torch.Tensor,
    raw: torch.Tensor,
    log_ratio_for_metrics: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str,
    upper: float,
    lower: float | None,
) -> Metrics:
    """verl's rollout_is_* metrics: statistics of the applied weights; the high/low fractions of
    the raw ones (of the sequence log-ratio, in log space, at sequence level)."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token")
    low = 1.0 / upper if lower is None else lower
    metrics: Metrics = {}
    if rollout_is == "sequence":
        metrics["rollout_is_max"] = math.exp(min(log_ratio_for_metrics.max().item(), SAFETY_BOUND))
        metrics["rollout_is_min"] = math.exp(log_ratio_for_metrics.min().item())
        metrics["rollout_is_mean"] = masked_mean(weights, response_mask).item()
        metrics["rollout_is_ratio_fraction_high"] = (log_ratio_for_metrics > math.log(upper)).float().mean().item()
        metrics["rollout_is_ratio_fraction_low"] = (log_ratio_for_metrics < math.log(low)).float().mean().item()
    else:
        metrics["rollout_is_mean"] = masked_mean(weights, response_mask).item()
        metrics["rollout_is_ratio_fraction_high"] = masked_mean((raw > upper).float(), response_mask).item()
        metrics["rollout_is_ratio_fraction_low"] = masked_mean((raw < low).float(), response_mask).item()
        metrics["rollout_is_max"] = _masked_max(weights, response_mask)
        metrics["rollout_is_min"] = _masked_min(weights, response_mask)
    bounded = weights.clamp(min=0.0, max=upper)
    if response_mask.sum() > 1:
        mean = masked_mean(bounded, response_mask)
        var = masked_mean(bounded.square(), response_mask) - mean.square()
        metrics["rollout_is_std"] = torch.sqrt(var.clamp(min=0.0)).item()
    else:
        metrics["rollout_is_std"] = 0.0
    normalized = bounded / (masked_mean(bounded, response_mask) + 1e-8)
    metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normalized.square(), response_mask).item()
    seq_mean = masked_mean(weights, response_mask, dim=-1)
    metrics["rollout_is_seq_mean"] = seq_mean.mean().item()
    metrics["rollout_is_seq_std"] = seq_mean.std().item() if seq_mean.numel() > 1 else 0.0
    metrics["rollout_is_seq_max"] = seq_mean.max().item()
    metrics["rollout_is_seq_min"] = seq_mean.min().item()
    metrics["rollout_is_seq_max_deviation"] = (seq_mean - 1.0).abs().max().item()
    # The raw per-sequence mean: a mean of truncated weights can never pass the bound.
    raw_seq_mean = masked_mean(raw, response_mask, dim=-1)
    metrics["rollout_is_seq_fraction_high"] = (raw_seq_mean > upper).float().mean().item()
    metrics["rollout_is_seq_fraction_low"] = (raw_seq_mean < low).float().mean().item()
    return metrics


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """verl's hard trust region: the response mask with the tokens (token_*) or whole sequences
    (seq_*) whose divergence estimate passes its threshold set to 0. Estimators of the clamped
    log-ratio r: k1 = -r (bounded both ways, in log space), k2 = r^2/2, k3 = exp(r) - 1 - r (upper
    bound only). Every criterion of the comma-separated list must pass."""
    if rollout_rs_threshold is None:
        raise ValueError("rollout_rs_threshold must be provided for rejection sampling")
    if log_ratio.shape[0] == 0:
        return response_mask, {}
    options = parse_rollout_rs_options(rollout_rs)
    thresholds = parse_rollout_rs_thresholds(options, rollout_rs_threshold)
    r = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -r, "k2": 0.5 * r.square(), "k3": torch.exp(r) - 1.0 - r}
    mask_bool = response_mask.bool()
    seq_valid = response_mask.sum(dim=-1) > 0
    combined = torch.ones_like(response_mask, dtype=log_ratio.dtype)
    metrics: Metrics = {}
    for option in options:
        lower, upper = thresholds[option]
        level, estimator = option.rsplit("_", 1)
        stat = per_token[estimator]
        if level == "seq_sum":
            seq_stat: torch.Tensor | None = masked_sum(stat, response_mask, dim=-1)
        elif level == "seq_mean":
            seq_stat = masked_mean(stat, response_mask, dim=-1)
        elif level == "seq_max":
            best = stat.masked_fill(~mask_bool, float("-inf")).max(dim=-1).values
            seq_stat = torch.where(best == float("-inf"), torch.zeros_like(best), best)
        else:
            seq_stat = None
        value = stat if seq_stat is None else seq_stat.unsqueeze(-1).expand_as(stat)
        if estimator == "k1":
            assert lower is not None
            hi, lo = math.log(upper), math.log(lower)
            keep = (value >= lo) & (value <= hi)
        else:
            hi, lo = upper, 0.0
            keep = value <= hi
        keep_f = keep.to(log_ratio.dtype)
        combined = combined * keep_f
        prefix = f"rollout_rs_{option}"
        metrics[f"{prefix}_mean"] = masked_mean(value, response_mask).item()
        if seq_stat is not None:
            valid = seq_stat[seq_valid]
            metrics[f"{prefix}_max"] = valid.max().item()
            metrics[f"{prefix}_min"] = valid.min().item()
            metrics[f"{prefix}_fraction_high"] = (valid > hi).float().mean().item()
            metrics[f"{prefix}_fraction_low"] = (valid < lo).float().mean().item() if estimator == "k1" else 0.0
        else:
            metrics[f"{prefix}_max"] = _masked_max(value, response_mask)
            metrics[f"{prefix}_min"] = _masked_min(value, response_mask)
            metrics[f"{prefix}_fraction_high"] = masked_mean((value > hi).float(), response_mask).item()
            metrics[f"{prefix}_fraction_low"] = (
                masked_mean((value < lo).float(), response_mask).item() if estimator == "k1" else 0.0
            )
        metrics[f"{prefix}_masked_fraction"] = masked_mean(1 - keep_f, response_mask).item()
        seq_kept = (keep | ~mask_bool).all(dim=-1)
        metrics[f"{prefix}_seq_masked_fraction"] = (
            (~seq_kept & seq_valid).float().sum() / seq_valid.float().sum().clamp_min(1)
        ).item()
    metrics["rollout_rs_masked_fraction"] = masked_mean(1 - combined, response_mask).item()
    metrics["rollout_rs_seq_masked_fraction"] = ((combined <= 0.5) & mask_bool).any(dim=-1).float().mean().item()
    return (response_mask * combined).to(response_mask.dtype), metrics


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> Metrics:
    """verl's off-policy diagnostics: perplexities of both policies, KL(rollout || train) (direct
    and k3), the log-perplexity gap, and chi^2 of the token and sequence weights."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token")
    train_mean = masked_mean(old_log_prob, response_mask, dim=-1)
    rollout_mean = masked_mean(rollout_log_prob, response_mask, dim=-1)
    log_ratio = old_log_prob - rollout_log_prob
    log_ppl_diff = rollout_mean - train_mean
    rho = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    seq_log_ratio = masked_sum(log_ratio, response_mask, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": torch.exp(-train_mean).mean().item(),
        "training_log_ppl": (-train_mean).mean().item(),
        "kl": masked_mean(rollout_log_prob - old_log_prob, response_mask).item(),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask).item(),
        "rollout_ppl": torch.exp(-rollout_mean).mean().item(),
        "rollout_log_ppl": (-rollout_mean).mean().item(),
        "log_ppl_diff": log_ppl_diff.mean().item(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean().item(),
        "log_ppl_diff_max": log_ppl_diff.max().item(),
        "log_ppl_diff_min": log_ppl_diff.min().item(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean().item(),
        "chi2_token": (masked_mean(rho.square(), response_mask) - 1.0).item(),
        "chi2_seq": (torch.exp(2.0 * seq_log_ratio).mean() - 1.0).item(),
    }


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    config: RolloutCorrectionConfig,
) -> tuple[torch.Tensor | None, torch.Tensor, Metrics]:
    """Weights (None without rollout_is), the response mask after rejection, and every metric
    with verl's rollout_corr/ prefix."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token")
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"log-prob shapes {tuple(old_log_prob.shape)} and {tuple(rollout_log_prob.shape)} must match the "
            f"response mask's {tuple(response_mask.shape)}"
        )
    log_ratio = old_log_prob - rollout_log_prob
    metrics: Metrics = {}
    weights = None
    if config.rollout_is is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, config.rollout_is, config.rollout_is_threshold, config.rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask.clone()
    if config.rollout_rs is not None:
        mask, rs_metrics = compute_rollout_rejection_mask(
            log_ratio, response_mask, config.rollout_rs, config.rollout_rs_threshold
        )
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's REINFORCE loss of bypass mode: -A * log pi (* the detached weight), unclipped.
    Returns (pg_loss, ppo_kl), ppo_kl being KL(rollout || current) by the direct estimator."""
    pg_losses = -advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    return pg_loss, masked_mean(rollout_log_prob - log_prob, response_mask).detach()


def bypass_policy_loss(
    config: RolloutCorrectionConfig,
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float,
    cliprange_low: float | None,
    cliprange_high: float | None,
    clip_ratio_c: float,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Metrics]:
    """verl's bypass_mode policy loss: weights and rejection mask of the current policy against
    the engine's, then ppo_clip (the ratio to the engine's policy, clipped; no weights: the ratio
    already is the correction) or reinforce (weights applied). Returns the policy-loss tuple
    (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower) and the rollout_corr/ metrics."""
    with torch.no_grad():
        weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
            log_prob.detach(), rollout_log_prob, response_mask, config
        )
    if config.loss_type == "reinforce":
        pg_loss, ppo_kl = compute_policy_loss_reinforce(
            rollout_log_prob, log_prob, advantages, mask, loss_agg_mode, weights, loss_scale_factor
        )
        zero = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
        return pg_loss, zero, ppo_kl, zero, metrics
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(
        rollout_log_prob,
        log_prob,
        advantages,
        mask,
        cliprange,
        cliprange_low,
        cliprange_high,
        clip_ratio_c,
        loss_agg_mode,
        loss_scale_factor=loss_scale_factor,
    )
    return pg_loss, clipfrac, ppo_kl, clipfrac_lower, metrics
