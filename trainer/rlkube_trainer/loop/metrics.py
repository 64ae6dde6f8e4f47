"""Step metrics with verl's names (critic/score/mean, response_length/mean,
perf/throughput, ...): what users grep for, and what the driver exports to
Prometheus with '/' turned into '_' under the rlkube_ prefix."""

from __future__ import annotations

import torch

from rlkube_trainer.algos import masked_mean, masked_sum
from rlkube_trainer.batch import TrainBatch

Metrics = dict[str, float]


def _stats(prefix: str, values: torch.Tensor) -> Metrics:
    return {
        f"{prefix}/mean": values.float().mean().item(),
        f"{prefix}/max": values.float().max().item(),
        f"{prefix}/min": values.float().min().item(),
    }


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> Metrics:
    picked = values[mask.bool()]
    if picked.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": masked_mean(values, mask).item(),
        f"{prefix}/max": picked.max().item(),
        f"{prefix}/min": picked.min().item(),
    }


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """verl's critic/vf_explained_var: ``1 - var(returns - values) / (var(returns) + 1e-5)`` over
    the response tokens (unbiased variances); 1 is a perfect critic, 0 one no better than a constant."""
    picked = mask.bool()
    valid_returns, valid_values = returns[picked], values[picked]
    return (1.0 - torch.var(valid_returns - valid_values) / (torch.var(valid_returns) + 1e-5)).item()


def compute_data_metrics(batch: TrainBatch, max_prompt_length: int | None = None) -> Metrics:
    """A batch's data metrics with verl's names; with `max_prompt_length` (data.max_prompt_length)
    also the share of prompts that reach it (prompt_length/clip_ratio)."""
    assert batch.token_level_scores is not None and batch.token_level_rewards is not None
    assert batch.advantages is not None and batch.returns is not None
    mask = batch.response_mask
    response_length = mask.sum(-1)
    metrics: Metrics = {}
    metrics.update(_stats("critic/score", batch.token_level_scores.sum(-1)))
    metrics.update(_stats("critic/rewards", batch.token_level_rewards.sum(-1)))
    metrics.update(_masked_stats("critic/advantages", batch.advantages, mask))
    metrics.update(_masked_stats("critic/returns", batch.returns, mask))
    if batch.values is not None:
        metrics.update(_masked_stats("critic/values", batch.values, mask))
        if int(mask.sum()) >= 2:  # no (unbiased) variance of fewer tokens
            metrics["critic/vf_explained_var"] = explained_variance(batch.returns, batch.values, mask)
    metrics.update(_stats("response_length", response_length))
    clipped = response_length >= batch.response_length
    metrics["response_length/clip_ratio"] = clipped.float().mean().item()
    # Aborted responses (no token generated) would drag the length statistics toward 0.
    aborted = response_length == 0
    metrics["response/aborted_ratio"] = aborted.float().mean().item()
    if bool((~aborted).any()):
        metrics.update(_stats("response_length_non_aborted", response_length[~aborted]))
        metrics["response_length_non_aborted/clip_ratio"] = clipped[~aborted].float().mean().item()
    metrics.update(_stats("prompt_length", batch.prompt_lengths))
    if max_prompt_length is not None:
        metrics["prompt_length/clip_ratio"] = (batch.prompt_lengths >= max_prompt_length).float().mean().item()
    # Multi-turn episodes: num_turns/*, tool_call_counts/*, agent_loop/tool_calls/* (verl's), ...
    for name, values in batch.episode.items():
        metrics.update(_stats(name, values))
    return metrics


def compute_throughput_metrics(batch: TrainBatch, step_seconds: float, num_gpus: int) -> Metrics:
    """perf/throughput as verl defines it: prompt + response tokens per second per GPU."""
    tokens = int(batch.attention_mask.sum().item())
    return {
        "perf/total_num_tokens": float(tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": tokens / step_seconds / max(num_gpus, 1),
    }


def compute_variance_proxy_metrics(batch: TrainBatch, gradient_norm: float | None = None) -> Metrics:
    """verl's variance_proxy/*: cheap estimates of the policy gradient's variance, reported
    whenever the batch carries the actor's sum_pi_squared (here: the optimal token baselines).

    Per sequence, ``W = sum_t (1 - 2*pi_t + sum(pi^2)_t)`` over its response tokens (the
    squared norm of its score function, up to the model's Jacobian) and ``A`` its mean advantage.
    proxy2_total_power is ``E[A^2 * max(W, 0)]``; with rollout-correction weights each term is
    ``rho^2 * A^2 * max(W, 0)`` with rho a sequence's mean weight. proxy1_signal_strength is the
    squared gradient norm of the update, and proxy3_pure_noise ``(proxy2 - proxy1) / (N - 1)``
    (at least 0); both 0 without a gradient norm. expected_w is the mean of W, each token's term
    times its squared weight when weighted."""
    if batch.sum_pi_squared is None or batch.old_log_probs is None or batch.advantages is None:
        return {}
    mask = batch.response_mask
    w_token = 1 - 2 * batch.old_log_probs.exp() + batch.sum_pi_squared
    advantage = masked_mean(batch.advantages, mask, dim=-1)
    weights = batch.rollout_is_weights
    if weights is None:
        w = masked_sum(w_token, mask, dim=-1)
        total_power = (advantage**2 * w.clamp(min=0.0)).mean()
    else:
        # verl weighs W by rho^2 token by token, then judges each sequence by its mean weight.
        w = masked_sum(w_token * weights**2, mask, dim=-1)
        rho = masked_mean(weights, mask, dim=-1)
        # W unweighted again, as verl recovers it (a weight below 1e-5 does not fully cancel).
        unweighted = masked_sum(w_token * weights**2 / (weights**2).clamp(min=1e-10), mask, dim=-1)
        total_power = (rho**2 * advantage**2 * unweighted.clamp(min=0.0)).mean()
    signal = gradient_norm**2 if gradient_norm is not None else None
    samples = advantage.shape[0]
    noise = max(0.0, (total_power.item() - signal) / (samples - 1)) if signal is not None and samples > 1 else 0.0
    return {
        "variance_proxy/proxy1_signal_strength": signal if signal is not None else 0.0,
        "variance_proxy/proxy2_total_power": total_power.item(),
        "variance_proxy/proxy3_pure_noise": noise,
        "variance_proxy/expected_a_squared": (advantage**2).mean().item(),
        "variance_proxy/expected_w": w.mean().item(),
    }
