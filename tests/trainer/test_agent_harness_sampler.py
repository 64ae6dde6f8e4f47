"""What a batch of harness episodes comes to, without an engine: a group with a lost episode is
left out whole, the kept groups are cut to split evenly over the training ranks, the losses are
counted, and a batch that keeps nothing fails naming the harness and why. The built-in scorer
trains on the reward the harness reported."""

from __future__ import annotations

import numpy as np
import pytest

from rlkube_trainer.data.prompts import Prompt
from rlkube_trainer.rollout.base import RolloutSample
from rlkube_trainer.rollout.endpoint.harness import Outcome
from rlkube_trainer.rollout.endpoint.recorder import EpisodeRecord
from rlkube_trainer.rollout.endpoint.sampler import (
    EPISODES_LOST,
    GROUPS_DROPPED,
    HarnessError,
    episode_task,
    kept_groups,
)
from rlkube_trainer.scorers import default_compute_score
from rlkube_trainer.scorers.harness import compute_score

COMMAND = ["python", "/app/agent.py", "--fast"]


def outcomes(lost: set[int], total: int) -> list[Outcome]:
    return [
        Outcome(f"b0-{k}", None, "the harness made no call")
        if k in lost
        else Outcome(f"b0-{k}", EpisodeRecord(f"b0-{k}"), None)
        for k in range(total)
    ]


def to_sample(prompt_index: int, record: EpisodeRecord) -> RolloutSample:
    return RolloutSample(prompt_index, [1], None, "stop")


def test_a_group_with_a_lost_episode_is_left_out_whole_and_counted() -> None:
    order = [0, 0, 1, 1, 2, 2]
    batch = kept_groups(order, outcomes({3}, 6), 2, 1, to_sample, COMMAND)
    assert [s.prompt_index for s in batch.samples] == [0, 0, 2, 2]
    assert batch.metrics == {EPISODES_LOST: 1.0, GROUPS_DROPPED: 1.0}


def test_the_kept_groups_split_evenly_over_the_training_ranks() -> None:
    # 3 whole groups of 2 samples over 4 ranks: 2 groups (4 samples) kept, the third dropped too.
    order = [0, 0, 1, 1, 2, 2, 3, 3]
    batch = kept_groups(order, outcomes({7}, 8), 2, 4, to_sample, COMMAND)
    assert [s.prompt_index for s in batch.samples] == [0, 0, 1, 1]
    assert batch.metrics == {EPISODES_LOST: 1.0, GROUPS_DROPPED: 2.0}
    # Nothing lost: the batch is the caller's, split evenly or not (validation's prompts need not be).
    assert len(kept_groups(order, outcomes(set(), 8), 2, 3, to_sample, COMMAND)) == 8


def test_a_batch_that_keeps_no_group_fails_naming_the_harness_and_the_losses() -> None:
    with pytest.raises(HarnessError) as lost:
        kept_groups([0, 0, 1, 1], outcomes({0, 3}, 4), 2, 1, to_sample, COMMAND)
    message = str(lost.value)
    assert "python /app/agent.py --fast" in message and "2 of 4 episodes lost" in message
    assert "b0-0: the harness made no call; b0-3: the harness made no call" in message
    # One whole group left, too few for 4 ranks.
    with pytest.raises(HarnessError, match="1 whole groups, too few to split evenly"):
        kept_groups([0, 0, 1, 1], outcomes({3}, 4), 2, 4, to_sample, COMMAND)


def test_the_episode_task_is_the_row_in_plain_json() -> None:
    row = Prompt(3, "train.parquet#3", [1, 2], "2 5 =", "2 5 =", "tiny", np.array(["2"]), {"index": 3})
    task = episode_task(row)
    assert task == {
        "prompt": [{"role": "user", "content": "2 5 ="}],
        "data_source": "tiny",
        "ground_truth": ["2"],
        "extra_info": {"index": 3},
        "index": 3,
        "uid": "train.parquet#3",
    }


def test_the_built_in_scorer_trains_on_the_harness_reward() -> None:
    # Whatever the data source, a reported reward is the score; without one, the data source's scorer.
    assert default_compute_score("openai/gsm8k", "#### 1", "2", {"harness_reward": 0.75}) == {"score": 0.75}
    assert default_compute_score("openai/gsm8k", "#### 2", "2", {"harness_reward": None})["score"] == 1.0
    assert compute_score("any", "", None, {"harness_reward": 1}) == 1.0
    with pytest.raises(ValueError, match="harness_reward is missing"):
        compute_score("any", "", None, {})
