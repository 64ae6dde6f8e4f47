"""The learning test: on the tiny task (answer the first of three digits), a
random-initialised model trained with real vLLM (CPU) rollout raises its mean
reward from the first step's (about 0.1: chance) to at least 0.8, for GRPO, for
PPO with a critic, for DAPO (dynamic sampling, clip-higher, token-mean), for
GSPO, for GRPO with LoRA (only the adapters train; the engine gets the merged
weights), for ReMax (a greedy baseline response per prompt) and for the optimal
token baseline (the actor's sum of pi^2); its greedy validation score on
held-out prompts rises too. Runs `rlkube-trainer run --in-process` in a
subprocess (vLLM wants one engine per process): the driver, ranks and engine are
the code a job's pods run, without Ray's start-up in every run; the same learning
through Ray rank groups is tests/trainer/test_distributed.py's. Asserts the
reward, never the time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlkube_trainer.tiny.task import DATA_SOURCE, init

# DAPO as its paper runs it, less the overlong penalty (every tiny response is
# max_response_length long, so it would only shift all rewards alike). Dynamic sampling
# trains on mixed groups only, whose mean score stays below 1 by construction, and needs
# more rounds the better the policy gets (seen: 9 rounds at step 38): a shorter budget,
# judged on the held-out validation score.
DAPO = {
    "algorithm": {"filter_groups": {"enable": True, "metric": "score", "max_num_gen_batches": 30}},
    "actor": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "loss_agg_mode": "token-mean"},
}
# GSPO with the paper's clip ranges (a sequence ratio moves far less than a token's).
GSPO = {"actor": {"policy_loss": "gspo", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}}
# LoRA (rank 16 on every linear layer, the base frozen), with the engine's log-probs beside the
# actor's. Its model is initialised with a larger spread (tiny_task.build_model): with 0.02 the
# frozen tied head bounds every logit to about ±1.3, and no adapter could make an answer likely.
LORA = {
    "model": {"lora_rank": 16, "lora_alpha": 32},
    "rollout": {"calculate_log_probs": True},
    "init": {"initializer_range": 0.2},
}
# (id, estimator, step budget, overrides); each run takes about 2-4 minutes on 2 cores.
BUDGETS: list[tuple[str, str, int, dict[str, Any]]] = [
    ("grpo", "grpo", 60, {}),
    ("gae", "gae", 90, {}),
    ("dapo", "grpo", 40, DAPO),
    ("gspo", "grpo", 60, GSPO),
    # LoRA trains rank-16 adapters under a frozen base and climbs more slowly (seen: 0.799 over the
    # last 5 of 60 steps on one machine, at least 0.8 on others).
    ("grpo-lora", "grpo", 70, LORA),
    # ReMax's advantage is 0 for a correct sample once the greedy response is correct, so it
    # climbs more slowly than GRPO's normalised one (seen: 0.80 over the last 5 of 60 steps, 0.83
    # of 90). About 50 s each here.
    ("remax", "remax", 90, {}),
    ("optimal-token-baseline", "optimal_token_baseline", 60, {}),
]


@pytest.mark.trainer
@pytest.mark.slow
@pytest.mark.parametrize(("estimator", "steps", "overrides"), [b[1:] for b in BUDGETS], ids=[b[0] for b in BUDGETS])
def test_tiny_task_is_learned(tmp_path: Path, estimator: str, steps: int, overrides: dict[str, Any]) -> None:
    overrides = dict(overrides)
    config = init(tmp_path, estimator, steps, **overrides.pop("init", {}))
    raw = yaml.safe_load(config.read_text())
    for section, values in overrides.items():
        raw[section].update(values)
    config.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, "-m", "rlkube_trainer.pod.cli", "run", str(config), "--in-process", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    scores = [r["critic/score/mean"] for r in rows]
    assert len(scores) == steps
    assert scores[0] < 0.3, f"the first step should score near chance (0.1), got {scores[0]}"
    final = sum(scores[-5:]) / 5
    dynamic_sampling = overrides.get("algorithm", {}).get("filter_groups", {}).get("enable", False)
    if not dynamic_sampling:
        assert final >= 0.8, f"{estimator}: mean reward of the last 5 steps {final:.3f} < 0.8; curve {scores}"
    # Validated greedily every 10 steps on held-out prompts: the score rises with the reward.
    val = [r[f"val-core/{DATA_SOURCE}/reward/mean@1"] for r in rows if f"val-core/{DATA_SOURCE}/reward/mean@1" in r]
    assert len(val) == steps // 10
    assert val[-1] >= (0.8 if dynamic_sampling else 0.7) and val[-1] > val[0], f"validation scores {val}"
    assert (tmp_path / "checkpoints" / "curves.png").stat().st_size > 0
    if raw["model"].get("lora_rank"):
        _check_lora_run(tmp_path / "checkpoints", rows)


def _check_lora_run(checkpoints: Path, rows: list[dict[str, Any]]) -> None:
    """vLLM generated with the merged weights (its log-probs are the actor's, which differ from
    the base's by now), and only the adapters trained (the checkpoint holds nothing else)."""
    from rlkube_trainer.checkpoint.state import load_torch  # noqa: PLC0415

    assert max(r["training/rollout_probs_diff_max"] for r in rows[-5:]) < 1e-3
    state = load_torch(sorted(checkpoints.glob("step_*"))[-1] / "actor" / "rank_0.pt")["state"]
    assert state["model"] and all(".lora_A." in n or ".lora_B." in n for n in state["model"])
    assert (checkpoints / "hf" / "lora_adapter" / "adapter_model.safetensors").is_file()
