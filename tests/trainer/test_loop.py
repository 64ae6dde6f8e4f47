"""The PPO step with every role in one process (HF generate as the rollout, so
these run in seconds): each estimator and KL variant is selectable by name and
produces verl's metrics."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlkube_api.validation import parse_trainer_config
from rlkube_trainer import rollout
from rlkube_trainer.loop.driver import run_in_process
from rlkube_trainer.loop.scored import greedy_reward_baselines
from rlkube_trainer.tiny.task import init


def _config(workdir: Path, estimator: str, **overrides: Any) -> Any:
    raw = yaml.safe_load(init(workdir, estimator, steps=2).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 8
    raw["actor"]["ppo_mini_batch_size"] = 4
    raw["actor"]["ppo_micro_batch_size_per_gpu"] = 8
    for section, values in overrides.items():
        raw.setdefault(section, {}).update(values)
    return parse_trainer_config(raw)


VARIANTS = [
    ("grpo", {}, ["actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm"]),
    ("rloo", {}, ["actor/pg_loss"]),
    ("reinforce_plus_plus", {}, ["actor/pg_loss"]),
    ("gae", {}, ["critic/vf_loss", "critic/vf_clipfrac", "critic/values/mean", "critic/grad_norm"]),
    ("grpo", {"actor": {"use_kl_loss": True, "kl_loss_type": "low_var_kl"}}, ["actor/kl_loss", "actor/kl_coef"]),
    (
        "gae",
        {"algorithm": {"use_kl_in_reward": True, "kl_penalty": "kl"}},
        ["actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"],
    ),
    (
        "grpo",
        {"actor": {"entropy_coeff": 0.01, "optim": {"lr": 1e-3, "lr_warmup_steps": 2}}},
        ["actor/lr", "actor/entropy"],
    ),
    ("remax", {}, ["actor/pg_loss"]),
    ("optimal_token_baseline", {}, ["timing_s/old_log_prob", "variance_proxy/expected_w"]),
    (
        "grpo",
        {"rollout": {"calculate_log_probs": True}},
        ["training/rollout_probs_diff_mean", "training/rollout_probs_diff_max"],
    ),
]


@pytest.mark.trainer
@pytest.mark.parametrize(("estimator", "overrides", "expected"), VARIANTS)
def test_step_runs_and_reports_verl_metrics(
    tmp_path: Path, estimator: str, overrides: dict[str, Any], expected: list[str]
) -> None:
    config = _config(tmp_path, estimator, **overrides)
    result = run_in_process(config, progress=False)
    assert result.steps == 2
    metrics = result.history[-1]
    common = [
        "critic/score/mean",
        "critic/rewards/mean",
        "critic/advantages/mean",
        "response_length/mean",
        "timing_s/gen",
        "timing_s/update_actor",
        "timing_s/update_weights",
        "timing_s/step",
        "perf/throughput",
    ]
    for key in common + expected:
        assert key in metrics, f"{key} missing from {sorted(metrics)}"
        assert math.isfinite(metrics[key]), f"{key} = {metrics[key]}"
    assert metrics["perf/throughput"] > 0
    # The entropy is computed (and reported) only where it is part of the loss.
    assert ("actor/entropy" in metrics) == (config.actor.entropy_coeff != 0)
    if "training/rollout_probs_diff_mean" in metrics:
        # Engine and actor hold the same weights in fp32: the same policy, to rounding.
        assert metrics["training/rollout_probs_diff_mean"] < 1e-3


@pytest.mark.trainer
def test_lr_warmup_starts_from_zero(tmp_path: Path) -> None:
    config = _config(tmp_path, "grpo", actor={"optim": {"lr": 1e-3, "lr_warmup_steps": 2}})
    history = run_in_process(config, progress=False).history
    assert [round(h["actor/lr"], 9) for h in history] == [0.0, 5e-4]


# Fails every second call its process makes: with one worker, every second row of each batch.
FLAKY_REWARD = """
calls = 0

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global calls
    calls += 1
    if calls % 2 == 0:
        raise TimeoutError("the verifier's sandbox did not answer")
    return 1.0
"""


@pytest.mark.trainer
def test_reward_failures_scored_zero_are_counted_per_step(tmp_path: Path) -> None:
    """A reward function in a worker process (reward.numWorkers 1), its failures scored 0 under
    onFailure zero: the step reports how many rows of the batch failed."""
    reward = tmp_path / "flaky.py"
    reward.write_text(FLAKY_REWARD)
    config = _config(
        tmp_path, "grpo", reward={"function": {"path": str(reward)}, "num_workers": 1, "on_failure": "zero"}
    )
    history = run_in_process(config, progress=False).history
    samples = config.data.train_batch_size * config.rollout.n
    assert [h["reward/failed_samples"] for h in history] == [samples / 2] * 2
    assert [h["critic/score/mean"] for h in history] == [0.5] * 2


@pytest.mark.trainer
def test_the_vllm_engine_is_seeded_once_per_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One seed per generate call (no per-request generators); vLLM itself is not started."""
    built: dict[str, Any] = {}

    def fake_build(name: str, **kwargs: Any) -> None:
        built.update(kwargs, name=name)

    monkeypatch.setattr(rollout, "build_rollout_engine", fake_build)
    config = parse_trainer_config(yaml.safe_load(init(tmp_path, "grpo", steps=1).read_text()))
    rollout.build_engine(config, torch.device("cpu"))
    assert built["name"] == "vllm"
    assert built["seed_mode"] == "batch"
    assert built["seed"] == config.trainer.seed
    # The engine's scheduling settings come from the rollout section.
    assert built["enable_prefix_caching"] is config.rollout.enable_prefix_caching
    assert (built["max_num_seqs"], built["max_num_batched_tokens"]) == (None, None)


def test_each_sample_gets_its_prompts_greedy_reward() -> None:
    # Prompt 0 sampled three times, prompt 1 once, prompt 2 twice (interleaved, as after filtering
    # or a sort); the greedy batch has one response per prompt, in another order.
    baselines = greedy_reward_baselines([0, 0, 1, 2, 0, 2], [2, 0, 1], [0.25, 1.0, -0.5])
    assert baselines.tolist() == [1.0, 1.0, -0.5, 0.25, 1.0, 0.25]
    assert baselines.dtype == torch.float32


def test_greedy_baselines_refuse_a_missing_or_doubled_prompt() -> None:
    with pytest.raises(ValueError, match=r"prompts \[1\] have samples but no greedy response"):
        greedy_reward_baselines([0, 1, 1], [0], [1.0])
    with pytest.raises(ValueError, match="prompt 0 has more than one greedy response"):
        greedy_reward_baselines([0], [0, 0], [1.0, 0.0])
