"""DAPO's dynamic sampling and overlong shaping, GSPO's loss, the built-in scorers and the
Hugging Face export at every save, each through the loop in one process (HF rollout)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.loop.driver import run_in_process
from rlkube_trainer.loop.ppo import PPOTrainer, TooManyGenerations
from rlkube_trainer.tiny.task import init

CONSTANT_REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"


def _raw(workdir: Path, steps: int = 1) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(init(workdir, "grpo", steps=steps).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 8
    raw["actor"]["ppo_mini_batch_size"] = 4
    raw["actor"]["ppo_micro_batch_size_per_gpu"] = 8
    raw["trainer"]["test_freq"] = -1
    return raw


def _constant_reward(workdir: Path, raw: dict[str, Any]) -> None:
    path = workdir / "constant.py"
    path.write_text(CONSTANT_REWARD)
    raw["reward"]["function"] = {"path": str(path)}


@pytest.mark.trainer
def test_dynamic_sampling_fills_the_batch_with_mixed_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _raw(tmp_path, steps=2)
    raw["algorithm"]["filter_groups"] = {"enable": True, "metric": "score", "max_num_gen_batches": 0}
    batches = []
    sample = PPOTrainer.sample

    def recording(self: PPOTrainer, *args: Any) -> Any:
        batch, metrics = sample(self, *args)
        batches.append(batch)
        return batch, metrics

    monkeypatch.setattr(PPOTrainer, "sample", recording)
    result = run_in_process(parse_trainer_config(raw), progress=False)
    n = raw["rollout"]["n"]
    for batch in batches:
        # Exactly train_batch_size prompts, each a whole group whose scores differ.
        assert len(batch) == 8 * n
        scores = batch.token_level_scores.sum(-1)
        groups = batch.group_index.tolist()
        assert len(set(groups)) == 8
        for group in set(groups):
            assert torch.std(scores[batch.group_index == group], unbiased=False) > 0
    # At chance (0.1 per sample) about 0.9^8 = 43% of the groups score all-zero: more rounds.
    for row in result.history:
        assert row["train/num_gen_batches"] >= 2
        assert 0 < row["train/kept_groups_ratio"] < 1


@pytest.mark.trainer
def test_dynamic_sampling_stops_at_the_cap(tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    _constant_reward(tmp_path, raw)  # every group alike: nothing is ever kept
    raw["algorithm"]["filter_groups"] = {"enable": True, "max_num_gen_batches": 3}
    with pytest.raises(TooManyGenerations, match=r"0 of 8 prompts kept after 3 generation rounds"):
        run_in_process(parse_trainer_config(raw), progress=False)


@pytest.mark.trainer
def test_overlong_buffer_penalises_long_responses(tmp_path: Path) -> None:
    raw = _raw(tmp_path, steps=2)
    _constant_reward(tmp_path, raw)
    raw["rollout"]["ignore_eos"] = True  # every response max_response_length (2) tokens long
    raw["reward"]["overlong_buffer"] = {"enable": True, "len": 1, "penalty_factor": 0.5, "log": True}
    for row in run_in_process(parse_trainer_config(raw), progress=False).history:
        # 2 tokens with a 1-token buffer at the end of 2: one token over, -0.5 * 1/1.
        assert row["reward_extra/overlong_reward/mean"] == pytest.approx(-0.5)
        assert row["reward_extra/overlong/mean"] == 1.0
        assert row["critic/score/mean"] == pytest.approx(1.0 - 0.5)


@pytest.mark.trainer
def test_gspo_policy_loss_runs_in_the_loop(tmp_path: Path) -> None:
    raw = _raw(tmp_path, steps=2)
    raw["actor"].update({"policy_loss": "gspo", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4})
    row = run_in_process(parse_trainer_config(raw), progress=False).history[-1]
    assert row["actor/pg_clipfrac_lower"] == 0.0  # GSPO has no dual clip


@pytest.mark.trainer
def test_built_in_scorers_without_a_reward_section(tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    data = tmp_path / "data" / "train.parquet"
    table = pq.read_table(data).to_pylist()
    for row in table:
        row["data_source"] = "openai/gsm8k"
    pq.write_table(pa.Table.from_pylist(table), data)
    del raw["reward"]
    row = run_in_process(parse_trainer_config(raw), progress=False).history[-1]
    assert row["critic/score/mean"] == 0.0  # digits, never a "#### answer" line


@pytest.mark.trainer
def test_export_hf_every_save(tmp_path: Path) -> None:
    raw = _raw(tmp_path, steps=2)
    raw["trainer"]["save_freq"] = 1
    raw["checkpoint"]["export_hf"] = "every_save"
    run_in_process(parse_trainer_config(raw), progress=False)
    checkpoints = tmp_path / "checkpoints"
    for step in (1, 2):
        exported = sorted(checkpoints.glob(f"*{step}/hf/config.json"))
        assert exported, sorted(str(p) for p in checkpoints.rglob("config.json"))
    assert (checkpoints / "hf" / "config.json").exists()  # and the final export as before


@pytest.mark.parametrize(("value", "meaning"), [(True, "final"), (False, "never"), ("every_save", "every_save")])
def test_export_hf_takes_the_old_booleans(tmp_path: Path, value: Any, meaning: str) -> None:
    raw = yaml.safe_load(init(tmp_path, "grpo", steps=1).read_text())
    raw["checkpoint"]["export_hf"] = value
    assert parse_trainer_config(raw).checkpoint.export_hf == meaning
