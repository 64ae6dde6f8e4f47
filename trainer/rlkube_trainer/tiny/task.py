"""A tiny verifiable task for CPU runs (tests, `make demo`): the prompt is a few
random digits and `=`, the answer is the first digit. Reading the prompt is the
only way to score; a constant answer is right one time in ten.

Everything is made locally — a random-initialised Llama-shaped model (or a Qwen3-MoE-shaped
mixture of experts) with a word-level tokenizer of 14 tokens, and the dataset as parquet — so nothing is
downloaded. `rlkube-trainer tiny-task DIR` writes model, data,
reward function and a trainer config into DIR.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

DATA_SOURCE = "tiny_first_digit"
# Inside the package, so `rlkube-trainer tiny-task` works from an installed image too;
# examples/rewards/tiny_task.py links here.
REWARD_FILE = Path(__file__).with_name("reward.py")
VAL_PROMPTS = 64
WORDS = ("<pad>", "<eos>", "<bos>", *(str(d) for d in range(10)), "=")


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {word: i for i, word in enumerate(WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>", model_max_length=512
    )
    return tokenizer


def build_model(
    path: Path,
    seed: int = 0,
    hidden_size: int = 64,
    layers: int = 2,
    initializer_range: float = 0.02,
    experts: int = 0,
    heads: int = 2,
) -> Path:
    """A random-initialised Llama with the task's tokenizer, saved to `path`.

    `initializer_range` is the weights' standard deviation. With transformers' 0.02 the tied
    embeddings bound every logit to about ±1.3, so only training the embeddings (or the final
    norm) makes an answer likely; LoRA, which adapts the linear layers alone, needs a head able
    to express a confident answer, as a pretrained model's is (0.2: logits up to about ±13).

    Llama rather than Qwen2: transformers maps a qwen2 checkpoint's tokenizer to its
    byte-level class, which would break the word-level vocabulary. vLLM's CPU
    attention needs a head size of 32 or more: 64 hidden over 2 heads. `heads` 4 (head size 16:
    no vLLM engine can load it) lets tensor parallel 4 split the attention in the trainer alone.

    `experts` > 0 makes it a Qwen3-MoE instead (head size 32 as well): every layer's MLP is
    that many experts, two routed per token (the saved tokenizer names its own class, so the qwen model type does
    not pull in a byte-level tokenizer).
    """
    tokenizer = build_tokenizer()
    common: dict[str, Any] = {
        "vocab_size": len(WORDS),
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "max_position_embeddings": 128,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "dtype": "float32",
        "initializer_range": initializer_range,
    }
    torch.manual_seed(seed)
    model: PreTrainedModel
    if experts:
        moe = Qwen3MoeConfig(
            **common,
            moe_intermediate_size=hidden_size // 2,
            num_experts=experts,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
        model = Qwen3MoeForCausalLM(moe)  # type: ignore[no-untyped-call]
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))  # type: ignore[no-untyped-call]
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_rows(count: int, digits: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        sequence = [str(rng.randrange(10)) for _ in range(digits)]
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": " ".join(sequence) + " ="}],
                "ability": "copy",
                "reward_model": {"style": "rule", "ground_truth": sequence[0]},
                "extra_info": {"index": i},
            }
        )
    return rows


def write_dataset(path: Path, count: int = 512, digits: int = 3, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(make_rows(count, digits, seed)), path)
    return path


def trainer_config(workdir: Path, adv_estimator: str = "grpo", steps: int = 60) -> dict[str, Any]:
    """The trainer YAML (verl's keys) for the task, with paths under workdir."""
    config: dict[str, Any] = {
        "model": {"path": str(workdir / "model")},
        "data": {
            "train_files": [str(workdir / "data" / "train.parquet")],
            # Held-out prompts (another seed), scored greedily every test_freq steps.
            "val_files": [str(workdir / "data" / "val.parquet")],
            "max_prompt_length": 16,
            "max_response_length": 2,
            "train_batch_size": 32,
        },
        "algorithm": {"adv_estimator": adv_estimator},
        "actor": {"optim": {"lr": 3e-3}, "ppo_mini_batch_size": 16, "ppo_micro_batch_size_per_gpu": 64},
        "rollout": {
            "name": "vllm",
            "n": 8 if adv_estimator != "gae" else 4,
            "temperature": 1.0,
            "gpu_memory_utilization": 0.02,
        },
        "reward": {"function": {"path": str(workdir / "reward.py"), "name": "compute_score"}},
        # Validated every 10 steps and after the last, inside those steps' rows (no row of its
        # own before training, so every row of metrics.jsonl is a step).
        "trainer": {
            "total_training_steps": steps,
            "save_freq": 20,
            "test_freq": 10,
            "val_before_train": False,
            "seed": 1,
        },
        "checkpoint": {"dir": str(workdir / "checkpoints")},
        "roles": {"actor": {"replicas": 1, "gpus_per_replica": 0}},
    }
    if adv_estimator == "gae":
        config["critic"] = {"optim": {"lr": 3e-3}}
        config["roles"]["critic"] = {"colocate_with": "actor"}
    return config


def init(
    workdir: Path,
    adv_estimator: str = "grpo",
    steps: int = 60,
    seed: int = 0,
    initializer_range: float = 0.02,
    experts: int = 0,
) -> Path:
    """Writes model/, data/train.parquet, data/val.parquet, reward.py and config.yaml into workdir."""
    build_model(workdir / "model", seed=seed, initializer_range=initializer_range, experts=experts)
    write_dataset(workdir / "data" / "train.parquet", seed=seed)
    write_dataset(workdir / "data" / "val.parquet", count=VAL_PROMPTS, seed=seed + 1)
    shutil.copyfile(REWARD_FILE, workdir / "reward.py")
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(trainer_config(workdir, adv_estimator, steps), sort_keys=False))
    return config_path
