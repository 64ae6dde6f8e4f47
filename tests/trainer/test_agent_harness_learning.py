"""Harness-driven learning: an agent program of its own (a Python script speaking the endpoint's
OpenAI chat API over plain HTTP, one call per episode) drives the rollout through the trainer's
endpoint, scores the reply itself and reports the reward; the run trains on the recorded tokens and that reward alone
(no reward function: the built-in scorer returns the harness's), and the reward rises.

The prompt names a key ("key c"), the right reply is the key's value in a table. The tiny model is
first taught the right value once and a wrong one ("9") three times for every key: it answers
right less often than not (greedily: never), and GRPO on the harness's reward has to make it
answer right. Runs `rlkube-trainer run --in-process` (real vLLM CPU engine) in a subprocess, as
test_learning.py does; asserts the training reward and the greedy validation score over every key,
never the time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_agent_learning import KEYS, TABLE, metrics, rows, write
from tiny_model import build_tiny_model, teach
from transformers import AutoTokenizer

# The user's harness: one chat call, its own verdict, the reward reported. It speaks HTTP with the
# standard library: importing the `openai` client costs a CPU-second a process, 16 a step here, and
# test_agent_endpoint.py already drives the endpoint with that client.
HARNESS = """
import json, os, urllib.request

def post(url, body):
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    return json.loads(urllib.request.urlopen(request).read() or "null")

task = json.loads(os.environ["RLKUBE_EPISODE"])
answer = post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", {"model": "policy", "messages": task["prompt"]})
reply = answer["choices"][0]["message"]["content"] or ""
post(os.environ["RLKUBE_REWARD_URL"], {"reward": float(reply.strip() == task["ground_truth"])})
"""
WRONG = "9"  # no key's value
STEPS = 16


def _prompt_text(tokenizer: Any, key: str) -> str:
    messages = [{"role": "user", "content": f"key {key}"}]
    return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))


def validation_rows() -> list[dict[str, Any]]:
    """Every key once."""
    return [
        {
            "data_source": "lookup_task",
            "prompt": [{"role": "user", "content": f"key {key}"}],
            "reward_model": {"ground_truth": TABLE[key]},
            "extra_info": {"index": i, "key": key},
        }
        for i, key in enumerate(KEYS)
    ]


def setup(workdir: Path) -> Path:
    model = build_tiny_model(workdir / "model", vocab=512, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    wrong_thrice = (WRONG, WRONG, WRONG)
    texts = [_prompt_text(tokenizer, k) + f"{answer}<|im_end|>" for k in KEYS for answer in (TABLE[k], *wrong_thrice)]
    loss = teach(model, texts, steps=200)
    # The floor is about 0.11: ln 8 on the prompt's key and 0.56 on the answer, over 25 tokens.
    assert loss < 0.13, f"the tiny model did not learn the reply's form (loss {loss:.3f})"
    (workdir / "harness.py").write_text(HARNESS)
    config: dict[str, Any] = {
        "model": {"path": str(model)},
        "data": {
            "train_files": [write(workdir / "train.jsonl", rows(256, seed=0))],
            # Greedy, episodes too: before training and after the last step.
            "val_files": [write(workdir / "val.jsonl", validation_rows())],
            "max_prompt_length": 32,
            "max_response_length": 4,
            "train_batch_size": 2,
        },
        "algorithm": {"adv_estimator": "grpo"},
        # 1e-3 wrecked the taught form within two steps (replies no longer ended), and 3e-4 jumped
        # to 0.69 in one step then wandered (0.3-0.9): as in test_agent_learning.py, a sharp taught
        # model needs a small step.
        "actor": {"optim": {"lr": 1e-4}, "ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 16},
        "rollout": {
            "name": "vllm",
            "n": 8,  # 16 episodes a step; groups of 8 are rarely all wrong (no advantage) at the start
            "temperature": 1.0,
            "gpu_memory_utilization": 0.02,
            "harness": {"command": [sys.executable, str(workdir / "harness.py")], "timeout_seconds": 120},
        },
        "trainer": {
            "total_training_steps": STEPS,
            "save_freq": -1,
            "test_freq": STEPS,
            "val_before_train": True,
            "seed": 1,
        },
        "checkpoint": {"dir": str(workdir / "checkpoints")},
        "roles": {"actor": {"replicas": 1, "gpus_per_replica": 0}},
    }
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.trainer
@pytest.mark.slow
def test_a_harness_drives_the_rollout_and_its_reward_is_learned(tmp_path: Path) -> None:
    config = setup(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "rlkube_trainer.pod.cli", "run", str(config), "--in-process", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    check_learned(metrics(tmp_path))
    settings = json.loads((tmp_path / "checkpoints" / "effective-settings.json").read_text())
    assert settings["episodes"]["class"] == "HarnessSampler", settings["episodes"]


def check_learned(logged: list[dict[str, float]]) -> None:
    steps = [r for r in logged if "critic/score/mean" in r]
    scores = [r["critic/score/mean"] for r in steps]
    assert len(scores) == STEPS
    assert all(r["rollout/episodes_lost"] == 0 and r["rollout/groups_dropped"] == 0 for r in steps), steps
    # Greedy over every key: the taught habit answers the wrong value for each, the trained policy
    # the right one for most (seen twice: 0.0, then 0.875).
    val = [r["val-core/lookup_task/reward/mean@1"] for r in logged if "val-core/lookup_task/reward/mean@1" in r]
    assert len(val) == 2 and val[0] <= 0.25 and val[1] >= 0.625, val
    # A step's 2 prompts are 2 keys, some easier than others, so a step's reward is noisy, and the
    # rise starts at step 3: the last 8 steps against the first 2 (seen in three runs: 0.19, 0.22
    # and 0.28, then 0.70, 0.66 and 0.74).
    first, last = sum(scores[:2]) / 2, sum(scores[-8:]) / 8
    assert first < 0.5, f"the first steps should score as the taught habit does, got {scores[:2]}"
    lengths = [r["response_length/mean"] for r in steps]
    assert last >= first + 0.25, f"the reward should rise, got {scores}; response lengths {lengths}"
