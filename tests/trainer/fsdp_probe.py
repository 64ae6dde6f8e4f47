"""Run as a script by test_fsdp: one actor update on N gloo ranks (processes), with the
actor's strategy, fsdpSize and compute dtype given on the command line; writes each
rank's local parameter shapes, the update's metrics and (rank 0) the weights after it.

With the plans `save` and `load:DIR` (test_world_size_resume, which runs one rank in its own
process, without a process group as the trainer's one CPU rank does): `save` makes update 1
with replicas and with FSDP2, checkpoints each, and makes updates 2 and 3; `load:DIR` resumes
fresh actors from DIR's checkpoints (saved on another number of ranks) and makes updates 2 and
3. Each writes the updates' metrics and (rank 0) the weights after each into OUT/<plan>/;
`save+load:DIR` runs both, one process start for the two; an action ending in `@CONFIG`
builds its actor from that config instead (another layout over the same ranks). `asyncsave` makes update 1 and
checkpoints it in the background (checkpoint.async_save), with update 2 made while the write
is in flight; `load:DIR/asyncsave` must then continue like a resume of `save`'s checkpoint.

With the plan `resume`, without and with optimizerOffload: two updates, a checkpoint between
them, and the second update again by a fresh actor resumed from that checkpoint; the weights
after each second update, and where the optimizer state was after each update and the resume.

Every rank builds the same global batch and takes its contiguous share, as the driver's
data-parallel dispatch does."""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from transformers import AutoConfig

from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.checkpoint.export import export_hf
from rlkube_trainer.checkpoint.state import load_rank_state, save_rank_state, stage_rank_state
from rlkube_trainer.cluster.rank_group import split
from rlkube_trainer.model.fsdp import offloads_parameters
from rlkube_trainer.model.loading import decoder_layers
from rlkube_trainer.workers import actor as actor_module
from rlkube_trainer.workers.actor import Actor
from rlkube_trainer.workers.builders import build_actor

SAMPLES, PROMPT, RESPONSE = 16, 4, 3


def global_batch(vocab: int, seed: int = 0) -> TrainBatch:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab, (SAMPLES, PROMPT + RESPONSE), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[::3, 0] = 0  # some left padding
    response_mask = torch.ones(SAMPLES, RESPONSE)
    response_mask[1::4, -1] = 0  # and some responses ending early
    batch = TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        responses=input_ids[:, -RESPONSE:],
        response_mask=response_mask,
        group_index=torch.arange(SAMPLES) // 4,
        prompt_lengths=attention_mask[:, :PROMPT].sum(-1),
    )
    batch.advantages = torch.randn(SAMPLES, RESPONSE, generator=generator) * response_mask
    return batch


def optimizer_state(actor: Actor) -> dict[str, Any]:
    """Where the actor's optimizer state is: the device of every tensor but the step count, and
    where the trainer means it to be."""
    devices = sorted(
        {
            str(value.device)
            for state in actor.optimizer.state.values()
            for key, value in state.items()
            if key != "step" and isinstance(value, torch.Tensor)
        }
    )
    return {"devices": devices, "on_host": actor.optimizer_state_on_host}


def step(actor: Actor, batch: TrainBatch) -> dict[str, float]:
    batch.old_log_probs = actor.compute_log_prob(batch)
    return actor.update(batch)


def resume_main(rank: int, config: Any, batch: TrainBatch, out: str) -> None:
    """Without and with optimizerOffload: two updates, with a checkpoint after the first; then
    a fresh actor resumes from it and makes the second update again."""
    states: dict[str, list[dict[str, Any]]] = {}
    weights: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for offload in (False, True):
        run = "offloaded" if offload else "kept"
        config.actor.fsdp_config.optimizer_offload = offload
        checkpoint = Path(out, run, "checkpoint")
        first = build_actor(config, torch.device("cpu"), total_steps=10)
        states[run] = [optimizer_state(first)]
        step(first, batch)
        states[run].append(optimizer_state(first))
        save_rank_state(checkpoint, {"actor": first}, rank)
        states[run].append(optimizer_state(first))
        step(first, batch)
        states[run].append(optimizer_state(first))
        straight = {name: t.clone() for name, t in first.named_weights()}
        resumed = build_actor(config, torch.device("cpu"), total_steps=10)
        load_rank_state(checkpoint, {"actor": resumed}, rank)
        states[run].append(optimizer_state(resumed))
        step(resumed, batch)
        states[run].append(optimizer_state(resumed))
        weights[run] = {"straight": straight, "resumed": {name: t.clone() for name, t in resumed.named_weights()}}
    Path(out, f"rank_{rank}.json").write_text(json.dumps({"optimizer_states": states}))
    if rank == 0:
        torch.save(weights, Path(out, "weights.pt"))


