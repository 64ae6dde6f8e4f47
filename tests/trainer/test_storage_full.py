"""A full volume, for real: the tiny job in this process (`rlkube-trainer run --in-process`, as
users run it) with its checkpoint directory on a small tmpfs that a ballast file fills mid-run.

1. Full after step 2's checkpoint: step 3's metrics row does not fit. The run exits
   STORAGE_FULL naming the mount point and metrics.jsonl, and metrics.jsonl holds whole rows.
2. Room for rows but not for a checkpoint: step 4's save fails inside the rank's write; the
   exit names the volume and the part, the staging dir is gone and step 2 stays the latest.
3. Space freed: the run resumes from step 2 and ends at step 4 with one row per step.

Needs root (mount); skipped elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlkube_api.exit_codes import ExitCode
from rlkube_trainer.checkpoint.manager import CheckpointManager
from rlkube_trainer.pod import cli
from rlkube_trainer.tiny.task import init
from tests.trainer.small_volume import fill, tmpfs

STEPS = 4
VOLUME_BYTES = 64 * 2**20
# Left free for the second run: several metrics rows, far less than a checkpoint.
ROOM_FOR_ROWS = 64 * 2**10


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "volume", VOLUME_BYTES) as mount:
        yield mount


def write_config(tmp_path: Path, checkpoints: Path) -> Path:
    raw: dict[str, Any] = yaml.safe_load(init(tmp_path / "task", "grpo", steps=STEPS).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 4
    raw["actor"].update(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=8)
    raw["trainer"].update(save_freq=2, logger=["console"], test_freq=-1)
    raw["checkpoint"] = {**raw.get("checkpoint", {}), "dir": str(checkpoints), "export_hf": "never"}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def run(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["run", str(config), "--in-process", "--no-progress"])
    return code, capsys.readouterr().err


def steps_logged(volume: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (volume / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.trainer
def test_a_full_volume_is_named_and_the_run_resumes_once_space_is_freed(
    tmp_path: Path, volume: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, volume)
    checkpoints = CheckpointManager(volume, max_to_keep=3)

    # 1. The volume fills up right after step 2's checkpoint is committed.
    commit = CheckpointManager.commit

    def commit_then_fill(self: CheckpointManager, step: int, *args: Any, **kwargs: Any) -> Any:
        path = commit(self, step, *args, **kwargs)
        if step == 2:
            fill(volume)
        return path

    with monkeypatch.context() as patched:
        patched.setattr(CheckpointManager, "commit", commit_then_fill)
        code, said = run(config, capsys)
    assert code == ExitCode.STORAGE_FULL, said
    assert f"on the volume mounted at {volume}" in said
    assert f"writing {volume / 'metrics.jsonl'}" in said
    assert steps_logged(volume) == [1, 2]  # whole rows only: the torn one was cut back
    assert checkpoints.latest() is not None and checkpoints.latest().step == 2  # type: ignore[union-attr]

    # 2. Room for step 3's row, not for step 4's checkpoint: the rank's save fails.
    (volume / "ballast").unlink()
    fill(volume, leave=ROOM_FOR_ROWS)
    code, said = run(config, capsys)
    assert code == ExitCode.STORAGE_FULL, said
    assert f"on the volume mounted at {volume}" in said
    assert f"writing {volume / '.tmp-step_000004'}" in said
    assert not (volume / ".tmp-step_000004").exists()  # its space given back
    assert checkpoints.latest().step == 2  # type: ignore[union-attr]
    assert steps_logged(volume) == [1, 2, 3]

    # 3. Space freed: resumed from step 2, steps 3 and 4 trained once more, each row once.
    (volume / "ballast").unlink()
    code, said = run(config, capsys)
    assert code == 0, said
    assert steps_logged(volume) == [1, 2, 3, 4]
    assert checkpoints.latest().step == 4  # type: ignore[union-attr]
    # What the run used, reported at its start beside its metrics (loop/effective_settings.py).
    settings = json.loads((volume / "effective-settings.json").read_text())
    lr = yaml.safe_load(config.read_text())["actor"]["optim"]["lr"]
    assert settings["ranks"]["actor"]["actor"]["optimizer"]["param_groups"][0]["lr"] == lr
    assert settings["ranks"]["actor"]["rollout_engine"]["class"] == "HFRolloutEngine"
