"""The distributed trainer on CPU: a local Ray, gloo, 2 actor ranks + a critic +
a separate vLLM rollout worker — the same code path as in pods.

- the tiny task still learns (FSDP2 actor, weights broadcast to the separate engine,
  validated through that engine);
- a rank killed mid-run fails the driver fast, naming the role and rank, and a
  rerun resumes from the last checkpoint with the same data order and metrics;
- colocated and separate rollout give the same greedy generations after the
  same update;
- FSDP2 follows full replicas, validates through the colocated engines and resumes from its
  sharded checkpoint;
- a GRPO actor under tensor parallel 2 × pipeline parallel 2 (4 ranks) learns.

Each `rlkube-trainer run` costs about 40 s of two cores before its first step (Ray, torch and
vLLM in every rank), so runs are shared: the learning run is also the killed run's reference
and the separate placement's validation. Runs `rlkube-trainer run` in subprocesses, as users
do. Asserts behaviour, not time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rlkube_trainer.tiny.task import init

TOPOLOGY = {
    "actor": {"replicas": 2, "gpus_per_replica": 0},
    "critic": {"replicas": 1, "gpus_per_replica": 0},
    "rollout": {"placement": "separate", "replicas": 1, "gpus_per_replica": 0},
}


# The learning run validates before training and every 30 steps through the separate engine.
VALIDATION = {"test_freq": 30, "val_before_train": True, "log_val_generations": 2}
CORE_VAL = "val-core/tiny_first_digit/reward/mean@1"


def _config(workdir: Path, steps: int, save_freq: int) -> Path:
    """GAE over TOPOLOGY with an FSDP2 actor: the learning run and the killed run alike, so that
    their first steps agree."""
    path = init(workdir, "gae", steps)
    raw = yaml.safe_load(path.read_text())
    raw["roles"] = TOPOLOGY
    raw["actor"]["strategy"] = "fsdp2"
    raw["actor"]["fsdp_config"] = {"mixed_precision": {"param_dtype": "fp32"}}
    # 16 prompts × 4 samples per mini-batch over 2 actor ranks: 32 each, one micro-batch.
    raw["actor"]["ppo_micro_batch_size_per_gpu"] = 32
    raw["trainer"].update({"save_freq": save_freq, **VALIDATION})
    path.write_text(yaml.safe_dump(raw))
    return path


def _run(config: Path, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlkube_trainer.pod.cli", "run", str(config), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _metrics(workdir: Path) -> list[dict[str, float]]:
    path = workdir / "checkpoints" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _trained(workdir: Path) -> list[dict[str, float]]:
    """The rows of training steps (validation before training writes a row of step 0)."""
    return [row for row in _metrics(workdir) if row["step"] >= 1]


@dataclass(frozen=True)
class Run:
    workdir: Path
    result: subprocess.CompletedProcess[str]

    @property
    def metrics(self) -> list[dict[str, float]]:
        return _metrics(self.workdir)


@pytest.fixture(scope="module")
def learning_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """90 GAE steps over 2 FSDP2 actor ranks, a critic and a separate rollout pod."""
    workdir = tmp_path_factory.mktemp("learning")
    return Run(workdir, _run(_config(workdir, steps=90, save_freq=30)))


@pytest.mark.trainer
@pytest.mark.slow
def test_two_actor_ranks_critic_and_separate_rollout_learn(learning_run: Run) -> None:
    result = learning_run.result
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ready: actor rank 1" in result.stderr
    # The rollout worker joined the weight-sync groups after both actor ranks (the senders).
    assert "weight-sync group 0: rank 2 of 3, 2 senders" in result.stderr
    rows = learning_run.metrics
    scores = [r["critic/score/mean"] for r in rows if r["step"] >= 1]
    assert scores[0] < 0.3
    # A constant answer scores 0.1. GAE's critic learns alongside the policy, so the curve is
    # noisier than GRPO's (seen: 0.09 -> 0.78 over the last 10 steps): judged on a 10-step mean.
    final = sum(scores[-10:]) / 10
    assert final >= 0.7, f"mean reward of the last 10 steps {final:.3f} < 0.7; curve {scores}"
    assert (learning_run.workdir / "checkpoints" / "hf" / "config.json").exists()
    # Validated through the separate pod's engine: before training, every 30 steps, and the
    # greedy policy scores higher at the end than at the start.
    validated = {int(r["step"]): r[CORE_VAL] for r in rows if CORE_VAL in r}
    assert sorted(validated) == [0, 30, 60, 90]
    assert validated[90] > validated[0]
    generations = (learning_run.workdir / "checkpoints" / "validation_generations.jsonl").read_text()
    assert len(generations.splitlines()) == 4 * 2


@pytest.mark.trainer
@pytest.mark.slow
def test_killed_rank_fails_fast_and_the_rerun_resumes(learning_run: Run, tmp_path: Path) -> None:
    steps, save_freq = 8, 2
    assert learning_run.result.returncode == 0, "the learning run (the reference) failed"
    # The learning run's first steps are what an unbroken run of these settings trains: the same
    # seed, data and constant learning rate; only its length and save frequency differ.
    expected = {int(r["step"]): r for r in learning_run.metrics if r["step"] <= steps}

    killed = tmp_path / "killed"
    config = _config(killed, steps, save_freq)
    process = subprocess.Popen(
        [sys.executable, "-m", "rlkube_trainer.pod.cli", "run", str(config), "--no-progress"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    log_lines: list[str] = []
    victim = None
    # Read the driver's log until actor rank 1 says where it runs, then wait for step 3.
    for line in process.stderr:
        log_lines.append(line)
        match = re.search(r"ready: actor rank 1 on .* pid (\d+)", line)
        if match:
            victim = int(match.group(1))
        if victim and len(_trained(killed)) >= 3:
            break
    assert victim is not None, "".join(log_lines[-50:])
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    _, rest = process.communicate(timeout=600)
    failed_after = time.monotonic() - killed_at
    stderr = "".join(log_lines) + rest
    assert process.returncode == 3, stderr[-4000:]
    assert re.search(r"error: role actor rank 1 failed", stderr), stderr[-4000:]
    # Bounded: no hang in a collective waiting for the dead rank.
    assert failed_after < 120, f"the driver took {failed_after:.0f} s to notice"
    done_before = len(_trained(killed))
    assert done_before < steps

    resumed = _run(config)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert re.search(r"resumed from .*step_0000(0[2-9])", resumed.stderr), resumed.stderr[-3000:]
    by_step: dict[int, dict[str, float]] = {}
    for row in _trained(killed):
        by_step[int(row["step"])] = row  # the resumed run's rows replace the interrupted ones
    assert sorted(by_step) == list(range(1, steps + 1))
    for step, row in by_step.items():
        want = expected[step]
        assert row["data/order_checksum"] == want["data/order_checksum"], f"step {step}: different data"
        assert row["critic/score/mean"] == pytest.approx(want["critic/score/mean"], abs=0.1), f"step {step}"
        assert row["response_length/mean"] == pytest.approx(want["response_length/mean"], abs=0.2), f"step {step}"


# (placement, tensor parallel size), each with one engine so that every run splits the
# prompts and seeds alike, and the same actor (FSDP2 over 2 ranks). Tensor parallel 2 spans
# the 2 actor ranks (colocated: each gathers only its slice from the shards) or 2 rollout
# pods (separate, on CPU).
ONE_ENGINE_RUNS = [("separate", 1), ("colocated", 2), ("separate", 2)]


@pytest.mark.trainer
@pytest.mark.slow
def test_placements_and_tensor_parallel_sizes_agree_after_the_same_update(tmp_path: Path) -> None:
    """Generations after one PPO step and its weight sync are the same whether the engine
    sits beside the actor or on pods of its own, on one process or tensor parallel over two.
    The slices each colocated rank gives its engine are checked (RLKUBE_CHECK_TP_SLICES: the
    unsent part of every tensor is NaN, which a loader reading it would spread into the logits)."""
    probe = Path(__file__).with_name("placement_probe.py")
    runs: dict[tuple[str, int], tuple[Path, Path]] = {}
    for placement, tp in ONE_ENGINE_RUNS:
        workdir = tmp_path / f"{placement}-tp{tp}"
        path = init(workdir, "grpo", steps=1)
        raw = yaml.safe_load(path.read_text())
        raw["roles"] = {"actor": {"replicas": 2, "gpus_per_replica": 0}, "rollout": {"tensor_parallel_size": tp}}
        if placement == "separate":
            raw["roles"]["rollout"].update(placement="separate", replicas=tp, gpus_per_replica=0)
        raw["actor"]["strategy"] = "fsdp2"
        raw["actor"]["fsdp_config"] = {"mixed_precision": {"param_dtype": "fp32"}}
        raw["actor"]["ppo_micro_batch_size_per_gpu"] = 32
        path.write_text(yaml.safe_dump(raw))
        runs[(placement, tp)] = (path, workdir / "generated.json")
    # One process and one local Ray for the three placements, one after another.
    result = subprocess.run(
        [sys.executable, str(probe), "1", *(str(p) for run in runs.values() for p in run)],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
        env={**os.environ, "RLKUBE_CHECK_TP_SLICES": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    # Only the colocated tensor-parallel placement hands its engines slices.
    assert "tensor-parallel slices" in result.stderr and "(the rest of each tensor NaN)" in result.stderr
    outputs = {run: json.loads(out.read_text()) for run, (_, out) in runs.items()}
    reference = outputs[("separate", 1)]
    assert len(reference["after"]["greedy"]) == 16
    assert reference["after"]["logprobs"] != reference["before"]["logprobs"]  # the update changed the policy
    for run, generated in outputs.items():
        for when in ("before", "after"):
            got, want = generated[when], reference[when]
            assert got["greedy"] == want["greedy"], (run, when)
            assert got["sampled"] == want["sampled"], (run, when)
            flat_got = [x for row in got["logprobs"] for x in row]
            flat_want = [x for row in want["logprobs"] for x in row]
            assert flat_got == pytest.approx(flat_want, abs=1e-4), (run, when)


def _fsdp_config(workdir: Path, steps: int, strategy: str) -> Path:
    """GRPO over 2 colocated actor ranks, validated before training and after every step."""
    path = init(workdir, "grpo", steps)
    raw = yaml.safe_load(path.read_text())
    raw["roles"] = {"actor": {"replicas": 2, "gpus_per_replica": 0}}
    raw["actor"]["strategy"] = strategy
    # fp32 compute, as the replicas: mixed precision is test_fsdp.py's business.
    raw["actor"]["fsdp_config"] = {"mixed_precision": {"param_dtype": "fp32"}}
    raw["trainer"].update({"save_freq": 2, "test_freq": 1, "val_before_train": True, "log_val_generations": 2})
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.trainer
@pytest.mark.slow
def test_fsdp2_actor_matches_replicas_validates_and_resumes_from_its_sharded_checkpoint(
    learning_run: Run, tmp_path: Path
) -> None:
    """FSDP2 over 2 gloo ranks (what the GPU path runs over NCCL): the same trajectory as full
    replicas with averaged gradients; weights reach each rank's colocated engine (the
    broadcast to a separate engine is the learning run's); validation runs through those
    engines before training and after every step, and the initial policy scores there what it
    scores on the learning run's separate engine; a sharded checkpoint
    (torch.distributed.checkpoint) is written and a longer rerun resumes from it."""
    steps = 3
    runs = {}
    for strategy in ("replicate", "fsdp2"):
        workdir = tmp_path / strategy
        result = _run(_fsdp_config(workdir, steps, strategy))
        assert result.returncode == 0, result.stderr[-4000:]
        runs[strategy] = {int(r["step"]): r for r in _metrics(workdir)}
    assert sorted(runs["fsdp2"]) == list(range(0, steps + 1))
    first_replicate, first_fsdp = runs["replicate"][1], runs["fsdp2"][1]
    # Step 1 starts from the same weights and samples: identical up to float summation order.
    assert first_fsdp["critic/score/mean"] == first_replicate["critic/score/mean"]
    assert first_fsdp["actor/pg_loss"] == pytest.approx(first_replicate["actor/pg_loss"], abs=1e-4)
    assert first_fsdp["actor/grad_norm"] == pytest.approx(first_replicate["actor/grad_norm"], rel=1e-3)
    for step in range(2, steps + 1):
        # Later steps sample from weights that differ by rounding only.
        want, got = runs["replicate"][step], runs["fsdp2"][step]
        assert got["critic/score/mean"] == pytest.approx(want["critic/score/mean"], abs=0.15), f"step {step}"
    assert all(CORE_VAL in runs["fsdp2"][step] for step in range(0, steps + 1))
    generations = (tmp_path / "fsdp2" / "checkpoints" / "validation_generations.jsonl").read_text()
    assert len(generations.splitlines()) == (steps + 1) * 2
    # The same initial greedy policy, validated on 2 colocated engines and on 1 separate one.
    assert learning_run.result.returncode == 0, "the learning run failed"
    separate = next(r[CORE_VAL] for r in learning_run.metrics if r["step"] == 0)
    assert runs["fsdp2"][0][CORE_VAL] == separate
    sharded = tmp_path / "fsdp2" / "checkpoints" / "step_000002" / "actor"
    assert (sharded / "sharded" / ".metadata").is_file(), sorted(p.name for p in sharded.rglob("*"))

    longer = _fsdp_config(tmp_path / "fsdp2", steps + 2, "fsdp2")
    resumed = _run(longer)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert re.search(r"resumed from .*step_000003", resumed.stderr), resumed.stderr[-3000:]
    assert sorted({int(r["step"]) for r in _metrics(tmp_path / "fsdp2")}) == list(range(0, steps + 3))


# The tiny GRPO job of test_learning.py (same model, data, seed and learning rate) with its actor
# at tensor parallel 2 × pipeline parallel 2 over 4 ranks, weights sent to a separate engine.
# Cheaper than that test's 60 steps, judged on 20: seen 0.06 at step 1, 0.54 over steps 16-20
# (0.80 over 26-30), greedy validation 0.73 at step 20 (0.88 at 30).
TENSOR_BY_PIPELINE_STEPS = 20


@pytest.mark.trainer
@pytest.mark.slow
def test_a_tensor_by_pipeline_parallel_actor_learns(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    steps = TENSOR_BY_PIPELINE_STEPS
    path = init(tmp_path, "grpo", steps)
    raw = yaml.safe_load(path.read_text())
    sizes = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}
    raw["roles"] = {
        "actor": {"replicas": 4, "gpus_per_replica": 0, **sizes},
        "rollout": {"placement": "separate", "replicas": 1, "gpus_per_replica": 0},
    }
    raw["model"]["use_remove_padding"] = False  # a pipeline runs padded micro-batches
    raw["actor"]["strategy"] = "fsdp2"
    raw["actor"]["fsdp_config"] = {"mixed_precision": {"param_dtype": "fp32"}}
    raw["actor"]["ppo_micro_batch_size_per_gpu"] = 16  # a mini-batch of 128 samples: 8 micro-batches
    raw["trainer"].update({"test_freq": steps, "val_before_train": True})
    path.write_text(yaml.safe_dump(raw))
    result = _run(path)
    assert result.returncode == 0, result.stderr[-4000:]
    # Rank 0 holds the first stage (the embeddings and the first of 2 decoder layers), not the model.
    settings = json.loads((tmp_path / "checkpoints" / "effective-settings.json").read_text())
    held = settings["ranks"]["actor"]["actor"]["model"]["parameters"]
    whole = AutoModelForCausalLM.from_pretrained(tmp_path / "model").num_parameters()
    assert held < 0.6 * whole, (held, whole)
    scores = [r["critic/score/mean"] for r in _trained(tmp_path)]
    assert len(scores) == steps
    assert scores[0] < 0.3, f"the first step should score near chance (0.1), got {scores[0]}"
    # Four times chance over the last 5 steps (the 60-step FSDP test asks 0.8 of its last 5).
    final = sum(scores[-5:]) / 5
    assert final >= 0.4, f"mean reward of the last 5 steps {final:.3f} < 0.4; curve {scores}"
    validated = {int(r["step"]): r[CORE_VAL] for r in _metrics(tmp_path) if CORE_VAL in r}
    assert sorted(validated) == [0, steps]
    assert validated[steps] >= 0.6 and validated[steps] > validated[0], validated
