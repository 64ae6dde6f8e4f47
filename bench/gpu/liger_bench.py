#!/usr/bin/env python3
"""The actor update's kernels: the trainer's own Actor at grpo_bench's shape (random
Qwen2.5-0.5B, 512 samples of 256 + 512 tokens, one mini-batch, micro-batch 16, bf16 under FSDP2
on one GPU), on a synthetic GRPO batch, with each variant's changes:

  liger    model.use_liger (liger-kernel's RMSNorm, SwiGLU MLP, rotary)
  compile  actor.compile_decoder_layers (torch.compile of every decoder layer's forward; FSDP2's
           hooks stay eager)
  nohead   actor.recompute_logits never (no recompute of the LM head's chunks in the backward)

Every variant sets actor.recompute_logits explicitly (always unless nohead): the trainer's default,
auto, would keep the logits at this shape and make plain and nohead the same run.

  python3 bench/gpu/liger_bench.py --out OUT/liger.json [--variants plain,liger,compile+nohead] [--tiny]

Variants without liger run first: liger's patches replace functions of transformers' Qwen2
module for the whole process. A variant that fails is recorded with its error; the next runs.

Per variant: the log-probs of the first 32 samples before any update (the two variants must
agree up to bf16 rounding), one warm-up update on 32 samples, then `repeats` timed updates on the
whole batch (seconds, model TFLOP/s, share of the measured bf16 matmul rate, peak memory).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_bench as gb


def synthetic_batch(shape: dict[str, int], vocab: int) -> object:
    from rlkube_trainer.batch import TrainBatch  # noqa: PLC0415  (after sys.path is set)

    g = torch.Generator().manual_seed(0)
    samples = shape["prompts"] * shape["n"]
    seq = shape["prompt_len"] + shape["response_len"]
    ids = torch.randint(3, vocab, (samples, seq), generator=g)
    adv = torch.randn(samples, 1, generator=g).expand(samples, shape["response_len"]).contiguous()
    return TrainBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        responses=ids[:, shape["prompt_len"] :].clone(),
        response_mask=torch.ones(samples, shape["response_len"], dtype=torch.long),
        group_index=torch.arange(samples) // shape["n"],
        prompt_lengths=torch.full((samples,), shape["prompt_len"]),
        advantages=adv,
    )


def run_variant(
    args: argparse.Namespace,
    arch: dict[str, Any],
    shape: dict[str, int],
    device: torch.device,
    workdir: Path,
    model_dir: Path,
    batch: Any,
    changes: set[str],
    rate: float,
    first: torch.Tensor | None,
) -> dict[str, Any]:
    from rlkube_trainer.workers.builders import build_actor  # noqa: PLC0415  (after sys.path is set)

    overrides = [
        f"model.use_liger={str('liger' in changes).lower()}",
        f"actor.compile_decoder_layers={str('compile' in changes).lower()}",
        f"actor.recompute_logits={'never' if 'nohead' in changes else 'always'}",
    ]
    cfg = gb.trainer_config(
        workdir, model_dir, shape, "grpo", device=device.type, micro=4 if args.tiny else 16, overrides=overrides
    )
    actor = build_actor(cfg, device, 100)
    layer = actor.model.model.layers[0]
    kernels = f"norm {layer.input_layernorm.forward.__qualname__}, mlp {layer.mlp.forward.__qualname__}"
    log_probs = actor.compute_log_prob(batch.select(slice(0, 32)))
    diff = (log_probs - first).abs().max().item() if first is not None else 0.0
    warm = time.perf_counter()
    actor.update(batch.select(slice(0, 32)))  # warm-up: kernels compiled, allocator grown
    warm_s = time.perf_counter() - warm
    times, peak = [], 0.0
    for _ in range(args.repeats):
        dt, metrics = gb.timed(lambda actor=actor: actor.update(batch))
        times.append(dt)
        peak = max(peak, metrics.get("perf/max_memory_allocated_gb", 0.0))
    seq = shape["prompt_len"] + shape["response_len"]
    flops = gb.train_flops(gb.matmul_params(actor.model), arch, len(batch), seq)
    best = min(times)
    del actor
    return {
        "changes": sorted(changes),
        "kernels": kernels,
        "warm_up_s": warm_s,
        "update_s": times,
        "model_tflops": flops / best / 1e12,
        "mfu": flops / best / rate if rate else None,
        "peak_allocated_gb": peak,
        "log_prob_max_abs_diff_vs_first": diff,
        "log_probs": log_probs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-out/liger.json"))
    parser.add_argument("--workdir", default="/tmp/rlkube-bench")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default="plain,liger", help="comma-separated; each a '+'-joined set of changes")
    parser.add_argument("--tiny", action="store_true", help="tiny model and shape on CPU (a check of this script)")
    args = parser.parse_args()

    arch, shape = (gb.TINY, gb.TINY_SHAPE) if args.tiny else (gb.QWEN25_05B, gb.FULL_SHAPE)
    device = torch.device("cpu" if args.tiny else "cuda")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    res = gb.Results(args.out)
    res.put("env", gb.environment())
    res.put("ceilings", gb.matmul_tflops())
    rate = res["ceilings"].get("bf16_matmul_tflops", 0.0) * 1e12
    model_dir = gb.ensure_model(workdir / ("model-tiny" if args.tiny else "model-qwen2.5-0.5b"), arch)
    batch = synthetic_batch(shape, arch["vocab_size"])
    first: torch.Tensor | None = None
    names = args.variants.split(",")
    names.sort(key=lambda name: "liger" in name.split("+"))  # stable: liger's process-wide patches last
    for name in names:
        changes = set(name.split("+")) - {"plain"}
        unknown = changes - {"liger", "compile", "nohead"}
        if unknown:
            raise SystemExit(f"--variants: unknown change(s) {sorted(unknown)} in {name!r}")
        try:
            row = run_variant(args, arch, shape, device, workdir, model_dir, batch, changes, rate, first)
        except Exception as exc:  # a variant's failure is a result; the next one runs
            res.put(name, {"error": f"{type(exc).__name__}: {exc}"[:2000]})
            gb.log(f"{name}: failed: {type(exc).__name__}: {exc}")
            continue
        finally:
            gc.collect()
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
        if first is None:
            first = row.pop("log_probs")
        else:
            row.pop("log_probs")
        res.put(name, row)
        gb.log(f"{name}: {json.dumps(row)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
