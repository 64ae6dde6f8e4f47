"""RL post-training math: advantage estimators, PPO losses, KL penalties and KL controllers.

Pure torch functions with the names, argument names and defaults of verl's ``core_algos``
(volcengine/verl), so a verl recipe maps over one to one.
Shapes are ``[batch, response_len]`` unless noted; ``response_mask`` is 1 on generated
tokens and 0 on padding.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import torch

AdvEstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
PolicyLossFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
IndexLike = Sequence[Hashable] | npt.NDArray[Any] | torch.Tensor

_AdvT = TypeVar("_AdvT", bound=AdvEstimatorFn)
_LossT = TypeVar("_LossT", bound=PolicyLossFn)
_FnT = TypeVar("_FnT", bound=Callable[..., Any])

ADV_ESTIMATOR_REGISTRY: dict[str, AdvEstimatorFn] = {}
POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}
# Policy losses that aggregate their own way whatever loss_agg_mode says (by registry name).
FIXED_LOSS_AGG_MODES: dict[str, str] = {"gspo": "seq-mean-token-mean"}


# --------------------------------------------------------------------------- registries


def _register(registry: dict[str, Any], kind: str, name: str) -> Callable[[_FnT], _FnT]:
    def decorator(fn: _FnT) -> _FnT:
        existing = registry.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(f"{kind} {name!r} is already registered to {existing!r}")
        registry[name] = fn
        return fn

    return decorator


def _lookup(registry: dict[str, _FnT], kind: str, name: str) -> _FnT:
    try:
        return registry[name]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise ValueError(f"unknown {kind} {name!r}; known: {known}") from None


def register_adv_est(name: str) -> Callable[[_AdvT], _AdvT]:
    """Decorator registering an advantage estimator under ``name``; re-registering a different fn fails."""
    return _register(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def get_adv_estimator_fn(name: str) -> AdvEstimatorFn:
    """Return the advantage estimator registered as ``name``; ValueError listing known names otherwise."""
    return _lookup(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def register_policy_loss(name: str) -> Callable[[_LossT], _LossT]:
    """Decorator registering a policy loss under ``name``; re-registering a different fn fails."""
    return _register(POLICY_LOSS_REGISTRY, "policy loss", name)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """Return the policy loss registered as ``name``; ValueError listing known names otherwise."""
    return _lookup(POLICY_LOSS_REGISTRY, "policy loss", name)


# --------------------------------------------------------------------------- masked helpers


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x*mask`` (over ``dim``, or everything); masked-out entries never contribute, even NaN/inf."""
    # torch.where first: padding may hold inf/NaN (e.g. log-probs of pad tokens) and 0*inf = NaN.
    valid = torch.where(mask.bool(), x, torch.zeros_like(x)) * mask.to(x.dtype)
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(x*mask) / sum(mask)`` (over ``dim``, or everything); 0 where the mask is empty."""
    denom = mask.to(x.dtype)
    denom = denom.sum() if dim is None else denom.sum(dim=dim)
    # Exact division when the mask is non-empty (no +eps as in verl), and 0 rather than NaN when empty.
    safe = torch.where(denom == 0, torch.ones_like(denom), denom)
    return masked_sum(x, mask, dim) / safe


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries; with ``unbiased`` the n/(n-1) Bessel correction (needs n >= 2)."""
    centered = x - masked_mean(x, mask)
    variance = masked_mean(centered**2, mask)
    if unbiased:
        n = float(mask.to(x.dtype).sum().item())
        if n < 2:
            raise ValueError(f"unbiased masked_var needs at least 2 masked-in entries, got {n:g}")
        variance = variance * (n / (n - 1))
    return variance


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)``, masked mean, unbiased var; ``shift_mean=False`` keeps the mean."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) / torch.sqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def _group_ids(index: IndexLike, batch_size: int) -> list[Hashable]:
    """Prompt ids as plain hashable Python values, one per row."""
    # Tensor elements hash by identity, so go through tolist() to group by value.
    keys: list[Hashable] = index.tolist() if isinstance(index, torch.Tensor | np.ndarray) else list(index)
    if len(keys) != batch_size:
        raise ValueError(f"index has {len(keys)} entries but the batch has {batch_size} rows")
    return keys


def _group_stats(scores: torch.Tensor, index: IndexLike) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (group size, group mean, unbiased group std) of 1-D ``scores`` grouped by ``index``."""
    keys = _group_ids(index, scores.shape[0])
    ids: dict[Hashable, int] = {}
    gid = torch.tensor([ids.setdefault(k, len(ids)) for k in keys], dtype=torch.long, device=scores.device)
    # A [batch, groups] one-hot matmul is deterministic, unlike scatter/index_add on GPU.
    onehot = torch.nn.functional.one_hot(gid, num_classes=len(ids)).to(scores.dtype)
    count = onehot.sum(dim=0)
    mean = (scores @ onehot) / count
    sq_dev = ((scores - mean[gid]) ** 2) @ onehot
    std = torch.sqrt(sq_dev / torch.clamp(count - 1, min=1))
    return count[gid], mean[gid], std[gid]


# --------------------------------------------------------------------------- advantage estimators


@register_adv_est("gae")
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE backwards in time, state carried over masked tokens; returns (whitened adv, raw adv + values)."""
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        nextvalues = torch.zeros_like(values[:, 0])
        lastgaelam = torch.zeros_like(values[:, 0])
        reversed_adv = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            gae = delta + gamma * lam * lastgaelam
            m = mask[:, t]
            # Masked tokens (padding, tool/observation tokens) neither bootstrap nor reset the recursion.
            nextvalues = values[:, t] * m + (1 - m) * nextvalues
            lastgaelam = gae * m + (1 - m) * lastgaelam
            reversed_adv.append(lastgaelam)
        advantages = torch.stack(reversed_adv[::-1], dim=1)
        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


