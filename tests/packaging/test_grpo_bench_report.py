"""bench/gpu/grpo_bench.py's `report`: the one table from the JSON files of one machine's run,
read from real results of one H100 run kept in data/grpo-report/ (rlkube GRPO and PPO, TRL at
0.5B, verl, rlkube at 3B) plus a TRL run at 3B, which the report must put beside rlkube's 3B row,
not beside the 0.5B runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.packaging.test_verl_bench import DATA, _load

RESULTS = DATA / "grpo-report"


def _report(paths: list[Path], capsys: pytest.CaptureFixture[str]) -> str:
    assert _load("grpo_bench").report(paths) == 0
    return capsys.readouterr().out


def test_the_table_holds_every_system_and_the_goals(capsys: pytest.CaptureFixture[str]) -> None:
    names = ["rlkube-ppo-compiled.json", "trl-hf.json", "verl.json"]
    out = _report([RESULTS / name for name in names], capsys)
    assert "| rlkube grpo (rlkube-ppo-compiled) | 39,513 |" in out
    assert "| rlkube ppo (rlkube-ppo-compiled) | 30,110 |" in out
    assert "| TRL GRPOTrainer, hf generation (trl-hf) | 24,192 |" in out
    assert "| rlkube GRPO / TRL (trl-hf) | 2.5x | 1.63x |" in out
    assert "| rlkube GRPO / verl (verl) | 1.3x | 2.85x |" in out
    assert "| PPO with critic / GRPO (same run) | 0.75x | rlkube-ppo-compiled 0.76x |" in out


def test_trl_at_another_size_goes_beside_rlkube_at_that_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trl = json.loads((RESULTS / "trl-hf.json").read_text())
    # A TRL run at 3B, as scale_bench.py trl writes it: a step twice the 3B rlkube step's.
    rlkube_3b = json.loads((RESULTS / "scale-3b.json").read_text())[0]["means"]["perf/throughput"]
    tokens = 32 * 8 * (256 + 512)
    trl["arch"] = "3b"
    trl["summary"] = {**trl["summary"], "throughput": rlkube_3b / 2, "step_s": tokens / (rlkube_3b / 2)}
    (tmp_path / "trl-3b.json").write_text(json.dumps(trl))
    for name in ("rlkube-ppo-compiled.json", "trl-hf.json", "scale-3b.json"):
        shutil.copy(RESULTS / name, tmp_path / name)
    out = _report(sorted(tmp_path.glob("*.json")), capsys)
    assert "| 3b | rlkube (bf16 master) | 8,842 |" in out
    assert "| 3b | TRL GRPOTrainer, hf generation, bfloat16 (trl-3b) | 4,421 |" in out
    assert "rlkube / TRL at 3b: 2.00x" in out
    # The 0.5B comparison is TRL's 0.5B run alone.
    assert "| rlkube GRPO / TRL (trl-hf) | 2.5x | 1.63x |" in out
    assert "trl-3b) | 2.5x" not in out
