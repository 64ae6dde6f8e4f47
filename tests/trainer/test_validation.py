"""Validation: verl's statistics worked by hand, and the loop in one process (HF rollout):
the schedule (val_before_train, test_freq, the last step), val_only, val_kwargs, the
generations log, the progress payload, and a resumed run that neither repeats nor skips a
validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client import generate_latest

from rlkube_api.rljob import Progress
from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.cluster import dispatch
from rlkube_trainer.loop.driver import run_in_process
from rlkube_trainer.loop.progress import progress_payload
from rlkube_trainer.loop.prometheus import DriverMetrics
from rlkube_trainer.loop.scored import Scored
from rlkube_trainer.loop.validation import (
    GENERATIONS_FILE,
    VALIDATION_SEED_OFFSET,
    Validation,
    bootstrap_metric,
    headline_score,
    majority_value,
    name_validation_metrics,
    process_validation_metrics,
    sample_sizes,
)
from rlkube_trainer.tiny.task import DATA_SOURCE, VAL_PROMPTS, init

CORE = f"val-core/{DATA_SOURCE}/reward/mean@1"


# --------------------------------------------------------------------------- statistics


def test_sample_sizes_double_up_to_n() -> None:
    assert sample_sizes(2) == [2]
    assert sample_sizes(5) == [2, 4, 5]
    assert sample_sizes(8) == [2, 4, 8]


def test_majority_value_takes_the_first_sample_of_the_most_common_pred() -> None:
    assert majority_value([(0.0, "a"), (1.0, "b"), (0.5, "b")]) == 1.0
    assert majority_value([(0.3, "x"), (1.0, "y")]) == 0.3  # a tie: the first seen wins


def test_bootstrap_resamples_as_numpy_legacy_generator_does() -> None:
    data = [0.0, 1.0, 0.0]
    rng = np.random.RandomState(7)
    maxima = [max(data[i] for i in rng.choice(3, size=2, replace=True)) for _ in range(50)]
    [(mean, std)] = bootstrap_metric(data, 2, [max], n_bootstrap=50, seed=7)
    assert mean == pytest.approx(np.mean(maxima)) and std == pytest.approx(np.std(maxima))


def test_process_validation_metrics_by_hand() -> None:
    # Source "a": prompt p with one sample (score 1), prompt q with one (score 0).
    summary = process_validation_metrics(["a", "a"], ["p", "q"], {"reward": [1.0, 0.0]})
    assert summary == {"a": {"reward": {"mean@1": 0.5}}}
    # Source "b": one prompt, two samples 1 and 0: mean 0.5, population std 0.5. Resampling 2
    # of {1, 0}: best is 1 unless both picks are 0 (1/4), worst is 0 unless both are 1.
    summary = process_validation_metrics(["b", "b"], ["p", "p"], {"reward": [1.0, 0.0]}, preds=["7", "8"])
    metrics = summary["b"]["reward"]
    assert metrics["mean@2"] == 0.5 and metrics["std@2"] == 0.5
    assert metrics["best@2/mean"] == pytest.approx(0.75, abs=0.05)
    assert metrics["worst@2/mean"] == pytest.approx(0.25, abs=0.05)
    # maj@2 of two different preds: the first resampled one's score, 1 or 0 with equal odds.
    assert metrics["maj@2/mean"] == pytest.approx(0.5, abs=0.05)


def test_names_follow_verl_core_and_aux() -> None:
    summary = {
        "openai/gsm8k": {"reward": {"mean@4": 0.5, "std@4": 0.1, "best@2/mean": 0.6, "best@4/mean": 0.7}},
        "math": {"reward": {"mean@1": 0.2}, "acc": {"mean@1": 0.25}},
    }
    named = name_validation_metrics(summary)
    assert named == {
        "val-core/openai/gsm8k/reward/mean@4": 0.5,
        "val-aux/openai/gsm8k/reward/std@4": 0.1,
        "val-aux/openai/gsm8k/reward/best@2/mean": 0.6,
        "val-core/openai/gsm8k/reward/best@4/mean": 0.7,
        # acc, when a reward function returns it, is the core variable.
        "val-aux/math/reward/mean@1": 0.2,
        "val-core/math/acc/mean@1": 0.25,
    }
    assert headline_score(named) == pytest.approx((0.5 + 0.25) / 2)


# --------------------------------------------------------------------------- the loop


def _config(workdir: Path, steps: int = 2, **overrides: Any) -> Any:
    raw = yaml.safe_load(init(workdir, "grpo", steps=steps).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 8
    raw["actor"]["ppo_mini_batch_size"] = 4
    raw["actor"]["ppo_micro_batch_size_per_gpu"] = 8
    raw["trainer"]["test_freq"] = 1
    raw["trainer"]["val_before_train"] = True
    for section, values in overrides.items():
        raw.setdefault(section, {}).update(values)
    return parse_trainer_config(raw)


def _validated_steps(rows: list[dict[str, Any]]) -> list[int]:
    return [int(r["step"]) for r in rows if CORE in r]


@pytest.mark.trainer
def test_validates_before_training_every_test_freq_and_logs_generations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    generate = dispatch.ColocatedRollout.generate

    def recording(self: Any, prompt_token_ids: list[list[int]], sampling: Any) -> Any:
        if sampling.seed >= VALIDATION_SEED_OFFSET:  # validation's calls, not the steps'
            calls.append(len(prompt_token_ids))
            assert sampling.temperature == 0.0 and sampling.n == 1  # val_kwargs' greedy default
        return generate(self, prompt_token_ids, sampling)

    monkeypatch.setattr(dispatch.ColocatedRollout, "generate", recording)
    config = _config(
        tmp_path,
        steps=3,
        trainer={"test_freq": 2, "log_val_generations": 3},
        data={"val_batch_size": 24},
    )
    result = run_in_process(config, progress=False)
    # data.val_batch_size prompts per generate call, the same engine as training.
    assert calls == [24, 24, VAL_PROMPTS - 48] * 3
    # Before the first step, at the multiple of test_freq, and after the last step.
    assert _validated_steps(result.history) == [0, 2, 3]
    for row in result.history:
        if CORE in row:
            assert 0.0 <= row[CORE] <= 1.0
            assert row["timing_s/testing"] > 0
    generations = [json.loads(line) for line in (tmp_path / "checkpoints" / GENERATIONS_FILE).read_text().splitlines()]
    assert [g["step"] for g in generations] == [0] * 3 + [2] * 3 + [3] * 3
    assert set(generations[0]) == {"step", "input", "output", "score"}
    # The same prompts each time, so the rows can be compared across steps.
    assert [g["input"] for g in generations[:3]] == [g["input"] for g in generations[3:6]]


@pytest.mark.trainer
def test_sampled_validation_reports_best_worst_at_n(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        steps=1,
        trainer={"val_before_train": False},
        rollout={"val_kwargs": {"n": 2, "do_sample": True, "temperature": 1.0}},
    )
    row = run_in_process(config, progress=False).history[-1]
    for key in ("reward/mean@2", "reward/best@2/mean"):
        assert f"val-core/{DATA_SOURCE}/{key}" in row
    for key in ("reward/std@2", "reward/worst@2/mean", "reward/worst@2/std"):
        assert f"val-aux/{DATA_SOURCE}/{key}" in row


@pytest.mark.trainer
def test_val_only_validates_and_stops(tmp_path: Path) -> None:
    config = _config(tmp_path, steps=5, trainer={"val_only": True})
    result = run_in_process(config, progress=False)
    assert result.steps == 0
    assert [set(r) >= {CORE} for r in result.history] == [True]
    assert not (tmp_path / "checkpoints" / "latest").exists()


@pytest.mark.trainer
def test_validation_needs_val_files(tmp_path: Path) -> None:
    # Refused when the config is read, naming the field, before any model loads.
    with pytest.raises(ValueError, match=r"trainer\.test_freq: trainer\.testFreq needs data\.valFiles"):
        run_in_process(_config(tmp_path, data={"val_files": []}), progress=False)


@pytest.mark.trainer
def test_a_resumed_run_neither_repeats_nor_skips_a_validation(tmp_path: Path) -> None:
    first = _config(tmp_path, steps=2, trainer={"save_freq": 1, "total_training_steps": 2})
    run_in_process(first, progress=False)
    # A crash after step 2's row was logged but before anything newer: a later attempt with a
    # longer budget resumes at step 2's checkpoint.
    checkpoints = tmp_path / "checkpoints"
    with (checkpoints / "metrics.jsonl").open("a") as out:
        out.write(json.dumps({"step": 3, CORE: 0.0}) + "\n")  # a row the crashed attempt logged
    second = _config(tmp_path / "again", steps=3, trainer={"save_freq": 1})
    second = second.model_copy(update={"checkpoint": first.checkpoint})
    result = run_in_process(second, progress=False)
    assert result.steps == 3
    assert [int(r["step"]) for r in result.history] == [0, 1, 2, 3]
    assert _validated_steps(result.history) == [0, 1, 2, 3]
    assert "critic/score/mean" in result.history[-1]  # step 3 as this run logged it


def test_validation_metrics_reach_prometheus() -> None:
    metrics = DriverMetrics({})
    metrics.update(4, {CORE: 0.75, f"val-aux/{DATA_SOURCE}/reward/std@2": 0.1})
    text = generate_latest(metrics.registry).decode()
    job = '{rljob="",rljob_namespace=""}'
    assert f"rlkube_val_core_{DATA_SOURCE}_reward_mean_1{job} 0.75" in text
    assert f"rlkube_val_aux_{DATA_SOURCE}_reward_std_2{job} 0.1" in text


def test_the_progress_payload_carries_the_latest_validation() -> None:
    payload = progress_payload(7, 10, {"critic/score/mean": 0.5}, 5, val_score=0.75, val_step=6)
    assert payload["valScore"] == 0.75 and payload["valStep"] == 6
    # What the operator copies into status.progress validates against the model.
    progress = Progress.model_validate({k: v for k, v in payload.items()})
    assert (progress.val_score, progress.val_step) == (0.75, 6)
    assert "valScore" not in progress_payload(7, 10, {}, 5)


def test_val_kwargs_become_the_validation_sampling(tmp_path: Path) -> None:
    kwargs = {"n": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 20}
    sampled = _config(tmp_path, rollout={"val_kwargs": {**kwargs, "do_sample": True}})
    sampling = Validation(sampled, [], None, tmp_path).sampling(3)  # type: ignore[arg-type]
    assert (sampling.n, sampling.temperature, sampling.top_p, sampling.top_k) == (4, 0.7, 0.9, 20)
    assert sampling.max_tokens == sampled.data.max_response_length and not sampling.logprobs
    # do_sample false decodes greedily whatever the temperature (verl's val_kwargs).
    greedy = _config(tmp_path / "greedy", rollout={"val_kwargs": {**kwargs, "do_sample": False}})
    assert Validation(greedy, [], None, tmp_path).sampling(3).temperature == 0.0  # type: ignore[arg-type]


def test_filter_groups_metric_names() -> None:
    scored = Scored(["a", "b"], [0.5, 1.0], [1.0, 1.0], {"acc": [0.0, 1.0]}, {"pred": ["1", "2"]})
    assert scored.metric("score") == [1.0, 1.0]  # the scorer's, before shaping
    assert scored.metric("seq_reward") == [0.5, 1.0]  # the reward, shaping included
    assert scored.metric("acc") == [0.0, 1.0]
    with pytest.raises(ValueError, match=r"metric 'pred' is not among .*: score, seq_reward, acc"):
        scored.metric("pred")
    kept = scored.select([False, True])
    assert (kept.responses, kept.scores, kept.extra, kept.labels) == (["b"], [1.0], {"acc": [1.0]}, {"pred": ["2"]})
