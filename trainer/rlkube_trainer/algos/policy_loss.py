"""The policy-loss interface: the registry of verl 0.9.1's loss names (``actor.policy_loss``) and
the pieces every loss shares.

Every loss takes the same leading arguments (old and current log-probs, advantages, response
mask) and the keyword arguments it needs from the actor's config (clip ranges, ``loss_agg_mode``,
``loss_scale_factor``, ``tau_pos``, ``dro_beta``, ...); the actor passes those it declares
(registry.call_with). Each returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``; where
verl reports none of a metric for a loss, it is 0 here.

The losses live by family, each registering itself here on import (the package imports them
all): policy_loss_ppo.py (token ratios, clipped or truncated), policy_loss_sequence.py (one ratio
per sequence), policy_loss_covariance.py (the entropy-mechanism paper's covariance losses) and
policy_loss_unclipped.py (no hard clip). The helpers below are shared by those modules and are
not part of the package's names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from rlkube_trainer.algos.registry import lookup, register

__all__ = [
    "FIXED_LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "PolicyLossFn",
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


def clip_range(
    loss: str, cliprange: float | None, cliprange_low: float | None, cliprange_high: float | None
) -> tuple[float, float]:
    """The (low, high) clip range: each side falls back to ``cliprange``; ValueError naming the
    loss when a side is left unset."""
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    if low is None or high is None:
        raise ValueError(f"{loss} needs cliprange, or both cliprange_low and cliprange_high")
    return low, high


def zero_metric(like: torch.Tensor) -> torch.Tensor:
    """A 0 for a metric verl does not report for a loss, on the loss's dtype and device."""
    return torch.zeros((), dtype=like.dtype, device=like.device)


def weighted(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    # Rollout correction (rollout_correction.py) weighs each token's loss.
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights
