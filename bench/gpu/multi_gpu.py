"""Several GPUs of one host: FSDP across GPUs with NCCL, separate-rollout weight broadcast, and
colocated vs separate placement, all through the pods' entry points (bench/gpu/local_pods.py
runs an RLJob's pods as processes with the operator's env).

    python bench/gpu/multi_gpu.py prepare --workdir W     # models, data, the RLJobs
    python bench/gpu/local_pods.py W/jobs/<name>.yaml ...  # see run.sh's multi-gpu phase
    python bench/gpu/multi_gpu.py broadcast --workdir W --out R/broadcast.json
    python bench/gpu/multi_gpu.py report --workdir W --runs R

Jobs written by `prepare`:
- learn-1gpu: the tiny task (trainer core's learning test), GRPO, actor on 1 GPU, colocated;
- learn-2gpu: the same seed, actor FSDP2 over 2 GPUs (NCCL), rollout separate (on GPU 1 too:
  two GPUs cannot give the actor two and the rollout one of its own), weights broadcast each step;
- tput-colocated: Qwen2.5-0.5B's architecture (random), 64 prompts x 8, 256 + 512 tokens, actor
  FSDP2 over both GPUs, each rank with its own vLLM engine (hybrid engine);
- tput-separate: the same on the same two GPUs: actor on GPU 0, vLLM rollout on GPU 1.
"""

# ruff: noqa: PLC0415  (heavy imports only in the phase that needs them)

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _sub in ("api", "trainer"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))
sys.path.insert(0, str(HERE))

