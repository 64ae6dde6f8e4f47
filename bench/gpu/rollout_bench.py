#!/usr/bin/env python3
"""The rollout engine's options, each measured alone on the GRPO benchmark's rollout.

The rollout of `grpo_bench.py`'s shape: 64 prompts x n=8 of 256 tokens, 512 new tokens each
(EOS ignored), no log-probs, one seed per batch (what `rollout.build_engine` asks for), a
random-initialised Qwen2.5-0.5B-shaped model. Every variant runs in fresh processes (vLLM keeps
process-wide state) and reports generated tokens per second of wall time:

  python3 bench/gpu/rollout_bench.py run --out OUT/rollout.json              # every variant
  python3 bench/gpu/rollout_bench.py run --variants base,no_prefix --out ...  # some
  python3 bench/gpu/rollout_bench.py run --tiny --out /tmp/r.json            # CPU smoke test

Variants (`VARIANTS`): prefix caching on (the trainer's engine until now) or off, vLLM's async
scheduling off, larger scheduling batches (max_num_batched_tokens / max_num_seqs), and the
512 sequences split over 2 or 4 engine processes on the one GPU (each its own host thread of
scheduling). `--site DIR` puts another vLLM build first on the path (a newer release for the
same torch) for every variant.

With several engines, the processes start and warm up, wait at a barrier (a file), then all
generate their share at once: throughput is all their tokens over the span from the first
start to the last finish.
"""

# ruff: noqa: PLC0415
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# name -> (engine processes, vllm.LLM keyword arguments)
VARIANTS: dict[str, tuple[int, dict[str, Any]]] = {
    "base": (1, {"enable_prefix_caching": True}),
    "no_prefix": (1, {"enable_prefix_caching": False}),
    "no_prefix_sync_sched": (1, {"enable_prefix_caching": False, "async_scheduling": False}),
    "no_prefix_big_batches": (
        1,
        {"enable_prefix_caching": False, "max_num_batched_tokens": 65536, "max_num_seqs": 1024},
    ),
    "no_prefix_2_engines": (2, {"enable_prefix_caching": False}),
    "no_prefix_4_engines": (4, {"enable_prefix_caching": False}),
}


def log(msg: str) -> None:
    print(f"[rollout_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def worker(spec: dict[str, Any]) -> int:
    """One engine: start, warm up, wait at the barrier, generate its share, write its JSON."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    sys.path.insert(0, str(HERE))
    import grpo_bench  # the model and prompts of the GRPO benchmark
    import vllm

    arch, shape = (
        (grpo_bench.TINY, grpo_bench.TINY_SHAPE) if spec["tiny"] else (grpo_bench.QWEN25_05B, grpo_bench.FULL_SHAPE)
    )
    model_dir = grpo_bench.ensure_model(Path(spec["model_dir"]), arch)
    prompts = grpo_bench.make_prompts(shape, arch["vocab_size"])
    share = prompts[spec["index"] :: spec["engines"]]
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": "float32" if spec["tiny"] else "bfloat16",
        "max_model_len": shape["prompt_len"] + shape["response_len"],
        "seed": 1,
        **spec["options"],
    }
    if spec["tiny"]:
        kwargs["kv_cache_memory_bytes"] = 256 * 2**20
        kwargs["enforce_eager"] = True
    else:
        kwargs["gpu_memory_utilization"] = spec["gpu_util"] / spec["engines"]
    started = time.perf_counter()
    llm = vllm.LLM(**kwargs)
    start_s = time.perf_counter() - started

    def params(max_tokens: int) -> Any:
        return vllm.SamplingParams(
            n=shape["n"], temperature=1.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False
        )

    requests = [{"prompt_token_ids": p.prompt_token_ids} for p in share]
    llm.generate(requests, params(8), use_tqdm=False)  # warm-up: compiled paths, allocator
    ready = Path(spec["barrier"]) / f"ready-{spec['index']}"
    ready.write_text("")
    go = Path(spec["barrier"]) / "go"
    while not go.exists():
        time.sleep(0.005)
    runs = []
    for _ in range(spec["repeats"]):
        t0 = time.time()
        outputs = llm.generate(requests, params(shape["response_len"]), use_tqdm=False)
        t1 = time.time()
        tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        runs.append({"start": t0, "end": t1, "tokens": tokens})
    Path(spec["out"]).write_text(
        json.dumps(
            {"start_s": start_s, "vllm": vllm.__version__, "sequences": len(requests) * shape["n"], "runs": runs}
        )
    )
    return 0


def run_variant(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    engines, options = VARIANTS[name]
    barrier = tmp / name
    barrier.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.site:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(args.site), env.get("PYTHONPATH", "")) if p)
    procs = []
    outs = []
    for index in range(engines):
        out = barrier / f"engine-{index}.json"
        outs.append(out)
        spec = {
            "index": index,
            "engines": engines,
            "options": options,
            "tiny": args.tiny,
            "gpu_util": args.gpu_util,
            "model_dir": str(Path(args.workdir) / ("model-tiny" if args.tiny else "model-qwen2.5-0.5b")),
            "barrier": str(barrier),
            "repeats": args.repeats,
            "out": str(out),
        }
        procs.append(subprocess.Popen([sys.executable, __file__, "worker", json.dumps(spec)], env=env))
    deadline = time.monotonic() + args.timeout
    while sum((barrier / f"ready-{i}").exists() for i in range(engines)) < engines:
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            return {"error": f"an engine failed to start (exit codes {[p.poll() for p in procs]})"}
        time.sleep(0.05)
    (barrier / "go").write_text("")
    codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    if any(codes):
        return {"error": f"engine exit codes {codes}"}
    results = [json.loads(o.read_text()) for o in outs]
    rates = []
    for r in range(args.repeats):
        span = max(x["runs"][r]["end"] for x in results) - min(x["runs"][r]["start"] for x in results)
        tokens = sum(x["runs"][r]["tokens"] for x in results)
        rates.append({"s": span, "tokens": tokens, "tokens_per_s": tokens / span})
    return {
        "engines": engines,
        "options": options,
        "vllm": results[0]["vllm"],
        "start_s": max(x["start_s"] for x in results),
        "runs": rates,
        "best_tokens_per_s": max(r["tokens_per_s"] for r in rates),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["run", "worker"])
    parser.add_argument("spec", nargs="?", help="worker: its JSON spec")
    parser.add_argument("--out", type=Path, default=Path("bench-out/rollout.json"))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--workdir", default="/tmp/rlkube-bench")
    parser.add_argument("--gpu-util", type=float, default=0.25, help="shared by the engines of a variant")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--site", type=Path, help="a folder put first on PYTHONPATH (another vLLM build)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per variant")
    parser.add_argument("--tiny", action="store_true", help="tiny model and shape on CPU (smoke test)")
    args = parser.parse_args(argv)
    if args.phase == "worker":
        return worker(json.loads(args.spec))
    tmp = Path(args.workdir) / f"rollout-bench-{os.getpid()}"
    results: dict[str, Any] = {"site": str(args.site) if args.site else None}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.variants.split(","):
        started = time.monotonic()
        log(f"variant {name}: {VARIANTS[name]}")
        results[name] = run_variant(name, args, tmp)
        results[name]["wall_s"] = time.monotonic() - started
        log(f"variant {name}: {json.dumps(results[name])}")
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
