"""Model sizes: does a GRPO step train at each Qwen2.5 size on one GPU, and how fast,
through the trainer's own path (`driver.run_in_process`: one rank with an NCCL group of one,
FSDP2 with bf16 compute over fp32 master weights, the colocated vLLM engine sleeping while
the actor trains, chunked LM-head log-probs).

    python3 bench/gpu/scale_bench.py run --arch 0.5b 7b --out $OUT/scale.json
    python3 bench/gpu/scale_bench.py run --arch 7b --lora-rank 64 --lora-alpha 128 --tag lora64 --out $OUT/scale.json
    python3 bench/gpu/scale_bench.py trl --arch 3b --model-dtype bf16 --out $OUT/trl-3b.json   # TRL, same size and shape

LoRA goes through the trainer's own keys (model.lora_rank, lora_alpha,
target_modules, exclude_modules; rollout.layered_summon, model.use_shm): the actor trains
adapters on its frozen base, the reference is that base, and the engine gets the merged
weights (the trainer's only LoRA sync; `timing_s/update_weights` is its time).

Each size runs in a process of its own (`one`), since vLLM wants one engine per process; a
size that fails (out of memory, say) is recorded with its error and the next one runs, and one
that outlasts --timeout is killed and recorded with the rows its metrics.jsonl holds.
Models are random-initialised Qwen2.5 shapes the script saves itself (bf16 safetensors).
"""

