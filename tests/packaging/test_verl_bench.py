"""bench/gpu/verl_bench.py: verl's step metrics parsed from its console and file loggers, the
summary grpo_bench.py's report reads, and the main_ppo overrides derived from the bench shape.

The samples in data/ were written by verl 0.9.1's own Tracking(["console", "file"]) (numpy
scalars print as np.float64(...) in its console lines; Ray prefixes the TaskRunner's output)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "gpu" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vb() -> ModuleType:
    return _load("verl_bench")


def test_console_and_file_logger_parse_alike(vb: ModuleType) -> None:
    console = vb.parse_console((DATA / "verl-0.9.1-sample.log").read_text())
    jsonl = vb.parse_jsonl((DATA / "verl-0.9.1-sample.jsonl").read_text())
    assert [m["step"] for m in console] == [1.0, 2.0, 3.0]
    assert len(console) == len(jsonl)
    for from_console, from_file in zip(console, jsonl, strict=True):
        assert from_console == pytest.approx(from_file)
    assert console[0]["actor/pg_loss"] == pytest.approx(-0.0123)  # np.float64(...) unwrapped
    assert console[1]["timing_s/gen"] == 10.0
    assert console[2]["perf/throughput"] == pytest.approx(512 * 768 / 25.0)


def test_summary_skips_warm_up_and_reports_in_rlkube_names(vb: ModuleType, tmp_path: Path) -> None:
    gb = sys.modules["grpo_bench"]
    history = vb.parse_jsonl((DATA / "verl-0.9.1-sample.jsonl").read_text())
    res = vb.write_result(tmp_path / "verl.json", history, gb.FULL_SHAPE, {"env": {"verl_site_verl": "0.9.1"}})
    summary = res["summary"]
    assert summary["steps_averaged"] == 2
    assert summary["timing_s/step"] == pytest.approx((22.0 + 25.0) / 2)
    assert summary["perf/throughput"] == pytest.approx((512 * 768 / 22.0 + 512 * 768 / 25.0) / 2)
    assert summary["gen_tokens_per_s"] == pytest.approx(512 * 512 / 11.0)
    assert "errors" not in res

    short = [dict(m, **{"response_length/mean": 300.0}) for m in history]
    bad = vb.write_result(tmp_path / "verl-short.json", short, gb.FULL_SHAPE, {})
    assert "shape" in bad["errors"]


def test_report_has_verl_row_and_ratio(vb: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gb = sys.modules["grpo_bench"]
    history = vb.parse_console((DATA / "verl-0.9.1-sample.log").read_text())
    vb.write_result(tmp_path / "verl.json", history, gb.FULL_SHAPE, {"env": {"verl_site_verl": "0.9.1"}})
    verl_tps = json.loads((tmp_path / "verl.json").read_text())["summary"]["perf/throughput"]
    rl = {"grpo": {"perf/throughput": 2 * verl_tps, "timing_s/step": 5.0, "gen_tokens_per_s": 1.0}}
    (tmp_path / "rlkube.json").write_text(json.dumps(rl))
    assert gb.report([tmp_path / "rlkube.json", tmp_path / "verl.json"]) == 0
    out = capsys.readouterr().out
    assert f"| verl 0.9.1 GRPO (verl) | {verl_tps:,.0f} | 23.50 | 11.00 |" in out
    # The goals table: the throughput goal beside the ratio measured.
    assert "| rlkube GRPO / verl (verl) | 1.3x | 2.00x |" in out


def test_overrides_follow_the_bench_shape(vb: ModuleType, tmp_path: Path) -> None:
    args = argparse.Namespace(
        tiny=False,
        max_token_len=0,
        micro=16,
        dynamic_bsz=True,
        remove_padding=False,
        attn="sdpa",
        gradient_checkpointing=False,
        gpu_util=0.5,
        free_cache_engine=True,
        steps=4,
        extra=["trainer.seed=3"],
    )
    ov = dict(o.lstrip("+").split("=", 1) for o in vb.overrides(args, vb.paths(tmp_path, tiny=False)))
    assert ov["algorithm.adv_estimator"] == "grpo"
    assert ov["data.train_batch_size"] == "64" and ov["actor_rollout_ref.actor.ppo_mini_batch_size"] == "64"
    assert ov["actor_rollout_ref.rollout.n"] == "8" and ov["actor_rollout_ref.rollout.ignore_eos"] == "True"
    assert (ov["data.max_prompt_length"], ov["data.max_response_length"]) == ("256", "512")
    assert ov["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == str(16 * 768)
    assert ov["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    assert ov["trainer.total_training_steps"] == "4" and ov["trainer.seed"] == "3"