@register_adv_est("grpo")
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome score minus its group mean, over (std + eps) unless Dr.GRPO; broadcast over the mask."""
    with torch.no_grad():
        scores = masked_sum(token_level_rewards, response_mask, dim=-1)
        count, mean, std = _group_stats(scores, index)
        # verl's convention: a lone sample has no baseline (mean 0, std 1).
        single = count == 1
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)
        scores = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
        advantages = scores.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@register_adv_est("rloo")
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: IndexLike,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out baseline ``s*n/(n-1) - mean*n/(n-1)`` per group (lone samples keep ``s``); broadcast."""
    del epsilon  # accepted for verl signature compatibility; RLOO never divides by a std
    with torch.no_grad():
        scores = masked_sum(token_level_rewards, response_mask, dim=-1)
        count, mean, _ = _group_stats(scores, index)
        multi = count > 1
        n = torch.where(multi, count, torch.full_like(count, 2.0))
        loo = scores * n / (n - 1) - mean * n / (n - 1)
        scores = torch.where(multi, loo, scores)
        advantages = scores.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@register_adv_est("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Discounted return-to-go over model tokens; returns (masked-whitened returns * mask, returns).

    As verl 0.9.1: a masked token (a tool or user turn inside a multi-turn response, or padding)
    gets return 0 and carries the running return through unchanged, so a final reward reaches
    the model's turns before the tool's span, undiscounted by the span's length.
    """
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[-1])):
            new_running = token_level_rewards[:, t] + gamma * running
            returns[:, t] = new_running * mask[:, t]
            running = new_running * mask[:, t] + running * (1 - mask[:, t])
        advantages = masked_whiten(returns, response_mask) * mask
    return advantages, returns


# --------------------------------------------------------------------------- losses


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Reduce a per-token loss to a scalar with one of verl's four ``loss_agg_mode`` values."""
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    seq_sums = masked_sum(loss_mat, loss_mask, dim=-1)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return seq_sums.sum() / loss_mat.shape[-1]
    seq_lens = loss_mask.to(loss_mat.dtype).sum(dim=-1)
    # Fully masked rows (e.g. filler in a micro-batch) would otherwise dilute the sequence mean.
    seq_present = (seq_lens > 0).to(loss_mat.dtype)
    if loss_agg_mode == "seq-mean-token-sum":
        return masked_mean(seq_sums, seq_present)
    if loss_agg_mode == "seq-mean-token-mean":
        return masked_mean(masked_mean(loss_mat, loss_mask, dim=-1), seq_present)
    raise ValueError(
        f"unknown loss_agg_mode {loss_agg_mode!r}; choose one of: token-mean, seq-mean-token-sum, "
        "seq-mean-token-mean, seq-mean-token-sum-norm"
    )


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


def keep_mixed_groups(metric: Sequence[float], index: IndexLike) -> list[bool]:
    """DAPO's dynamic-sampling filter: per sample, whether its group (samples sharing an
    ``index``) is kept. A group is kept when its metric values differ (population std > 0),
    or when it has a single sample; a group that all scores alike gives a group estimator
    zero advantage everywhere."""
    ids = _group_ids(index, len(metric))
    values: dict[Hashable, list[float]] = {}
    for group, value in zip(ids, metric, strict=True):
        values.setdefault(group, []).append(float(value))
    keep = {group: len(v) == 1 or float(np.std(v)) > 0 for group, v in values.items()}
    return [keep[group] for group in ids]


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss ``0.5*agg(max((v-R)^2, (vclip-R)^2))``; returns (vf_loss, vf_clipfrac)."""
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(vf_losses1, vf_losses2), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean((vf_losses2 > vf_losses1).to(vpreds.dtype), response_mask)
    return vf_loss, vf_clipfrac


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim, as ``logsumexp(logits) - sum(softmax * logits)``."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)


def compute_entropy_loss(
    entropy: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """``agg_loss(entropy)``; the actor adds ``-entropy_coeff * entropy_loss`` to its loss."""
    return agg_loss(entropy, response_mask, loss_agg_mode)


# --------------------------------------------------------------------------- KL


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
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
    raise ValueError(f"unknown kl_penalty {kl_penalty!r}; choose one of: kl, k1, abs, mse, k2, low_var_kl, k3")


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