# ruff: noqa: PLC0415
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _sub in ("trainer", "api"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))
sys.path.insert(0, str(Path(__file__).parent))

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Qwen2.5's published architectures (config.json), random-initialised here.
_COMMON = {
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "use_sliding_window": False,
    "hidden_act": "silu",
    "initializer_range": 0.02,
}
ARCHS: dict[str, dict[str, Any]] = {
    "0.5b": {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True},
    "1.5b": {"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
             "num_attention_heads": 12, "num_key_value_heads": 2, "tie_word_embeddings": True},
    "3b": {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
           "num_attention_heads": 16, "num_key_value_heads": 2, "tie_word_embeddings": True},
    "7b": {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
           "num_attention_heads": 28, "num_key_value_heads": 4, "tie_word_embeddings": False},
    # A CPU smoke test of this script (with --shape tiny --device cpu).
    "tiny": {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": True},
}  # fmt: skip
# The sizes' shape: 32 prompts x 8 samples, 256 + 512 tokens, gradient checkpointing, micro-batch 4.
SHAPES = {
    "scale": {"prompts": 32, "n": 8, "prompt_len": 256, "response_len": 512, "micro": 4, "checkpointing": True},
    "bench": {"prompts": 64, "n": 8, "prompt_len": 256, "response_len": 512, "micro": 16, "checkpointing": False},
    "tiny": {"prompts": 4, "n": 2, "prompt_len": 16, "response_len": 8, "micro": 4, "checkpointing": False},
}


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", flush=True)


def label(arch: str, tag: str) -> str:
    """A run's name in file names: its size, and --tag (two runs of one size, e.g. full and LoRA)."""
    return f"{arch}-{tag}" if tag else arch


def lora_keys(args: argparse.Namespace) -> dict[str, Any]:
    """The trainer's model.* LoRA keys; none at rank 0 (full fine-tuning, the config as before)."""
    if args.lora_rank <= 0:
        return {}
    keys: dict[str, Any] = {
        "lora_rank": args.lora_rank,
        "target_modules": args.target_modules,
        "exclude_modules": args.exclude_modules,
    }
    if args.lora_alpha is not None:
        keys["lora_alpha"] = args.lora_alpha
    return keys


def write_task(workdir: Path, args: argparse.Namespace) -> Path:
    """Model, prompts (random bytes: one token each), reward file and trainer config."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from grpo_bench import REWARD_SOURCE, ensure_model

    arch, shape = args.arch[0], SHAPES[args.shape]
    name = label(arch, args.tag)
    model = ensure_model(workdir / f"model-{arch}", {**_COMMON, **ARCHS[arch]})
    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    rows = [
        {
            "data_source": "bench",
            "prompt": "".join(rng.choice(alphabet) for _ in range(shape["prompt_len"])),
            "reward_model": {"ground_truth": ""},
        }
        for _ in range(shape["prompts"] * (args.steps + 1))
    ]
    pq.write_table(pa.Table.from_pylist(rows), workdir / "prompts.parquet")
    (workdir / "reward.py").write_text(REWARD_SOURCE)
    model_keys: dict[str, Any] = {"path": str(model), "enable_gradient_checkpointing": shape["checkpointing"]}
    model_keys |= lora_keys(args)
    rollout: dict[str, Any] = {
        "name": "vllm",
        "n": shape["n"],
        "ignore_eos": True,
        "gpu_memory_utilization": args.gpu_util,
        "free_cache_engine": True,
    }
    if args.use_shm:
        model_keys["use_shm"] = True
    if args.layered_summon:
        rollout["layered_summon"] = True
    config = {
        "model": model_keys,
        "data": {
            "train_files": [str(workdir / "prompts.parquet")],
            "max_prompt_length": shape["prompt_len"],
            "max_response_length": shape["response_len"],
            "train_batch_size": shape["prompts"],
            "apply_chat_template": False,
            "shuffle": False,
        },
        "algorithm": {"adv_estimator": "grpo"},
        "actor": {
            "optim": {"lr": args.lr},
            "ppo_mini_batch_size": shape["prompts"],
            "ppo_micro_batch_size_per_gpu": shape["micro"],
            "fsdp_config": {"param_offload": args.param_offload, "model_dtype": args.model_dtype},
        },
        "rollout": rollout,
        "reward": {"function": {"path": str(workdir / "reward.py")}},
        "trainer": {"total_training_steps": args.steps, "seed": 1, "device": args.device},
        # A folder per run: metrics.jsonl appends across runs in one folder.
        "checkpoint": {
            "dir": str(workdir / f"checkpoints-{name}-{time.time_ns()}"),
            "export_hf": False,
            "resume": "disable",
        },
        "roles": {"actor": {"replicas": 1, "gpus_per_replica": 1 if args.device == "cuda" else 0}},
    }
    path = workdir / f"config-{name}.json"
    path.write_text(json.dumps(config))
    return path


def summarize(history: list[dict[str, Any]], shape: dict[str, Any]) -> dict[str, Any]:
    """Means of the trainer's timing_s/* and perf/* over the steps after the first (it warms up)."""
    rows = history[1:] or history
    keys = sorted({k for r in rows for k in r if k.startswith(("timing_s/", "perf/"))})
    means = {k: statistics.fmean(r[k] for r in rows if k in r) for k in keys}
    if means.get("timing_s/gen"):
        means["gen_tokens_per_s"] = shape["prompts"] * shape["n"] * shape["response_len"] / means["timing_s/gen"]
    return {
        "steps": len(history),
        "rows_averaged": len(rows),
        "means": means,
        "throughput_per_step": [r.get("perf/throughput") for r in history],
    }


def lora_summary(args: argparse.Namespace, config: Any) -> dict[str, Any] | None:
    """The LoRA settings as the trainer parsed them, and the adapters' parameter count
    (memory.py's, from the model's config.json)."""
    from rlkube_trainer.workers.memory import lora_parameters

    model = config.model
    if model.lora_rank <= 0:
        return None
    text = json.loads((Path(model.path) / "config.json").read_text())
    return {
        "rank": model.lora_rank,
        "alpha": model.lora_alpha,
        "target_modules": list(model.target_modules),
        "exclude_modules": list(model.exclude_modules),
        # The trainer's only LoRA sync: the engine loads W + alpha / r * B @ A (rlkube_trainer.model.lora.merge).
        "sync": "merged",
        "adapter_parameters": lora_parameters(text, model.lora_rank, list(model.target_modules)),
    }


def skip_checkpoint_parts() -> None:
    """--skip-checkpoint: the run's final checkpoint holds the driver's state alone, not the
    ranks' parts (a 7B full fine-tune's weights and AdamW moments are about 45 GB of disk and a
    minute of writing after the last row; the rows are the measurement)."""
    from rlkube_trainer.loop.saves import GroupState

    def save(self: GroupState, staging: Path) -> dict[str, Any]:
        del self, staging
        return {}

    GroupState.save = save  # type: ignore[method-assign]


def one(args: argparse.Namespace) -> int:
    """One size in this process: train, then write the summary."""
    import torch

    from rlkube_api.validation import parse_trainer_config
    from rlkube_trainer.loop.driver import run_in_process

    shape = SHAPES[args.shape]
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    task = write_task(workdir, args)
    config = parse_trainer_config(json.loads(task.read_text()))
    if args.skip_checkpoint:
        skip_checkpoint_parts()
    on_gpu = torch.cuda.is_available()
    if on_gpu:  # the model was built on the GPU: start the measurement clean
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    log(
        f"{label(args.arch[0], args.tag)}: task written in {time.perf_counter() - started:.0f} s; training {args.steps} steps"
    )
    summary: dict[str, Any] = {
        "arch": args.arch[0],
        "tag": args.tag,
        "shape": shape,
        "gpu_memory_utilization": args.gpu_util,
        "param_offload": args.param_offload,
        "model_dtype": args.model_dtype,
        "lr": args.lr,
        "lora": lora_summary(args, config),
        "layered_summon": args.layered_summon,
        "use_shm": args.use_shm,
        "checkpoint_parts": not args.skip_checkpoint,
        "commit": os.environ.get("RLKUBE_COMMIT", "unknown"),
    }
    try:
        result = run_in_process(config, progress=False)
        summary.update(trains=True, **summarize(result.history, shape), history=result.history)
    except Exception as error:
        summary.update(trains=False, error=f"{type(error).__name__}: {str(error)[:2000]}")
        summary.update(rows_logged(Path(config.checkpoint.dir), shape))
    summary["peak_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None
    summary["peak_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30 if on_gpu else None
    summary["wall_s"] = time.perf_counter() - started
    Path(args.out).write_text(json.dumps(summary, indent=1, default=str))
    log(json.dumps({k: v for k, v in summary.items() if k != "history"}, default=str))
    return 0


def child_flags(args: argparse.Namespace) -> list[str]:
    """`one`'s options for a size, as `run` was given them."""
    flags = ["--workdir", args.workdir, "--steps", str(args.steps), "--gpu-util", str(args.gpu_util),
             "--shape", args.shape, "--device", args.device, "--model-dtype", args.model_dtype, "--lr", str(args.lr),
             "--lora-rank", str(args.lora_rank), "--target-modules", *args.target_modules]  # fmt: skip
    if args.exclude_modules:
        flags += ["--exclude-modules", *args.exclude_modules]
    if args.lora_alpha is not None:
        flags += ["--lora-alpha", str(args.lora_alpha)]
    if args.tag:
        flags += ["--tag", args.tag]
    for switch in ("param_offload", "layered_summon", "use_shm", "skip_checkpoint"):
        if getattr(args, switch):
            flags.append("--" + switch.replace("_", "-"))
    return flags


def rows_logged(checkpoint_dir: Path, shape: dict[str, Any]) -> dict[str, Any]:
    """What a run that stopped early left: the summary of the rows its metrics.jsonl holds."""
    jsonl = checkpoint_dir / "metrics.jsonl"
    history = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()] if jsonl.exists() else []
    return {**summarize(history, shape), "history": history} if history else {}


def cut_short(args: argparse.Namespace, arch: str, since: float) -> dict[str, Any]:
    """What a size killed at --timeout left (its config says where its rows are)."""
    config_path = Path(args.workdir) / f"config-{label(arch, args.tag)}.json"
    if not config_path.exists() or config_path.stat().st_mtime < since:
        return {}
    return rows_logged(Path(json.loads(config_path.read_text())["checkpoint"]["dir"]), SHAPES[args.shape])


def run(args: argparse.Namespace) -> int:
    """Every size, each in a fresh process; one JSON with all of them."""
    results = []
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for arch in args.arch:
        name = label(arch, args.tag)
        out = Path(args.out).with_name(f"scale-{name}.json")
        out.unlink(missing_ok=True)
        command = [sys.executable, __file__, "one", "--arch", arch, "--out", str(out), *child_flags(args)]
        since = time.time()
        try:
            code: int | str = subprocess.run(command, check=False, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = f"killed at --timeout {args.timeout} s"
            log(f"{name}: {code}")
        if out.exists():
            results.append(json.loads(out.read_text()))
        else:
            lora = {"rank": args.lora_rank} if args.lora_rank > 0 else None
            results.append(
                {
                    "arch": arch,
                    "tag": args.tag,
                    "lora": lora,
                    "trains": False,
                    "exit": code,
                    **cut_short(args, arch, since),
                }
            )
    Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    for r in results:
        means = r.get("means", {})
        lora = r.get("lora") or {}
        log(
            f"{r['arch']} {r.get('tag') or ''}: trains={r.get('trains')} steps={r.get('steps')} "
            f"lora_rank={lora.get('rank', 0)} step={means.get('timing_s/step', float('nan')):.1f}s "
            f"gen={means.get('timing_s/gen', float('nan')):.1f}s "
            f"update={means.get('timing_s/update_actor', float('nan')):.1f}s "
            f"sync={means.get('timing_s/update_weights', float('nan')):.2f}s "
            f"tok/s/GPU={means.get('perf/throughput', float('nan')):.0f} "
            f"peak={r.get('peak_allocated_gb') or float('nan'):.1f}GB "
            f"update_peak={means.get('perf/max_memory_allocated_gb', float('nan')):.1f}GB "
            f"{str(r.get('error', r.get('exit', '')))[:300]}"
        )
    return 0


def trl(args: argparse.Namespace) -> int:
    """TRL's GRPOTrainer at one size and shape, with grpo_bench.py's TRL settings (HF generation,
    beta 0, responses forced to full length): the peer of `run`'s row at 3B and 7B. The micro-batch
    and gradient checkpointing are the shape's; --model-dtype bf16 loads bf16 weights (TRL's
    default), fp32 float32 ones."""
    import grpo_bench

    arch, shape = args.arch[0], SHAPES[args.shape]
    model = grpo_bench.ensure_model(Path(args.workdir) / f"model-{arch}", {**_COMMON, **ARCHS[arch]})
    settings = argparse.Namespace(
        out=Path(args.out),
        workdir=args.workdir,
        steps=args.steps,
        generation="hf",
        gpu_util=args.gpu_util,
        tiny=args.device == "cpu",
        trl_micro=shape["micro"],
        trl_dtype="bfloat16" if args.model_dtype == "bf16" else "float32",
        trl_gradient_checkpointing=shape["checkpointing"],
        arch=arch,
    )
    log(f"TRL {arch}, shape {args.shape}: {shape}")
    return grpo_bench.train_trl(
        settings, model, {key: shape[key] for key in ("prompts", "n", "prompt_len", "response_len")}
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["run", "one", "trl"])
    parser.add_argument("--arch", nargs="+", default=["0.5b", "7b"], choices=sorted(ARCHS))
    parser.add_argument("--shape", default="scale", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gpu-util", type=float, default=0.3, help="vLLM gpu_memory_utilization")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--param-offload", action="store_true", help="actor.fsdp_config.param_offload")
    parser.add_argument("--model-dtype", default="fp32", choices=["fp32", "bf16"], help="actor.fsdp_config.model_dtype")
    parser.add_argument("--lr", type=float, default=1e-6, help="actor.optim.lr")
    parser.add_argument("--lora-rank", type=int, default=0, help="model.lora_rank (0: full fine-tuning)")
    parser.add_argument("--lora-alpha", type=int, default=None, help="model.lora_alpha (the trainer's default: 16)")
    parser.add_argument("--target-modules", nargs="+", default=["all-linear"], help="model.target_modules")
    parser.add_argument("--exclude-modules", nargs="*", default=[], help="model.exclude_modules")
    parser.add_argument("--layered-summon", action="store_true", help="rollout.layered_summon")
    parser.add_argument("--use-shm", action="store_true", help="model.use_shm")
    parser.add_argument("--skip-checkpoint", action="store_true", help="no ranks' parts in the final checkpoint")
    parser.add_argument("--tag", default="", help="names this run's files: scale-<arch>-<tag>.json")
    parser.add_argument("--timeout", type=float, default=None, help="run: seconds per size before it is killed")
    parser.add_argument("--workdir", default="/tmp/rlkube-scale")
    parser.add_argument("--out", default="bench-out/scale.json")
    args = parser.parse_args()
    if args.phase == "trl" and len(args.arch) != 1:
        parser.error(f"--arch: trl runs one size at a time, got {' '.join(args.arch)}")
    return {"one": one, "run": run, "trl": trl}[args.phase](args)


if __name__ == "__main__":
    raise SystemExit(main())
