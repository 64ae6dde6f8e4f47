"""verl's data metrics (rlkube_trainer.loop.metrics) on a hand-built batch."""

from __future__ import annotations

import statistics

import pytest
import torch

from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.loop.metrics import compute_data_metrics, compute_variance_proxy_metrics


def batch_of(response_mask: list[list[float]], prompt_lengths: list[int]) -> TrainBatch:
    mask = torch.tensor(response_mask)
    rows, width = mask.shape
    batch = TrainBatch(
        input_ids=torch.zeros(rows, 4 + width, dtype=torch.long),
        attention_mask=torch.ones(rows, 4 + width, dtype=torch.long),
        responses=torch.zeros(rows, width, dtype=torch.long),
        response_mask=mask,
        group_index=torch.arange(rows),
        prompt_lengths=torch.tensor(prompt_lengths),
    )
    batch.token_level_scores = batch.token_level_rewards = torch.zeros(rows, width)
    batch.advantages = batch.returns = torch.zeros(rows, width)
    return batch


def test_aborted_responses_and_prompt_clip_ratio() -> None:
    # lengths 3 (clipped at the width 3), 1, 0 (aborted), 2; prompts 4 and 2 of max 4
    batch = batch_of([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]], [4, 2, 4, 3])
    metrics = compute_data_metrics(batch, max_prompt_length=4)
    assert metrics["response/aborted_ratio"] == 0.25
    assert metrics["response_length_non_aborted/mean"] == pytest.approx(2.0)
    assert metrics["response_length_non_aborted/min"] == 1.0
    assert metrics["response_length_non_aborted/clip_ratio"] == pytest.approx(1 / 3)
    assert metrics["response_length/mean"] == pytest.approx(1.5)  # the aborted 0 included
    assert metrics["prompt_length/clip_ratio"] == 0.5
    assert "critic/vf_explained_var" not in metrics  # no critic
    assert "prompt_length/clip_ratio" not in compute_data_metrics(batch)


def test_vf_explained_var_over_response_tokens() -> None:
    batch = batch_of([[1, 1, 1], [1, 0, 0]], [2, 2])
    batch.returns = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0]])
    batch.values = torch.tensor([[1.5, 2.0, 2.5], [3.0, -5.0, 7.0]])  # the padded values never count
    returns, diffs = [1.0, 2.0, 3.0, 4.0], [-0.5, 0.0, 0.5, 1.0]
    expected = 1 - statistics.variance(diffs) / (statistics.variance(returns) + 1e-5)
    metrics = compute_data_metrics(batch)
    assert metrics["critic/vf_explained_var"] == pytest.approx(expected, rel=1e-6)


def test_variance_proxy_by_hand() -> None:
    # pi of each sampled token 1/2 and sum(pi^2) 1/2: every token's W term is 1 - 1 + 1/2 = 1/2,
    # so W = (1, 1/2) over lengths 2 and 1; mean advantages A = (1, 2) (the padding's 99 unread).
    batch = batch_of([[1, 1], [1, 0]], [4, 4])
    batch.old_log_probs = torch.full((2, 2), 0.5).log()
    batch.sum_pi_squared = torch.full((2, 2), 0.5)
    batch.advantages = torch.tensor([[1.0, 1.0], [2.0, 99.0]])
    metrics = compute_variance_proxy_metrics(batch, gradient_norm=1.0)
    assert metrics == pytest.approx(
        {
            "variance_proxy/proxy1_signal_strength": 1.0,
            "variance_proxy/proxy2_total_power": (1 * 1 + 4 * 0.5) / 2,
            "variance_proxy/proxy3_pure_noise": (1.5 - 1.0) / (2 - 1),
            "variance_proxy/expected_a_squared": (1 + 4) / 2,
            "variance_proxy/expected_w": (1 + 0.5) / 2,
        }
    )
    # Rollout-correction weights 2 and 1: W weighted by rho^2 token by token for expected_w,
    # each sequence's term times its mean weight squared in the total power.
    batch.rollout_is_weights = torch.tensor([[2.0, 2.0], [1.0, 1.0]])
    weighted = compute_variance_proxy_metrics(batch)
    assert weighted["variance_proxy/expected_w"] == pytest.approx((4 + 0.5) / 2)
    assert weighted["variance_proxy/proxy2_total_power"] == pytest.approx((4 * 1 * 1 + 1 * 4 * 0.5) / 2)
    assert weighted["variance_proxy/proxy1_signal_strength"] == weighted["variance_proxy/proxy3_pure_noise"] == 0.0
    # Only where the actor computed sum(pi^2).
    batch.sum_pi_squared = None
    assert compute_variance_proxy_metrics(batch, gradient_norm=1.0) == {}
