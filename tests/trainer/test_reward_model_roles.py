"""A reward model scores the responses from the ranks that host it, by the same code in
both ways of running the ranks: beside the actor on a Ray actor rank (`rlkube-trainer run`),
and on the one rank of `--in-process`. The HF generate rollout keeps these quick."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiny_model import save_reward_model

from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.loop.driver import run_in_process
from rlkube_trainer.tiny.task import init


def _raw_config(tmp_path: Path) -> dict[str, object]:
    raw = yaml.safe_load(init(tmp_path, "grpo", steps=2).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 8
    raw["actor"]["ppo_mini_batch_size"] = 4
    raw["actor"]["ppo_micro_batch_size_per_gpu"] = 32  # one rank's mini-batch: 4 prompts × 8 samples
    raw["reward"] = {"model": {"path": str(save_reward_model(tmp_path / "rm"))}}
    return raw


def _scores_are_the_models(history: list[dict[str, float]]) -> None:
    assert len(history) == 2
    for row in history:
        # A random reward model's scores: finite, and not the tiny task's 0/1 rule.
        assert math.isfinite(row["critic/score/mean"])
        assert row["critic/score/mean"] not in (0.0, 1.0)


@pytest.mark.trainer
def test_in_process(tmp_path: Path) -> None:
    result = run_in_process(parse_trainer_config(_raw_config(tmp_path)), progress=False)
    _scores_are_the_models(result.history)


@pytest.mark.trainer
def test_beside_the_actor_on_ray_ranks(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_raw_config(tmp_path)))
    result = subprocess.run(
        [sys.executable, "-m", "rlkube_trainer.pod.cli", "run", str(config), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ready: actor rank 0" in result.stderr and "actor, reward, rollout)" in result.stderr
    metrics = tmp_path / "checkpoints" / "metrics.jsonl"
    _scores_are_the_models([json.loads(line) for line in metrics.read_text().splitlines()])
