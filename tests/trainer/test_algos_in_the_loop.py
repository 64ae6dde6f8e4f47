"""verl 0.9.1's further estimators and losses through the loop in one process (HF rollout): the
step hands each the inputs it declares (GDPO's reward components, SAPO's taus, ReMax's greedy
baseline, the optimal token baseline's sum of pi^2, ...)."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.algos import advantage
from rlkube_trainer.loop.driver import run_in_process
from rlkube_trainer.rollout import SamplingConfig
from rlkube_trainer.rollout.hf_engine import HFRolloutEngine
from rlkube_trainer.tiny.task import init

# A score and two components; "parity" depends on the response, so groups differ.
COMPONENT_REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return {'score': 1.0, 'fmt': 1.0, 'parity': float(len(solution_str) % 2)}\n"
)


def _raw(workdir: Path) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(init(workdir, "grpo", steps=1).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 4
    raw["actor"]["ppo_mini_batch_size"] = 4
    raw["actor"]["ppo_micro_batch_size_per_gpu"] = 8
    raw["trainer"]["test_freq"] = -1
    return raw


@pytest.mark.trainer
def test_gdpo_gets_the_reward_functions_components(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _raw(tmp_path)
    reward = tmp_path / "components.py"
    reward.write_text(COMPONENT_REWARD)
    raw["reward"]["function"] = {"path": str(reward)}
    raw["algorithm"].update(adv_estimator="gdpo", gdpo_reward_keys=["fmt", "parity"], gdpo_reward_weights=[1.0, 2.0])
    raw["actor"].update(policy_loss="sapo", loss_agg_mode="seq-mean-token-sum-norm", kl_loss_type="k3+")
    seen: list[dict[str, Any]] = []
    gdpo = advantage.ADV_ESTIMATOR_REGISTRY["gdpo"]

    @functools.wraps(gdpo)
    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return gdpo(*args, **kwargs)

    monkeypatch.setitem(advantage.ADV_ESTIMATOR_REGISTRY, "gdpo", recording)
    result = run_in_process(parse_trainer_config(raw), progress=False)
    (call,) = seen
    fmt, parity = call["reward_components"]
    assert call["reward_weights"] == [1.0, 2.0]
    assert torch.equal(fmt, torch.ones_like(fmt))
    assert set(parity.tolist()) <= {0.0, 1.0}
    assert all(math.isfinite(row["actor/pg_loss"]) for row in result.history)


@pytest.mark.trainer
def test_gdpo_names_a_missing_component(tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    raw["algorithm"].update(adv_estimator="gdpo", gdpo_reward_keys=["nope"])
    with pytest.raises(ValueError, match=r"gdpo_reward_keys \['nope'\] are not among"):
        run_in_process(parse_trainer_config(raw), progress=False)


def _recording(monkeypatch: pytest.MonkeyPatch, name: str) -> list[dict[str, Any]]:
    """The keyword arguments of each call of the estimator registered as `name`."""
    seen: list[dict[str, Any]] = []
    estimator = advantage.ADV_ESTIMATOR_REGISTRY[name]

    @functools.wraps(estimator)
    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return estimator(*args, **kwargs)

    monkeypatch.setitem(advantage.ADV_ESTIMATOR_REGISTRY, name, recording)
    return seen


@pytest.mark.trainer
def test_remax_gets_the_reward_of_each_prompts_greedy_response(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _raw(tmp_path)
    raw["algorithm"]["adv_estimator"] = "remax"
    seen = _recording(monkeypatch, "remax")
    samplings: list[SamplingConfig] = []
    generate = HFRolloutEngine.generate

    def recording_generate(self: Any, prompt_token_ids: Any, sampling: SamplingConfig) -> Any:
        samplings.append(sampling)
        return generate(self, prompt_token_ids, sampling)

    monkeypatch.setattr(HFRolloutEngine, "generate", recording_generate)
    result = run_in_process(parse_trainer_config(raw), progress=False)
    (call,) = seen
    baselines = call["reward_baselines"]
    n = raw["rollout"]["n"]
    assert baselines.shape == (raw["data"]["train_batch_size"] * n,)
    # One baseline per prompt, shared by its n samples; the tiny task's rewards are 0 or 1.
    groups = baselines.view(-1, n)
    assert torch.equal(groups, groups[:, :1].expand_as(groups))
    assert set(baselines.tolist()) <= {0.0, 1.0}
    # The step generated the samples, then one greedy response per prompt.
    assert [(s.n, s.temperature) for s in samplings] == [(n, raw["rollout"]["temperature"]), (1, 0.0)]
    (step,) = result.history
    assert math.isfinite(step["actor/pg_loss"]) and "timing_s/gen" in step


@pytest.mark.trainer
@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_the_optimal_token_baseline_gets_the_actors_sum_pi_squared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, estimator: str
) -> None:
    raw = _raw(tmp_path)
    raw["algorithm"]["adv_estimator"] = estimator
    # Decoupled rollout correction: its importance weights reach the estimator too.
    raw["algorithm"]["rollout_correction"] = {"rollout_is": "token", "rollout_is_threshold": 2.0}
    seen = _recording(monkeypatch, estimator)
    result = run_in_process(parse_trainer_config(raw), progress=False)
    (call,) = seen
    mask = call["response_mask"].bool()
    sum_pi_squared, old_log_probs = call["sum_pi_squared"], call["old_log_probs"]
    assert sum_pi_squared.shape == old_log_probs.shape == mask.shape
    # The sampled token's pi^2 is one term of the sum over the vocabulary, and the sum is at most 1.
    assert torch.all(sum_pi_squared[mask] >= old_log_probs[mask].exp() ** 2 - 1e-6)
    assert torch.all(sum_pi_squared[mask] <= 1 + 1e-6)
    assert call["rollout_is_weights"] is not None
    (step,) = result.history
    assert math.isfinite(step["actor/pg_loss"]) and "timing_s/old_log_prob" in step
    assert step["variance_proxy/proxy2_total_power"] >= 0 and step["variance_proxy/proxy1_signal_strength"] > 0
