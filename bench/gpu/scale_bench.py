"""Issue 14's benchmark: does a GRPO step train at each Qwen2.5 size on one GPU, and how fast,
through the trainer's own path (`driver.run_in_process`: one rank with an NCCL group of one,
FSDP2 with bf16 compute over fp32 master weights, the colocated vLLM engine sleeping while
the actor trains, chunked LM-head log-probs).

    python3 bench/gpu/scale_bench.py run --arch 0.5b 7b --out $OUT/scale.json

Each size runs in a process of its own (`one`), since vLLM wants one engine per process; a
size that fails (out of memory, say) is recorded with its error and the next one runs.
Models are random-initialised Qwen2.5 shapes the script saves itself (bf16 safetensors).
"""

# ruff: noqa: PLC0415
from __future__ import annotations

import argparse
import json
import os
import random
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
# The shape: 32 prompts x 8 samples, 256 + 512 tokens, gradient checkpointing, micro-batch 4.
SHAPES = {
    "scale": {"prompts": 32, "n": 8, "prompt_len": 256, "response_len": 512, "micro": 4, "checkpointing": True},
    "bench": {"prompts": 64, "n": 8, "prompt_len": 256, "response_len": 512, "micro": 16, "checkpointing": False},
    "tiny": {"prompts": 4, "n": 2, "prompt_len": 16, "response_len": 8, "micro": 4, "checkpointing": False},
}


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_task(workdir: Path, arch: str, shape: dict[str, Any], steps: int, gpu_util: float, device: str) -> Path:
    """Model, prompts (random bytes: one token each), reward file and trainer config."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from grpo_bench import REWARD_SOURCE, ensure_model

    model = ensure_model(workdir / f"model-{arch}", {**_COMMON, **ARCHS[arch]})
    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    rows = [
        {
            "data_source": "bench",
            "prompt": "".join(rng.choice(alphabet) for _ in range(shape["prompt_len"])),
            "reward_model": {"ground_truth": ""},
        }
        for _ in range(shape["prompts"] * (steps + 1))
    ]
    pq.write_table(pa.Table.from_pylist(rows), workdir / "prompts.parquet")
    (workdir / "reward.py").write_text(REWARD_SOURCE)
    config = {
        "model": {"path": str(model), "enable_gradient_checkpointing": shape["checkpointing"]},
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
            "optim": {"lr": 1e-6},
            "ppo_mini_batch_size": shape["prompts"],
            "ppo_micro_batch_size_per_gpu": shape["micro"],
        },
        "rollout": {
            "name": "vllm",
            "n": shape["n"],
            "ignore_eos": True,
            "gpu_memory_utilization": gpu_util,
            "free_cache_engine": True,
        },
        "reward": {"function": {"path": str(workdir / "reward.py")}},
        "trainer": {"total_training_steps": steps, "seed": 1, "device": device},
        "checkpoint": {"dir": str(workdir / f"checkpoints-{arch}"), "export_hf": False, "resume": "disable"},
        "roles": {"actor": {"replicas": 1, "gpus_per_replica": 1 if device == "cuda" else 0}},
    }
    path = workdir / f"config-{arch}.json"
    path.write_text(json.dumps(config))
    return path


def one(args: argparse.Namespace) -> int:
    """One size in this process: train, then write the summary."""
    import torch

    from rlkube_api.validation import parse_trainer_config
    from rlkube_trainer.driver import run_in_process

    shape = SHAPES[args.shape]
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    task = write_task(workdir, args.arch[0], shape, args.steps, args.gpu_util, args.device)
    config = parse_trainer_config(json.loads(task.read_text()))
    if torch.cuda.is_available():  # the model was built on the GPU: start the measurement clean
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    log(f"{args.arch[0]}: task written in {time.perf_counter() - started:.0f} s; training {args.steps} steps")
    summary: dict[str, Any] = {"arch": args.arch[0], "shape": shape, "gpu_memory_utilization": args.gpu_util}
    try:
        result = run_in_process(config, progress=False)
        rows = result.history[1:] or result.history  # the first step warms up
        keys = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor",
                "timing_s/update_weights", "perf/throughput", "perf/max_memory_allocated_gb",
                "perf/max_memory_reserved_gb", "perf/weight_sync_gb_per_s")  # fmt: skip
        summary.update(
            trains=True,
            steps=len(result.history),
            means={k: sum(r[k] for r in rows if k in r) / max(1, sum(1 for r in rows if k in r)) for k in keys},
            history=result.history,
        )
    except Exception as error:
        summary.update(trains=False, error=f"{type(error).__name__}: {str(error)[:2000]}")
    summary["peak_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
    summary["peak_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30
    summary["wall_s"] = time.perf_counter() - started
    Path(args.out).write_text(json.dumps(summary, indent=1, default=str))
    log(json.dumps({k: v for k, v in summary.items() if k != "history"}, default=str))
    return 0


def run(args: argparse.Namespace) -> int:
    """Every size, each in a fresh process; one JSON with all of them."""
    results = []
    for arch in args.arch:
        out = Path(args.out).with_name(f"scale-{arch}.json")
        command = [sys.executable, __file__, "one", "--arch", arch, "--out", str(out), "--workdir", args.workdir,
                   "--steps", str(args.steps), "--gpu-util", str(args.gpu_util), "--shape", args.shape,
                   "--device", args.device]  # fmt: skip
        code = subprocess.run(command, check=False).returncode
        results.append(json.loads(out.read_text()) if out.exists() else {"arch": arch, "trains": False, "exit": code})
    Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    for r in results:
        means = r.get("means", {})
        log(
            f"{r['arch']}: trains={r.get('trains')} step={means.get('timing_s/step', float('nan')):.1f}s "
            f"tok/s/GPU={means.get('perf/throughput', float('nan')):.0f} "
            f"peak={r.get('peak_allocated_gb', float('nan')):.1f}GB {r.get('error', '')[:200]}"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("phase", choices=["run", "one"])
    parser.add_argument("--arch", nargs="+", default=["0.5b", "7b"], choices=sorted(ARCHS))
    parser.add_argument("--shape", default="scale", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gpu-util", type=float, default=0.3, help="vLLM gpu_memory_utilization")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--workdir", default="/tmp/rlkube-scale")
    parser.add_argument("--out", default="bench-out/scale.json")
    args = parser.parse_args()
    return one(args) if args.phase == "one" else run(args)


if __name__ == "__main__":
    raise SystemExit(main())
