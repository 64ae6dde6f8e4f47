"""Host work of the actor update per micro-batch (a benchmark, not a test): the trainer's own
Actor on CPU, with Qwen2.5-0.5B's depth (24 decoder layers, 14/2 heads' layout at narrow widths)
and a small synthetic GRPO batch, counts the aten operators one update dispatches under
torch.profiler, for micro-batch sizes, gradient checkpointing and compiled decoder layers.

The count does not depend on the widths, and on a GPU each operator costs host time to launch
whatever its size: it is what bounds an update whose micro-batches are small (the
model sizes' runs, at micro-batch 4 with gradient checkpointing). The fixed part of an update (the optimizer
step, the gradient clip) is split from the part per micro-batch by two micro-batch sizes.

    .venv/bin/python bench/update_ops.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import grpo_bench as gb  # after sys.path is set
import liger_bench as lb

# Qwen2.5-0.5B's depth and head layout; the widths small enough for a CPU.
ARCH = {**gb.QWEN25_05B, "vocab_size": 4096, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
# 32 samples: 8 micro-batches of 4, 2 of 16.
SHAPE = {"prompts": 8, "n": 4, "prompt_len": 32, "response_len": 32}


def count(
    workdir: Path, model_dir: Path, batch: Any, micro: int, checkpointing: bool, compiled: bool
) -> dict[str, Any]:
    from rlkube_trainer.workers.builders import build_actor  # noqa: PLC0415  (after sys.path is set)

    overrides = [f"actor.compile_decoder_layers={str(compiled).lower()}"]
    cfg = gb.trainer_config(
        workdir,
        model_dir,
        SHAPE,
        "grpo",
        device="cpu",
        micro=micro,
        gradient_checkpointing=checkpointing,
        overrides=overrides,
    )
    actor = build_actor(cfg, torch.device("cpu"), 100)
    actor.update(batch)  # warm-up: compiled layers compile here
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        actor.update(batch)
    aten = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    started = time.perf_counter()
    actor.update(batch)
    return {
        "micro": micro,
        "checkpointing": checkpointing,
        "compiled": compiled,
        "micro_batches": len(batch) // micro,
        "aten_ops": sum(e.count for e in aten),
        "update_s": time.perf_counter() - started,
        "most": sorted(((e.count, e.key) for e in aten), reverse=True)[:5],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here too")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model_dir = gb.ensure_model(workdir / "model", ARCH)
        batch = lb.synthetic_batch(SHAPE, ARCH["vocab_size"])
        for checkpointing, compiled in ((False, False), (True, False), (False, True), (True, True)):
            pair = [count(workdir, model_dir, batch, micro, checkpointing, compiled) for micro in (4, 16)]
            # ops = fixed + per_micro * micro_batches, from the two sizes.
            small, large = pair
            per_micro = (small["aten_ops"] - large["aten_ops"]) / (small["micro_batches"] - large["micro_batches"])
            fixed = large["aten_ops"] - per_micro * large["micro_batches"]
            for row in pair:
                row |= {"ops_per_micro_batch": round(per_micro), "ops_fixed": round(fixed)}
                rows.append(row)
                print(json.dumps(row))
    print("\n| checkpointing | compiled layers | aten ops per micro-batch | fixed per update |")
    print("|---|---|---|---|")
    for row in rows[::2]:
        print(f"| {row['checkpointing']} | {row['compiled']} | {row['ops_per_micro_batch']:,} | {row['ops_fixed']:,} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
