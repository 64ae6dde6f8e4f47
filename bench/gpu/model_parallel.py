"""Training model parallelism on several GPUs of one host: the actor in tensor × pipeline
parallel layouts against FSDP alone on the same GPUs, through the pods' entry points
(bench/gpu/local_pods.py runs each RLJob's pods as processes with the operator's env).

    python bench/gpu/model_parallel.py prepare --workdir W --jobs mp-7b-tp2pp2,mp-7b-fsdp4
    python bench/gpu/local_pods.py W/jobs/<name>.yaml ...  # see run.sh's model-parallel phase
    python bench/gpu/model_parallel.py report --workdir W --runs R
    python bench/gpu/model_parallel.py gpus mp-7b-tp2pp2                   # 0+1+2+3: local_pods' --gpus

Jobs (random-initialised Qwen2.5 architectures, GRPO, 32 prompts x 8, 256 + 512 tokens with EOS
ignored, micro-batch 4, gradient checkpointing, one optimizer step per step, the rollout
colocated: one vLLM engine of the rollout's tensor-parallel size per group of the actor's ranks):
- mp-7b-tp2pp2: Qwen2.5-7B, one pod of 4 GPUs, tensor parallel 2 x pipeline parallel 2 (no data
  parallel), rollout tensor parallel 2;
- mp-7b-fsdp4: the same model and GPUs, FSDP2 over all 4 (the layout before model parallelism);
- mp-7b-tp2, mp-7b-pp2: tensor parallel 2 alone, pipeline parallel 2 alone (each x data parallel
  2 on the same 4 GPUs), the layouts to compare with where the trainer refuses TP x PP (it did at
  the time of writing: pipeline stages ran with tensor and sequence parallel 1);
- mp-32b-tp4pp2: Qwen2.5-32B, one pod of 8 GPUs, tensor parallel 4 x pipeline parallel 2,
  bf16 master weights (fp32 ones and their AdamW moments, 16 bytes a parameter, would take
  66 GB of each GPU's 80), rollout tensor parallel 4;
- mp-32b-fsdp8: the same on FSDP2 over all 8.
"""

# ruff: noqa: PLC0415  (heavy imports only in the phase that needs them)

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _sub in ("api", "trainer"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))
sys.path.insert(0, str(HERE))

from multi_gpu import REWARD, grpo_spec, metrics, rljob, write_prompts  # noqa: E402

SHAPE = {"prompts": 32, "n": 8, "prompt_len": 256, "response_len": 512}
COMMON = {"max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "vocab_size": 152064}
ARCHS: dict[str, dict[str, Any]] = {
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "tie_word_embeddings": False},
    "32b": {"hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 40,
            "num_key_value_heads": 8, "tie_word_embeddings": False},
}  # fmt: skip


# name: (arch, GPUs, tensor parallel, pipeline parallel, rollout tensor parallel, master-weight dtype)
JOBS: dict[str, tuple[str, int, int, int, int, str]] = {
    "mp-7b-tp2pp2": ("7b", 4, 2, 2, 2, "fp32"),
    "mp-7b-fsdp4": ("7b", 4, 1, 1, 2, "fp32"),
    "mp-7b-tp2": ("7b", 4, 2, 1, 2, "fp32"),
    "mp-7b-pp2": ("7b", 4, 1, 2, 2, "fp32"),
    "mp-32b-tp4pp2": ("32b", 8, 4, 2, 4, "bf16"),
    "mp-32b-fsdp8": ("32b", 8, 1, 1, 4, "bf16"),
}


def job(workdir: Path, name: str, model: Path, data: Path, steps: int) -> dict[str, Any]:
    _arch, gpus, tp, pp, rollout_tp, master = JOBS[name]
    actor_role: dict[str, Any] = {"replicas": 1, "gpusPerReplica": gpus}
    if tp > 1:
        actor_role["tensorParallelSize"] = tp
    if pp > 1:
        actor_role["pipelineParallelSize"] = pp
    spec = grpo_spec(workdir, name, model, data, SHAPE, micro_batch=4, steps=steps)
    spec["model"]["enableGradientCheckpointing"] = True
    spec["actor"]["fsdpConfig"] = {"modelDtype": master}
    spec["roles"] = {"actor": actor_role, "rollout": {"tensorParallelSize": rollout_tp}}
    return rljob(name, spec)


def ensure_model(path: Path, arch: dict[str, Any]) -> Path:
    """grpo_bench.ensure_model's model, built in bf16 from the start: the 32B one (65 GB) fits one
    80 GB GPU only so (built in fp32 first it would need twice that)."""
    import torch
    from grpo_bench import ensure_model as build

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return build(path, arch)
    finally:
        torch.set_default_dtype(previous)


def prepare(workdir: Path, names: list[str], steps: int) -> None:
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        raise SystemExit(f"unknown jobs {unknown}; known: {', '.join(JOBS)}")
    (workdir / "jobs").mkdir(parents=True, exist_ok=True)
    (workdir / "reward.py").write_text(REWARD)
    data = workdir / "data" / "prompts.parquet"
    write_prompts(data, SHAPE["prompts"] * steps, SHAPE["prompt_len"])
    for name in names:
        arch = JOBS[name][0]
        model = ensure_model(workdir / f"qwen2.5-{arch}-arch", {**COMMON, **ARCHS[arch]})
        path = workdir / "jobs" / f"{name}.yaml"
        path.write_text(yaml.safe_dump(job(workdir, name, model, data, steps), sort_keys=False))
        print(f"wrote {path}")


def report(workdir: Path, runs: Path) -> None:
    """Per job: the steps after the first (a warm-up), medians of the trainer's own rows."""
    lines = []
    keys = ("perf/throughput", "timing_s/step", "timing_s/gen", "timing_s/update_actor", "timing_s/update_weights",
            "perf/max_memory_allocated_gb")  # fmt: skip
    for name, (arch, gpus, tp, pp, rollout_tp, master) in JOBS.items():
        rows = metrics(workdir / "runs" / name)
        layout = f"{arch}, {gpus} GPUs, TP {tp} x PP {pp}, rollout TP {rollout_tp}, {master} master weights"
        if not rows:
            lines.append(f"{name} ({layout}): no steps")
            continue
        steady = rows[1:] or rows
        summary = {k: round(statistics.median(r[k] for r in steady), 3) for k in keys if k in steady[0]}
        lines.append(f"{name} ({layout}): {len(rows)} steps, medians of {len(steady)}: {json.dumps(summary)}")
    text = "\n".join(lines)
    print(text)
    (runs / "model-parallel.txt").write_text(text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["prepare", "report", "gpus"])
    parser.add_argument("job", nargs="?", help="gpus: the job whose pod's devices to print")
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("WORKDIR", "/tmp/rlkube-mp")))
    parser.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated, of: {', '.join(JOBS)}")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=Path, default=Path("."), help="report: where the report is written")
    args = parser.parse_args(argv)
    if args.phase == "gpus":
        print("+".join(str(i) for i in range(JOBS[args.job][1])))
    elif args.phase == "prepare":
        prepare(args.workdir, [j for j in args.jobs.split(",") if j], args.steps)
    else:
        report(args.workdir, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
