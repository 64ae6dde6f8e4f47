"""Step metrics with verl's names (critic/score/mean, response_length/mean,
perf/throughput, ...): what users grep for, and what the driver exports to
Prometheus with '/' turned into '_' under the rlkube_ prefix."""

from __future__ import annotations

import torch

from rlkube_trainer.algos import masked_mean
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
    return metrics


def compute_throughput_metrics(batch: TrainBatch, step_seconds: float, num_gpus: int) -> Metrics:
    """perf/throughput as verl defines it: prompt + response tokens per second per GPU."""
    tokens = int(batch.attention_mask.sum().item())
    return {
        "perf/total_num_tokens": float(tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": tokens / step_seconds / max(num_gpus, 1),
    }
