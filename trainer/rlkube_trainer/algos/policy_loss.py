"""Policy losses, registered by verl's names (``actor.policy_loss``), and the entropy bonus.

Each returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from rlkube_trainer.algos.aggregation import agg_loss
from rlkube_trainer.algos.masked import masked_mean, masked_sum
from rlkube_trainer.algos.registry import lookup, register

PolicyLossFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
_LossT = TypeVar("_LossT", bound=PolicyLossFn)

POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}
# Policy losses that aggregate their own way whatever loss_agg_mode says (by registry name).
FIXED_LOSS_AGG_MODES: dict[str, str] = {"gspo": "seq-mean-token-mean"}


def register_policy_loss(name: str) -> Callable[[_LossT], _LossT]:
    """Decorator registering a policy loss under ``name``; re-registering a different fn fails."""
    return register(POLICY_LOSS_REGISTRY, "policy loss", name)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """Return the policy loss registered as ``name``; ValueError listing known names otherwise."""
    return lookup(POLICY_LOSS_REGISTRY, "policy loss", name)


@register_policy_loss("vanilla")
def compute_policy_loss(
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dual-clip PPO policy loss, each token's loss times its rollout-correction weight when
    given (rollout_correction.py); returns (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)."""
    assert clip_ratio_c > 1.0, f"clip_ratio_c (dual-clip lower bound) must be greater than 1.0, got {clip_ratio_c}"
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    if low is None or high is None:
        raise ValueError("compute_policy_loss needs cliprange, or both cliprange_low and cliprange_high")

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

    pg_losses = torch.where(negative, clip_pg_losses2, clip_pg_losses1)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "seq-mean-token-mean",
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al., 2025): the importance ratio of a whole sequence,
    ``s_i = exp(mean_t(log_prob - old_log_prob))`` (the geometric mean of the token ratios),
    clipped PPO-style. Each token carries ``sg[s_i] * pi(y_t) / sg[pi(y_t)]``: equal to s_i in
    value, with the gradient of the sequence's mean token log-prob. Aggregated
    seq-mean-token-mean whatever ``loss_agg_mode`` says, as GSPO's objective averages per
    sequence; no dual clip (``clip_ratio_c`` is unused) and ``pg_clipfrac_lower`` is 0.
    Returns (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)."""
    del clip_ratio_c, loss_agg_mode  # part of the policy-loss signature; not GSPO's
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    if low is None or high is None:
        raise ValueError("compute_policy_loss_gspo needs cliprange, or both cliprange_low and cliprange_high")

    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = masked_sum(negative_approx_kl, response_mask, dim=-1) / seq_lengths
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))  # clamped before exp: no overflow

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, FIXED_LOSS_AGG_MODES["gspo"])
    pg_clipfrac = masked_mean((pg_losses2 > pg_losses1).to(log_prob.dtype), response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim, as ``logsumexp(logits) - sum(softmax * logits)``."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)


def compute_entropy_loss(
    entropy: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """``agg_loss(entropy)``; the actor adds ``-entropy_coeff * entropy_loss`` to its loss."""
    return agg_loss(entropy, response_mask, loss_agg_mode)
