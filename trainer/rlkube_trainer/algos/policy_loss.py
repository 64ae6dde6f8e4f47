"""Policy losses, registered by verl 0.9.1's names (``actor.policy_loss``), and the entropy bonus.

Every loss takes the same leading arguments (old and current log-probs, advantages, response
mask) and the keyword arguments it needs from the actor's config (clip ranges, ``loss_agg_mode``,
``loss_scale_factor``, ``tau_pos``, ``dro_beta``, ...); the actor passes those it declares
(registry.call_with). Each returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``; where
verl reports none of a metric for a loss, it is 0 here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from rlkube_trainer.algos.aggregation import agg_loss
from rlkube_trainer.algos.masked import masked_mean, masked_sum
from rlkube_trainer.algos.registry import lookup, register

__all__ = [
    "FIXED_LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "PolicyLossFn",
    "compute_entropy_loss",
    "compute_policy_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "entropy_from_logits",
    "get_policy_loss_fn",
    "register_policy_loss",
]

PolicyLossFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
_LossT = TypeVar("_LossT", bound=PolicyLossFn)

POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}
# Policy losses that aggregate their own way whatever loss_agg_mode says (by registry name), as
# verl 0.9.1: SAPO always averages per sequence; geo_mean's loss is a mean over sequences.
FIXED_LOSS_AGG_MODES: dict[str, str] = {"sapo": "seq-mean-token-mean", "geo_mean": "seq-mean-token-mean"}


def register_policy_loss(name: str) -> Callable[[_LossT], _LossT]:
    """Decorator registering a policy loss under ``name``; re-registering a different fn fails."""
    return register(POLICY_LOSS_REGISTRY, "policy loss", name)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """Return the policy loss registered as ``name``; ValueError listing known names otherwise."""
    return lookup(POLICY_LOSS_REGISTRY, "policy loss", name)


def _clip_range(
    loss: str, cliprange: float | None, cliprange_low: float | None, cliprange_high: float | None
) -> tuple[float, float]:
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    if low is None or high is None:
        raise ValueError(f"{loss} needs cliprange, or both cliprange_low and cliprange_high")
    return low, high


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


def _weighted(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    # Rollout correction (rollout_correction.py) weighs each token's loss.
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


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
    low, high = _clip_range("compute_policy_loss", cliprange, cliprange_low, cliprange_high)

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

    pg_losses = _weighted(torch.where(negative, clip_pg_losses2, clip_pg_losses1), rollout_is_weights)
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
    pg_losses = _weighted(-advantages * truncated_ratio * log_prob * valid_mask, rollout_is_weights)
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
    low, high = _clip_range("compute_policy_loss_dppo_tv", cliprange, cliprange_low, cliprange_high)
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
    low, high = _clip_range("compute_policy_loss_dppo_kl", cliprange, cliprange_low, cliprange_high)
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
    low, high = _clip_range("compute_policy_loss_gspo", cliprange, cliprange_low, cliprange_high)
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = masked_sum(negative_approx_kl, response_mask, dim=-1) / seq_lengths
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))  # clamped before exp: no overflow

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    pg_losses = _weighted(torch.maximum(pg_losses1, pg_losses2), rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    pg_clipfrac = masked_mean((pg_losses2 > pg_losses1).to(log_prob.dtype), response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, _zero(pg_loss)


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
    pg_losses = _weighted(-gates * advantages, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, FIXED_LOSS_AGG_MODES["sapo"])
    ppo_kl = masked_mean(-neg_approx_kl, response_mask)
    return pg_loss, _zero(pg_loss), ppo_kl, _zero(pg_loss)


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
    pg_losses = _weighted(-log_prob * advantages, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    return pg_loss, _zero(pg_loss), _zero(pg_loss), _zero(pg_loss)


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
    low, high = _clip_range("compute_policy_loss_clip_cov", cliprange, cliprange_low, cliprange_high)
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

    pg_losses = _weighted(torch.maximum(pg_losses1, pg_losses2) * corr, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    pg_clipfrac = masked_mean((corr == 0).to(log_prob.dtype), response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, _zero(pg_loss)


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
    pg_losses = _weighted(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    return pg_loss, _zero(pg_loss), masked_mean(abs_kl, response_mask), _zero(pg_loss)


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
    low, high = _clip_range("compute_policy_loss_geo_mean", cliprange, cliprange_low, cliprange_high)
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
    pg_losses = _weighted(-(log_prob * advantages - 0.5 * dro_beta * log_ratio.square()), rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    return pg_loss, _zero(pg_loss), masked_mean(-log_ratio, response_mask), _zero(pg_loss)


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
    low, high = _clip_range("compute_policy_loss_cispo", cliprange, cliprange_low, cliprange_high)
    neg_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_approx_kl)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = _weighted(-clipped_ratio.detach() * advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    pg_clipfrac = masked_mean((ratio != clipped_ratio).to(log_prob.dtype), response_mask)
    return pg_loss, pg_clipfrac, masked_mean(-neg_approx_kl, response_mask), _zero(pg_loss)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim, as ``logsumexp(logits) - sum(softmax * logits)``."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)


def compute_entropy_loss(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """``agg_loss(entropy)``; the actor adds ``-entropy_coeff * entropy_loss`` to its loss."""
    return agg_loss(entropy, response_mask, loss_agg_mode, loss_scale_factor)
