"""`rlkube-trainer run` refuses a bad config before starting anything, naming the file and key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from rlkube_api.exit_codes import ExitCode
from rlkube_trainer.tiny_task import init


def test_wrong_key_and_value_are_named(tmp_path: Path) -> None:
    config = init(tmp_path, "grpo", steps=2)
    raw = yaml.safe_load(config.read_text())
    raw["actor"]["clip_ratio_c"] = 0.5
    raw["rollout"]["temprature"] = 1.0
    config.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, "-m", "rlkube_trainer.cli", "run", str(config)], capture_output=True, text=True, check=False
    )
    assert result.returncode == ExitCode.CONFIG
    assert str(config) in result.stderr
    assert "actor.clip_ratio_c: Input should be greater than 1" in result.stderr
    assert "rollout.temprature: Extra inputs are not permitted" in result.stderr
    assert "Traceback" not in result.stderr
