"""A checkpoint folder belongs to one RLJob: a gang restart of that job resumes from it; another
job (or the same name created again, with a new UID) is refused unless checkpoint.adopt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlkube_api.names import Env
from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.checkpoint.owner import (
    OWNER_FILE,
    CheckpointDirTaken,
    JobIdentity,
    claim,
    identity_from_env,
    owner_of,
)
from rlkube_trainer.loop.driver import run_in_process
from rlkube_trainer.tiny.task import init

FIRST = JobIdentity("ml", "grpo", "uid-1")
RECREATED = JobIdentity("ml", "grpo", "uid-2")  # deleted and applied again: same name, new UID


def test_a_fresh_folder_is_claimed_and_its_own_job_comes_back_to_it(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    claim(root, FIRST, adopt=False)
    assert owner_of(root) == FIRST
    (root / "latest").write_text("step_000010")
    claim(root, FIRST, adopt=False)  # a gang restart of the same job
    assert json.loads((root / OWNER_FILE).read_text()) == {"namespace": "ml", "name": "grpo", "uid": "uid-1"}


def test_another_jobs_run_is_refused_naming_it_unless_adopted(tmp_path: Path) -> None:
    claim(tmp_path, FIRST, adopt=False)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(CheckpointDirTaken, match=r"holds the run of RLJob ml/grpo \(uid uid-1\).*checkpoint.adopt"):
        claim(tmp_path, RECREATED, adopt=False)
    assert owner_of(tmp_path) == FIRST
    claim(tmp_path, RECREATED, adopt=True)
    assert owner_of(tmp_path) == RECREATED
    claim(tmp_path, RECREATED, adopt=False)  # now its own


@pytest.mark.parametrize("left", ["latest", "metrics.jsonl", "step_000020"])
def test_a_run_without_an_owner_file_is_someone_elses(tmp_path: Path, left: str) -> None:
    (tmp_path / left).mkdir() if left.startswith("step_") else (tmp_path / left).write_text("x")
    with pytest.raises(CheckpointDirTaken, match=f"a run with no {OWNER_FILE}"):
        claim(tmp_path, FIRST, adopt=False)


def test_a_folder_without_a_run_is_fresh(tmp_path: Path) -> None:
    (tmp_path / "unrelated.txt").write_text("x")
    claim(tmp_path, FIRST, adopt=False)
    assert owner_of(tmp_path) == FIRST


def test_the_identity_comes_from_the_operators_environment() -> None:
    env = {Env.NAMESPACE: "ml", Env.JOB_NAME: "grpo", Env.JOB_UID: "uid-1"}
    assert identity_from_env(env) == FIRST
    assert identity_from_env({Env.NAMESPACE: "ml", Env.JOB_NAME: "grpo"}) is None  # rlkube-trainer run


@pytest.mark.trainer
def test_a_recreated_job_does_not_silently_resume_the_old_run(tmp_path: Path) -> None:
    raw = yaml.safe_load(init(tmp_path, "grpo", steps=1).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 8
    raw["actor"].update(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=8)
    raw["trainer"].update(save_freq=1, logger=["console"])
    config = parse_trainer_config(raw)
    assert run_in_process(config, progress=False, job=FIRST).steps == 1
    with pytest.raises(CheckpointDirTaken, match="uid uid-1"):
        run_in_process(config, progress=False, job=RECREATED)
    adopted = config.model_copy(update={"checkpoint": config.checkpoint.model_copy(update={"adopt": True})})
    longer = adopted.model_copy(update={"trainer": adopted.trainer.model_copy(update={"total_training_steps": 2})})
    result = run_in_process(longer, progress=False, job=RECREATED)
    # Resumed at step 1's checkpoint: one more step, one row per step in metrics.jsonl.
    assert [int(row["step"]) for row in result.history] == [1, 2]
