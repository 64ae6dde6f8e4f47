"""verl's data metrics (rlkube_trainer.metrics) on a hand-built batch."""

from __future__ import annotations

import statistics

import pytest
import torch

from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.metrics import compute_data_metrics


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
