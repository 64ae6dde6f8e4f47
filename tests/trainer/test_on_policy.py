"""An on-policy step (one PPO epoch, one mini-batch, nothing reading the old log-probs before
the update) skips the old-log-prob pass: the update's own log-probs, detached, are the old
ones. Same update as with the pass, to rounding; the pass still runs wherever the weights
change between it and the update's forward, or something reads it first."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.loop.driver import run_in_process
from rlkube_trainer.loop.ppo import on_policy
from rlkube_trainer.tiny.task import init
from rlkube_trainer.workers.builders import build_actor

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_probe import SAMPLES, global_batch


def config(workdir: Path, **actor: Any) -> Any:
    raw = yaml.safe_load(init(workdir, "grpo", steps=2).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = SAMPLES // 8
    raw["actor"].update({"ppo_mini_batch_size": SAMPLES // 8, "ppo_micro_batch_size_per_gpu": 4, **actor})
    return parse_trainer_config(raw)


@pytest.mark.trainer
def test_the_update_without_old_log_probs_equals_the_one_with_them(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert on_policy(cfg, SAMPLES)
    results = []
    for recompute in (True, False):
        torch.manual_seed(0)
        actor = build_actor(cfg, torch.device("cpu"), total_steps=10)
        batch = global_batch(int(actor.model.config.vocab_size))  # type: ignore[union-attr]
        if recompute:
            batch.old_log_probs = actor.compute_log_prob(batch)
        metrics = actor.update(batch)
        results.append((metrics, {name: t.clone() for name, t in actor.named_weights()}))
    (with_pass, weights_with), (without, weights_without) = results
    assert without["actor/pg_loss"] == pytest.approx(with_pass["actor/pg_loss"], abs=1e-6)
    assert without["actor/grad_norm"] == pytest.approx(with_pass["actor/grad_norm"], rel=1e-5)
    assert without["actor/ppo_kl"] == 0.0 and without["actor/pg_clipfrac"] == 0.0
    for name, tensor in weights_with.items():
        assert torch.allclose(weights_without[name], tensor, atol=1e-7), name


@pytest.mark.trainer
@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, True),
        ({"actor": {"ppo_epochs": 2}}, False),
        ({"actor": {"ppo_mini_batch_size": SAMPLES // 16}}, False),
        ({"algorithm": {"use_kl_in_reward": True}}, False),
        ({"rollout": {"calculate_log_probs": True}}, False),
        ({"algorithm": {"adv_estimator": "optimal_token_baseline"}}, False),
        ({"algorithm": {"adv_estimator": "remax"}}, True),
    ],
    ids=[
        "one-step",
        "two-epochs",
        "two-mini-batches",
        "kl-in-reward",
        "rollout-log-probs",
        "estimator-reads-old-log-probs",
        "estimator-does-not",
    ],
)
def test_on_policy_only_where_the_weights_cannot_change_first(
    tmp_path: Path, changes: dict[str, dict[str, Any]], expected: bool
) -> None:
    raw = config(tmp_path).model_dump(mode="json")
    for section, values in changes.items():
        raw[section].update(values)
    assert on_policy(parse_trainer_config(raw), SAMPLES) is expected


@pytest.mark.trainer
def test_an_on_policy_step_has_no_old_log_prob_phase(tmp_path: Path) -> None:
    on = run_in_process(config(tmp_path / "on"), progress=False).history
    off = run_in_process(config(tmp_path / "off", ppo_epochs=2), progress=False).history
    assert all("timing_s/old_log_prob" not in step for step in on)
    assert all("timing_s/old_log_prob" in step for step in off)
