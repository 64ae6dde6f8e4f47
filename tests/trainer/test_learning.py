"""The learning test: on the tiny task (answer the first of three digits), a
random-initialised model trained with real vLLM (CPU) rollout raises its mean
reward from the first step's (about 0.1: chance) to at least 0.8, for GRPO and
for PPO with a critic. Runs `rlkube-trainer run` as users do, in a subprocess
(vLLM wants one engine per process). Asserts the reward, never the time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlkube_trainer.tiny_task import init

# (estimator, step budget); each run takes about 2-4 minutes on 2 cores.
BUDGETS = [("grpo", 60), ("gae", 90)]


@pytest.mark.trainer
@pytest.mark.slow
@pytest.mark.parametrize(("estimator", "steps"), BUDGETS, ids=[b[0] for b in BUDGETS])
def test_tiny_task_is_learned(tmp_path: Path, estimator: str, steps: int) -> None:
    config = init(tmp_path, estimator, steps)
    result = subprocess.run(
        [sys.executable, "-m", "rlkube_trainer.cli", "run", str(config), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    scores = [r["critic/score/mean"] for r in rows]
    assert len(scores) == steps
    assert scores[0] < 0.3, f"the first step should score near chance (0.1), got {scores[0]}"
    final = sum(scores[-5:]) / 5
    assert final >= 0.8, f"{estimator}: mean reward of the last 5 steps {final:.3f} < 0.8; curve {scores}"
    assert (tmp_path / "checkpoints" / "curves.png").stat().st_size > 0