def world_size_main(rank: int, world: int, config: Any, out: str, plan: str) -> None:
    """`save` or `load:DIR` (see the module's doc), for each strategy, into OUT/<save|load>/;
    `load-NAME:DIR` loads as `load:DIR` does, into OUT/load-NAME/ (several resumes, one start)."""
    kind, _, source = plan.partition(":")
    out = str(Path(out, kind))
    plan = "load" if kind.startswith("load") else plan
    Path(out).mkdir(parents=True, exist_ok=True)
    vocab = int(AutoConfig.from_pretrained(config.model.path).vocab_size)
    shares = split(SAMPLES, world)[rank]

    def batch(update: int) -> TrainBatch:
        return global_batch(vocab, seed=update).select(torch.arange(SAMPLES)[shares])

    results: dict[str, Any] = {}
    weights: dict[str, list[dict[str, torch.Tensor]]] = {}
    # A config that names fsdp2 (the layouts' runs: a tensor-parallel actor is trained with
    # FSDP2 over its data ranks) runs that strategy alone; one naming replicate, both.
    named = config.actor.strategy  # the loop sets it; `save+load` calls this twice on one config
    for strategy in ("fsdp2",) if named == "fsdp2" else ("replicate", "fsdp2"):
        config.actor.strategy = strategy
        actor = build_actor(config, torch.device("cpu"), total_steps=10)
        checkpoint = Path(out, strategy)
        reported: list[str] = []
        if plan == "save":
            step(actor, batch(1))
            reported = sorted(save_rank_state(checkpoint, {"actor": actor}, rank))
        elif plan == "asyncsave":
            step(actor, batch(1))
            background = stage_rank_state(checkpoint, {"actor": actor}, rank)
            step(actor, batch(2))  # changes the weights while the write may still be going on
            done = background.result(wait=True)
            assert done is not None
            results[strategy] = {"sharded": actor.sharded, "metrics": [], "reported": sorted(done.files)}
            continue
        else:
            load_rank_state(Path(source, strategy), {"actor": actor}, rank)
        results[strategy] = {"sharded": actor.sharded, "metrics": [], "reported": reported}
        weights[strategy] = []
        for update in (2, 3):
            results[strategy]["metrics"].append(step(actor, batch(update)))
            weights[strategy].append({name: t.clone() for name, t in actor.named_weights()})
        if strategy == "fsdp2":  # the Hugging Face export, gathered from whatever layout this is
            state = {name: t.cpu() for name, t in actor.named_weights()}
            if rank == 0:
                export_hf(actor.model, None, Path(out, "hf"), state_dict=state)
    config.actor.strategy = named
    Path(out, f"rank_{rank}.json").write_text(json.dumps(results))
    if rank == 0:
        torch.save(weights, Path(out, "weights.pt"))


