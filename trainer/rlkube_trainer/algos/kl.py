"""KL estimators (``kl_penalty``), KL controllers and KL in the reward."""

from __future__ import annotations

from typing import Protocol

import torch

from rlkube_trainer.algos.masked import masked_mean

__all__ = [
    "KL_PENALTIES",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "apply_kl_penalty",
    "get_kl_controller",
    "kl_penalty",
    "kl_penalty_forward",
]

_BASE_KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# Every estimator, and its straight-through "+" variant.
KL_PENALTIES: tuple[str, ...] = _BASE_KL_PENALTIES + tuple(f"{name}+" for name in _BASE_KL_PENALTIES)


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate: kl/k1 ``lp-ref``, abs, mse/k2 ``0.5(lp-ref)^2``, low_var_kl/k3 (clamped)."""
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        # Both clamps keep a single far-off token from exploding the estimate (exp overflow, huge grads).
        kl = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10.0, max=10.0)
    raise ValueError(f"unknown kl_penalty {kl_penalty!r}; choose one of: {', '.join(KL_PENALTIES)}")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """``kl_penalty_forward``; with a ``+`` suffix (``k1+``, ``k3+``, ...) verl's straight-through
    variant: the named estimator's value with the gradient of k2, whose expected gradient is the
    true KL's (k1's and k3's are not, though their expected values are)."""
    base = kl_penalty.removesuffix("+")
    forward = kl_penalty_forward(logprob, ref_logprob, base)
    if base == kl_penalty:
        return forward
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + forward.detach()


class KLController(Protocol):
    """What :func:`apply_kl_penalty` needs from a KL controller."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adjust ``value`` after observing ``current_kl`` over ``n_steps`` samples."""


class FixedKLController:
    """KL coefficient that never changes."""

    def __init__(self, kl_coef: float) -> None:
        """Start (and stay) at ``kl_coef``."""
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        """The coefficient, for checkpoints."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore the coefficient saved by :meth:`state_dict`."""
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller steering the observed KL toward ``target_kl`` (Ziegler et al. 2019)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        """Start at ``init_kl_coef``; ``horizon`` is how many samples a full correction is spread over."""
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"target_kl and horizon must be > 0, got target_kl={target_kl}, horizon={horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """``value *= 1 + clip(current_kl/target - 1, -0.2, 0.2) * n_steps/horizon``."""
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        """The current coefficient, for checkpoints (target and horizon come from the config)."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore the coefficient saved by :meth:`state_dict`."""
        self.value = float(state["value"])


def get_kl_controller(
    type: str,  # verl's config key: algorithm.kl_ctrl.type
    kl_coef: float,
    target_kl: float | None = None,
    horizon: float | None = None,
) -> FixedKLController | AdaptiveKLController:
    """Build the ``fixed`` or ``adaptive`` KL controller named by ``algorithm.kl_ctrl.type``."""
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("adaptive KL controller needs target_kl and horizon")
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller type {type!r}; choose one of: fixed, adaptive")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kl_penalty_type: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL in the reward: ``scores - beta*kl*mask``, then ``kl_ctrl.update``; returns (rewards, metrics)."""
    kld = kl_penalty(old_log_prob, ref_log_prob, kl_penalty_type)
    kld = torch.where(response_mask.bool(), kld, torch.zeros_like(kld))
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, response_mask, dim=-1).mean().item())
    kl_ctrl.update(current_kl, n_steps=token_level_scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return token_level_rewards, metrics
