"""Advantage estimators: verl's names (``algorithm.adv_estimator``, the AdvantageEstimator enum),
their registry, and the pieces the estimators share.

Each estimator takes ``[batch, response_len]`` token rewards and the response mask (and, as it
needs them, values, the group index, ...) and returns ``(advantages, returns)``; ppo.py calls the
one the config names with the arguments it declares (registry.call_with).

The estimators live by family, each registering itself here on import (the package imports them
all): advantage_returns.py (per-token returns: GAE, REINFORCE++, ReMax), advantage_group.py (an
outcome score against its group: GRPO, RLOO, OPO, GPG, GDPO, ...) and
advantage_optimal_baseline.py (the optimal token baseline). The helpers below are shared by
those modules and are not part of the package's names.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum, StrEnum
from typing import TypeVar

import torch

from rlkube_trainer.algos.masked import masked_sum
from rlkube_trainer.algos.registry import lookup, register

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "AdvEstimatorFn",
    "AdvantageEstimator",
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


def outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's score: the sum of its token rewards."""
    return masked_sum(token_level_rewards, response_mask, dim=-1)


def broadcast(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A per-sequence number on each of its response tokens (0 elsewhere)."""
    return scores.unsqueeze(-1) * response_mask.to(scores.dtype)


def reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Undiscounted return from each position to the end: reversed cumulative sum of the masked rewards."""
    masked = token_level_rewards * response_mask.to(token_level_rewards.dtype)
    return masked.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