SHAPE = {"prompts": 64, "n": 8, "prompt_len": 256, "response_len": 512}
QWEN25_15B = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12}
REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Cheap and varied: GRPO needs different scores within a group."""
    return (len(solution_str) % 7) / 7.0
'''


def rljob(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "rlkube.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name}, "spec": spec}


def shared(workdir: Path) -> list[dict[str, Any]]:
    """spec.volumes: the work folder as a volume every pod mounts, so that checkpoint.dir under it
    is shared storage (the API refuses a checkpoint.dir in a container's own filesystem). On one
    host the pods are processes and the folder is simply there; the claim is never looked up."""
    return [
        {"name": "work", "mountPath": str(workdir), "source": {"persistentVolumeClaim": {"claimName": "bench-work"}}}
    ]


def learn_job(workdir: Path, gpus: int) -> dict[str, Any]:
    """The tiny task's trainer config as an RLJob spec (camelCase), on 1 or 2 GPUs."""
    from rlkube_trainer.tiny.task import init

    task = workdir / "tiny"
    config = yaml.safe_load(init(task, "grpo", 60).read_text())
    spec: dict[str, Any] = {
        "image": "rlkube-trainer:bench",
        "volumes": shared(workdir),
        "model": {"path": config["model"]["path"]},
        "data": {
            "trainFiles": config["data"]["train_files"],
            "maxPromptLength": config["data"]["max_prompt_length"],
            "maxResponseLength": config["data"]["max_response_length"],
            "trainBatchSize": config["data"]["train_batch_size"],
        },
        "algorithm": {"advEstimator": "grpo"},
        "actor": {
            "optim": {"lr": config["actor"]["optim"]["lr"]},
            "ppoMiniBatchSize": config["actor"]["ppo_mini_batch_size"],
            "ppoMicroBatchSizePerGpu": config["actor"]["ppo_micro_batch_size_per_gpu"],
            "strategy": "fsdp2",
        },
        "rollout": {
            "samplesPerPrompt": config["rollout"]["n"],
            "temperature": 1.0,
            "gpuMemoryUtilization": 0.05,
            "enforceEager": True,
        },
        "reward": {"function": {"path": str(task / "reward.py"), "name": "compute_score"}},
        "trainer": {"totalTrainingSteps": 60, "saveFreq": 30, "seed": 1},
        "checkpoint": {"dir": str(workdir / "runs" / f"learn-{gpus}gpu" / "checkpoints")},
        "roles": {"actor": {"replicas": gpus, "gpusPerReplica": 1}},
    }
    if gpus > 1:
        spec["roles"]["rollout"] = {"placement": "separate", "replicas": 1, "gpusPerReplica": 1}
    return rljob(f"learn-{gpus}gpu", spec)


def grpo_spec(
    workdir: Path, run: str, model: Path, data: Path, shape: dict[str, int], micro_batch: int, steps: int
) -> dict[str, Any]:
    """GRPO at `shape` with the benchmark's settings (no saves, the engine kept awake), its
    checkpoint folder under runs/`run`; the caller adds the roles."""
    return {
        "image": "rlkube-trainer:bench",
        "volumes": shared(workdir),
        "model": {"path": str(model)},
        "data": {
            "trainFiles": [str(data)],
            "maxPromptLength": shape["prompt_len"],
            "maxResponseLength": shape["response_len"],
            "trainBatchSize": shape["prompts"],
            "shuffle": False,
        },
        "algorithm": {"advEstimator": "grpo"},
        "actor": {
            "optim": {"lr": 1e-6},
            "ppoMiniBatchSize": shape["prompts"],
            "ppoMicroBatchSizePerGpu": micro_batch,
            "strategy": "fsdp2",
        },
        "rollout": {
            "samplesPerPrompt": shape["n"],
            "temperature": 1.0,
            "ignoreEos": True,
            "gpuMemoryUtilization": 0.3,
            "freeCacheEngine": False,
        },
        "reward": {"function": {"path": str(workdir / "reward.py"), "name": "compute_score"}},
        "trainer": {"totalTrainingSteps": steps, "saveFreq": -1, "seed": 1},
        "checkpoint": {"dir": str(workdir / "runs" / run / "checkpoints")},
    }


def tput_job(workdir: Path, model: Path, data: Path, placement: str) -> dict[str, Any]:
    spec = grpo_spec(workdir, f"tput-{placement}", model, data, SHAPE, micro_batch=16, steps=4)
    spec["roles"] = {"actor": {"replicas": 2 if placement == "colocated" else 1, "gpusPerReplica": 1}}
    if placement == "separate":
        spec["roles"]["rollout"] = {"placement": "separate", "replicas": 1, "gpusPerReplica": 1}
    return rljob(f"tput-{placement}", spec)


def write_prompts(path: Path, count: int, length: int, seed: int = 0) -> None:
    """Plain-text prompts of `length` letters: the byte-level tokenizer makes each one token."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    rows = [
        {
            "data_source": "bench",
            "prompt": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(length)),
            "reward_model": {"ground_truth": ""},
            "extra_info": {"index": i},
        }
        for i in range(count)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def prepare(workdir: Path) -> None:
    from grpo_bench import QWEN25_05B, ensure_model

    workdir.mkdir(parents=True, exist_ok=True)
    jobs = workdir / "jobs"
    jobs.mkdir(exist_ok=True)
    (workdir / "reward.py").write_text(REWARD)
    model = ensure_model(workdir / "qwen2.5-0.5b-arch", QWEN25_05B)
    ensure_model(workdir / "qwen2.5-1.5b-arch", {**QWEN25_05B, **QWEN25_15B})
    data = workdir / "data" / "prompts.parquet"
    write_prompts(data, SHAPE["prompts"] * 4, SHAPE["prompt_len"])
    manifests = [learn_job(workdir, 1), learn_job(workdir, 2)]
    manifests += [tput_job(workdir, model, data, p) for p in ("colocated", "separate")]
    for manifest in manifests:
        path = jobs / f"{manifest['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        print(f"wrote {path}")


# --- weight broadcast between two GPUs ----------------------------------------------------------


def _broadcast_rank(rank: int, model_dir: str, port: int, repeats: int, bucket_mb: int, out: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rlkube_api.config import TrainerSection
    from rlkube_trainer.workers.weight_sync import BroadcastGroup, manifest_of

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16).to(device)
    named = [(k, v.detach()) for k, v in model.state_dict().items()]
    manifest = manifest_of(named)
    timeout = datetime.timedelta(seconds=TrainerSection().nccl_timeout)  # the trainer's default
    group = BroadcastGroup("127.0.0.1", port, 2, rank, device, timeout)
    times = []
    total = 0
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        if rank == 0:
            total = group.send(named, manifest, bucket_mb * 2**20)
        else:
            total = sum(t.numel() * t.element_size() for _, t in group.receive(manifest, bucket_mb * 2**20))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if rank == 1:
        steady = times[1:] or times
        Path(out).write_text(
            json.dumps(
                {
                    "bytes": total,
                    "tensors": len(manifest),
                    "bucket_mb": bucket_mb,
                    "seconds": times,
                    "median_s": statistics.median(steady),
                    "gb_per_s": total / statistics.median(steady) / 1e9,
                }
            )
        )


def broadcast(workdir: Path, out: Path, repeats: int) -> None:
    import torch.multiprocessing as mp

    results = {}
    for name in ("qwen2.5-0.5b-arch", "qwen2.5-1.5b-arch"):
        for bucket_mb in (512,):
            part = out.with_name(f"broadcast-{name}-{bucket_mb}.json")
            port = 29900 + len(results)
            mp.spawn(_broadcast_rank, args=(str(workdir / name), port, repeats, bucket_mb, str(part)), nprocs=2)
            results[f"{name} bucket {bucket_mb} MB"] = json.loads(part.read_text())
            print(name, results[f"{name} bucket {bucket_mb} MB"], flush=True)
    out.write_text(json.dumps(results, indent=1))


# --- report --------------------------------------------------------------------------------------


def metrics(run: Path) -> list[dict[str, float]]:
    path = run / "checkpoints" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def report(workdir: Path, runs: Path) -> None:
    lines = []
    one, two = metrics(workdir / "runs" / "learn-1gpu"), metrics(workdir / "runs" / "learn-2gpu")
    if one and two:
        a = [r["critic/score/mean"] for r in one]
        b = [r["critic/score/mean"] for r in two]
        n = min(len(a), len(b))
        diff = [abs(x - y) for x, y in zip(a[:n], b[:n], strict=True)]
        lines.append(
            f"learn: steps 1gpu {len(a)}, 2gpu {len(b)}; score first {a[0]:.3f} / {b[0]:.3f}; "
            f"last-5 mean {statistics.mean(a[-5:]):.3f} / {statistics.mean(b[-5:]):.3f}; "
            f"mean |diff| {statistics.mean(diff):.3f}, max {max(diff):.3f}"
        )
        for key in ("actor/pg_loss", "actor/grad_norm", "timing_s/update_weights", "timing_s/step"):
            if key in one[0] and key in two[0]:
                lines.append(
                    f"  {key}: 1gpu median {statistics.median(r[key] for r in one):.4g}, "
                    f"2gpu median {statistics.median(r[key] for r in two):.4g}"
                )
        (runs / "learn-curves.json").write_text(json.dumps({"1gpu": a, "2gpu": b}))
    for placement in ("colocated", "separate"):
        rows = metrics(workdir / "runs" / f"tput-{placement}")[1:]  # step 1 warms up
        if rows:
            keys = [k for k in rows[0] if k.startswith(("perf/", "timing_s/"))]
            summary = {k: statistics.median(r[k] for r in rows) for k in keys}
            lines.append(f"tput-{placement}: {len(rows)} steps after warm-up: {json.dumps(summary)}")
    broadcast_file = runs / "broadcast.json"
    if broadcast_file.exists():
        for name, r in json.loads(broadcast_file.read_text()).items():
            lines.append(
                f"broadcast {name}: {r['bytes'] / 1e9:.2f} GB in {r['median_s'] * 1e3:.1f} ms = {r['gb_per_s']:.1f} GB/s"
            )
    text = "\n".join(lines)
    print(text)
    (runs / "report.txt").write_text(text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["prepare", "broadcast", "report"])
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("WORKDIR", "/tmp/rlkube-mg")))
    parser.add_argument("--runs", type=Path, default=Path("bench-out"))
    parser.add_argument("--out", type=Path, default=Path("bench-out/broadcast.json"))
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args(argv)
    if args.phase == "prepare":
        prepare(args.workdir)
    elif args.phase == "broadcast":
        broadcast(args.workdir, args.out, args.repeats)
    else:
        report(args.workdir, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
