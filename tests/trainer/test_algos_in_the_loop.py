"""verl 0.9.1's further estimators and losses through the loop in one process (HF rollout): the
step hands each the inputs it declares (GDPO's reward components, SAPO's taus, ...)."""

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
from rlkube_trainer.driver import run_in_process
from rlkube_trainer.tiny_task import init

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