def rank_main(rank: int, world: int, port: int, config_path: str, out: str, plan: str) -> None:
    config = parse_trainer_config(yaml.safe_load(Path(config_path).read_text()))
    if plan.startswith(("save", "load", "asyncsave")):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        for each in plan.split("+"):
            action, _, other = each.partition("@")
            layout = parse_trainer_config(yaml.safe_load(Path(other).read_text())) if other else config
            world_size_main(rank, world, layout, out, action)
        dist.barrier()
        dist.destroy_process_group()
        return
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if plan == "resume":
        vocab = int(AutoConfig.from_pretrained(config.model.path).vocab_size)
        resume_main(rank, config, global_batch(vocab).select(torch.arange(SAMPLES)[split(SAMPLES, world)[rank]]), out)
        dist.barrier()
        dist.destroy_process_group()
        return
    if config.actor.compile_decoder_layers:
        # inductor's C++ code generation takes about a minute per graph on a loaded CI machine;
        # aot_eager captures the same graphs (dynamo, then AOTAutograd's forward and backward),
        # which is where FSDP2's hooks or LoRA's layers would break the compile.
        torch.compile = functools.partial(torch.compile, backend="aot_eager")  # type: ignore[assignment]
    reads = []  # the checkpoint reads of this rank (load_distributed: rank 0 only, when sharded)
    read = actor_module.load_causal_lm
    actor_module.load_causal_lm = lambda *a, **k: reads.append(1) or read(*a, **k)  # type: ignore[assignment]
    actor = build_actor(config, torch.device("cpu"), total_steps=10)
    shapes = {name: list(getattr(p, "_local_tensor", p).shape) for name, p in actor.model.named_parameters()}
    vocab = int(actor.model.config.vocab_size)  # type: ignore[union-attr]
    batch = global_batch(vocab).select(torch.arange(SAMPLES)[split(SAMPLES, world)[rank]])
    batch.old_log_probs = actor.compute_log_prob(batch)
    metrics = actor.update(batch)
    weights = {name: t.clone() for name, t in actor.named_weights()}
    offloaded = offloads_parameters(actor.model)
    from torch._dynamo.utils import counters  # noqa: PLC0415

    compiled = {
        "layers": sum(hasattr(layer.forward, "_torchdynamo_orig_callable") for layer in decoder_layers(actor.model)),
        "graphs": counters["stats"]["unique_graphs"],
    }
    # Per FSDP2 unit: whether it frees its gathered weights after the forward.
    reshards = [
        m._get_fsdp_state()._fsdp_param_group._reshard_after_forward  # type: ignore[operator, union-attr]
        for m in actor.model.modules()
        if type(m).__name__.endswith("DecoderLayer") and hasattr(m, "_get_fsdp_state")
    ]
    Path(out, f"rank_{rank}.json").write_text(
        json.dumps(
            {
                "shapes": shapes,
                "metrics": metrics,
                "offloaded": offloaded,
                "reshards": reshards,
                "reads": len(reads),
                "compiled": compiled,
            }
        )
    )
    if rank == 0:
        torch.save(weights, Path(out, "weights.pt"))
    # Every rank done with every collective before any closes its connections: gloo aborts
    # the process (SIGABRT) whose peer goes away in the middle of one.
    dist.barrier()
    dist.destroy_process_group()


def main(world: int, port: int, config_path: str, out: str, plan: str) -> None:
    mp.spawn(rank_main, args=(world, port, config_path, out, plan), nprocs=world, join=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# What a rank process prints when a C++ thread object is destroyed unjoined: gloo's, seen once
# in CI (2 loaded cores) in the middle of a world-2 run that passes every other time. A run that
# dies with it is run once more (on a fresh port, into the same directory); any other failure,
# or this one twice, fails the test.
GLOO_ABORT = "terminate called without an active exception"


def run_probe(world: int, config: Path, out: Path, plan: str = "update") -> None:
    """This script on `world` gloo ranks, as the tests run it; asserts it succeeded."""
    for attempt in (1, 2):
        result = subprocess.run(
            [sys.executable, __file__, str(world), str(free_port()), str(config), str(out), plan],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if result.returncode == 0:
            return
        if attempt == 1 and GLOO_ABORT in result.stderr:
            warnings.warn(f"fsdp_probe {plan}: a rank aborted ({GLOO_ABORT}); running it again", stacklevel=2)
            continue
        break
    raise AssertionError(result.stderr[-4000:])


def config_for(
    workdir: Path,
    world: int,
    strategy: str,
    fsdp_size: int | None,
    param_dtype: str,
    offload: bool = False,
    reshard: bool = True,
    optimizer_offload: bool = False,
    lora: bool = False,
    compile_layers: bool = False,
) -> dict[str, Any]:
    from rlkube_trainer.tiny.task import trainer_config  # noqa: PLC0415

    raw = trainer_config(workdir)
    if lora:
        raw["model"].update(lora_rank=4, lora_alpha=8)
    raw["roles"] = {"actor": {"replicas": world, "gpus_per_replica": 0}}
    if fsdp_size is not None:
        raw["roles"]["actor"]["fsdp_size"] = fsdp_size
    raw["data"]["train_batch_size"] = SAMPLES // 8
    raw["actor"].update(
        {
            "strategy": strategy,
            "ppo_mini_batch_size": SAMPLES // 8,
            "ppo_micro_batch_size_per_gpu": 2,
            "compile_decoder_layers": compile_layers,
            "fsdp_config": {
                "mixed_precision": {"param_dtype": param_dtype},
                "param_offload": offload,
                "optimizer_offload": optimizer_offload,
                "reshard_after_forward": reshard,
            },
        }
    )
    return raw


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else "update")
