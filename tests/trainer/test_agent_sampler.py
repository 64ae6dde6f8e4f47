"""rollout.multi_turn wired into the trainer: episodes against the real vLLM CPU engine become the
step's batch, whose response mask is 0 exactly on the tool turns, and the actor's update ignores
whatever those positions hold; `rlkube-trainer run` trains on such episodes with a tool loaded
from a file and reports verl's num_turns and tool-call metrics.

A random model never writes a tool call, so the tiny model is first taught (a few seconds of
supervised steps) one conversation: ask the lookup tool, read its answer, repeat it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from tiny_model import build_tiny_model, cpu_engine, teach
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rlkube_api.config import MultiTurnConfig, TrainerConfig
from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.batch import TrainBatch, build_batch
from rlkube_trainer.data.prompts import Prompt
from rlkube_trainer.rollout import RolloutBatch, RolloutEngine, SamplingConfig
from rlkube_trainer.rollout.agent.sampler import EpisodeSampler
from rlkube_trainer.workers.builders import build_actor

pytestmark = pytest.mark.trainer

QUESTION = "What is the moon's number?"
CALL = '<tool_call>{"name": "lookup", "arguments": {"key": "moon"}}</tool_call><|im_end|>'
TOOL_TURN = "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
ANSWER = "42<|im_end|>"
TOOL_FILE = '''
from rlkube_trainer.tools import function_tool

TABLE = {"moon": "42"}


@function_tool
def lookup(key: str) -> str:
    """Look a key up in the table.

    Args:
        key: The key.
    """
    return TABLE.get(key, "not found")
'''
# The answer is the text after the last assistant header (decoded without special tokens, the
# trajectory reads "<tool_call>...</tool_call>tool\\n42\\nassistant\\n42"): the tool's own output
# earns nothing.
REWARD_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = solution_str.rsplit("assistant\\n", 1)[-1].strip()
    return 1.0 if answer == str(ground_truth) else 0.0
"""
RESPONSE_LENGTH = 96


def ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model taught the tool conversation, the tool and reward files, a data file."""
    root = tmp_path_factory.mktemp("agent-sampler")
    path = build_tiny_model(root / "model", vocab=512, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=False
    )
    # As an episode's context holds it: the template's "\n" after the model's <|im_end|> belongs
    # to the rendering of the model's turn, which the episode keeps as sampled.
    loss = teach(path, [str(prompt) + CALL + TOOL_TURN + ANSWER], steps=300)
    assert loss < 0.01, f"the tiny model did not learn the tool conversation (loss {loss:.3f})"
    (root / "tools.py").write_text(TOOL_FILE)
    (root / "reward.py").write_text(REWARD_FILE)
    row = {
        "data_source": "moon_lookup",
        "prompt": [{"role": "user", "content": QUESTION}],
        "reward_model": {"ground_truth": "42"},
        "extra_info": {"tools_kwargs": {}},
    }
    (root / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for _ in range(8)))
    return root


def trainer_config(workdir: Path) -> dict[str, Any]:
    return {
        "model": {"path": str(workdir / "model")},
        "data": {
            "train_files": [str(workdir / "train.jsonl")],
            "max_prompt_length": 64,
            "max_response_length": RESPONSE_LENGTH,
            "train_batch_size": 2,
        },
        "algorithm": {"adv_estimator": "grpo"},
        "actor": {"optim": {"lr": 1e-4}, "ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 4},
        "rollout": {
            "name": "vllm",
            "n": 2,
            "temperature": 1.0,
            "gpu_memory_utilization": 0.02,
            "multi_turn": {
                "enable": True,
                "function_tool_path": str(workdir / "tools.py"),
                "max_assistant_turns": 3,
            },
        },
        "reward": {"function": {"path": str(workdir / "reward.py"), "name": "compute_score"}},
        "trainer": {"total_training_steps": 2, "save_freq": -1, "test_freq": -1, "seed": 1},
        "checkpoint": {"dir": str(workdir / "checkpoints")},
        "roles": {"actor": {"replicas": 1, "gpus_per_replica": 0}},
    }


@pytest.fixture(scope="module")
def engine(workdir: Path) -> Iterator[RolloutEngine]:
    with cpu_engine(workdir / "model") as eng:
        yield eng


def prompts(tokenizer: PreTrainedTokenizerBase, count: int) -> list[Prompt]:
    messages = [{"role": "user", "content": QUESTION}]
    text = str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    return [
        Prompt(i, f"train.jsonl#{i}", ids(tokenizer, text), text, messages, "moon_lookup", "42", {"tools_kwargs": {}})
        for i in range(count)
    ]


def test_episodes_become_a_batch_masked_exactly_on_tool_turns(workdir: Path, engine: RolloutEngine) -> None:
    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    section = MultiTurnConfig(enable=True, function_tool_path=str(workdir / "tools.py"), max_assistant_turns=3)
    sampler = EpisodeSampler(engine, tokenizer, section, RESPONSE_LENGTH)
    rows = prompts(tokenizer, 2)
    rollout = sampler.generate(rows, SamplingConfig(n=2, temperature=0.0, max_tokens=RESPONSE_LENGTH, seed=1))
    assert [s.prompt_index for s in rollout.samples] == [0, 0, 1, 1] and rollout.n == 2
    for sample in rollout.samples:
        assert sample.episode is not None
        assert (sample.episode["num_turns"], sample.episode["tool_call_counts"]) == (4.0, 1.0)
        assert sample.episode["tool_call_errors"] == 0.0

    batch = build_batch(rows, rollout, int(tokenizer.pad_token_id))
    prompt_length = batch.input_ids.shape[1] - batch.response_length
    call, tool, answer = ids(tokenizer, CALL), ids(tokenizer, TOOL_TURN), ids(tokenizer, ANSWER)
    for row in range(len(batch)):
        length = int(batch.attention_mask[row, prompt_length:].sum())
        assert batch.responses[row, :length].tolist() == call + tool + answer
        assert batch.response_mask[row, :length].tolist() == [1.0] * len(call) + [0.0] * len(tool) + [1.0] * len(answer)
        assert batch.response_mask[row, length:].sum() == 0
    assert batch.episode["num_turns"].tolist() == [4.0] * 4

    # The actor's real update: whatever the tool positions hold in every per-token input of the
    # loss (advantages, old log-probs), the new weights are the same to the last bit.
    config = parse_trainer_config(trainer_config(workdir))
    tool_positions = (batch.attention_mask[:, prompt_length:] == 1) & (batch.response_mask == 0)
    assert int(tool_positions.sum()) == 4 * len(tool)
    weights = [updated(config, batch, tool_positions, noise) for noise in (0.0, 100.0)]
    for name, tensor in weights[0].items():
        assert torch.equal(weights[1][name], tensor), name
    # ... while the model's own tokens do move them.
    before = dict(build_actor(config, torch.device("cpu"), total_steps=2).named_weights())
    assert any(not torch.equal(before[n], t) for n, t in weights[0].items())


def updated(config: TrainerConfig, sampled: TrainBatch, tool_positions: torch.Tensor, noise: float) -> dict[str, Any]:
    torch.manual_seed(0)
    actor = build_actor(config, torch.device("cpu"), total_steps=2)
    batch = sampled.select(slice(None))
    old = actor.compute_log_prob(batch)
    advantages = torch.where(batch.response_mask > 0, torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]), 0.0)
    batch.old_log_probs = old + noise * tool_positions
    batch.advantages = advantages + noise * tool_positions
    batch.returns = batch.advantages
    actor.update(batch)
    return {name: t.clone() for name, t in actor.named_weights()}


@pytest.mark.slow
def test_the_trainer_runs_tool_calling_episodes(workdir: Path, tmp_path: Path) -> None:
    """`rlkube-trainer run` with rollout.multi_turn: two GRPO steps whose samples are episodes
    with the file's lookup tool; every row reports verl's multi-turn metrics."""
    raw = trainer_config(workdir)
    raw["checkpoint"]["dir"] = str(tmp_path / "checkpoints")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        # In this process: the episodes over Ray are test_agent_learning.py's.
        [sys.executable, "-m", "rlkube_trainer.pod.cli", "run", str(config), "--in-process", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        # Taught the conversation, the model mostly asks the tool (sampling at temperature 1 may
        # wander; max_assistant_turns 3 bounds an episode at 3 model and 2 tool turns).
        assert row["tool_call_counts/mean"] >= 0.5 and row["tool_call_counts/max"] >= 1.0
        assert 2.0 <= row["num_turns/min"] <= row["num_turns/max"] <= 6.0 and row["num_turns/max"] >= 4.0
        assert row["agent_loop/tool_calls/max"] > 0.0 and row["tool_call_errors/mean"] == 0.0


class NoEngine:
    """Generation must not start: the refusal comes first."""

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        raise AssertionError("the engine was asked to generate")


def test_a_prompt_the_tool_schemas_lengthen_past_max_prompt_length_is_refused(workdir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    rows = prompts(tokenizer, 1)
    # A template that renders the tools, as real chat models' do (the tiny one does not).
    tokenizer.chat_template = "{% if tools %}{{ tools | tojson }}{% endif %}" + str(tokenizer.chat_template)
    section = MultiTurnConfig(enable=True, function_tool_path=str(workdir / "tools.py"))
    limit = len(rows[0].prompt_token_ids) + 10
    sampler = EpisodeSampler(NoEngine(), tokenizer, section, RESPONSE_LENGTH, max_prompt_length=limit)
    with pytest.raises(ValueError, match=f"train.jsonl#0: .* more than data.max_prompt_length={limit}"):
        sampler.generate(rows, SamplingConfig(n=2, max_tokens=RESPONSE_LENGTH))
