"""Run as a script by test_pipeline_parallel: the actor's and the critic's real updates
(workers.builders, roles.<role>.pipelineParallelSize from the config) on gloo ranks, as
model_parallel_probe runs its layouts, except that a pipeline rank holds only its stages: every
rank writes its own results (RANK.pt), the test puts the stages' weights together."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from fsdp_probe import SAMPLES  # type: ignore[import-not-found]
from model_parallel_probe import (  # type: ignore[import-not-found]
    UPDATES,
    first_step_gradients,
    full,
    gathered,
    mean_over_ranks,
    scored_batch,
)

from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.cluster.rank_group import split
from rlkube_trainer.workers.builders import build_actor, build_critic


def run_layout(rank: int, world: int, config: Any, out: Path) -> None:
    cpu = torch.device("cpu")
    actor, critic = build_actor(config, cpu, total_steps=10), build_critic(config, cpu, total_steps=10)
    actor_grads, critic_grads = first_step_gradients(actor), first_step_gradients(critic)
    vocab = global_vocab(config)
    shares = torch.arange(SAMPLES)[split(SAMPLES, world)[rank]]
    results: dict[str, Any] = {"actor": [], "critic": []}
    for update in range(UPDATES):
        batch = scored_batch(actor, critic, vocab, shares, update)
        if update == 0:
            results["old_log_probs"] = gathered(batch.old_log_probs)
            results["values"] = gathered(batch.values)
        results["actor"].append(mean_over_ranks(actor.update(batch)))  # as the driver reports them
        results["critic"].append(mean_over_ranks(critic.update(batch)))
    results["actor_grads"], results["critic_grads"] = actor_grads, critic_grads
    results["actor_weights"] = {name: t.clone() for name, t in actor.named_weights()}
    results["actor_own_weights"] = {name: full(t) for name, t in actor.model.state_dict().items()}
    results["critic_weights"] = {name: full(t) for name, t in critic.model.state_dict().items()}
    torch.save(results, out / f"rank_{rank}.pt")


def global_vocab(config: Any) -> int:
    from transformers import AutoConfig  # noqa: PLC0415

    return int(AutoConfig.from_pretrained(config.model.path).vocab_size)


def rank_main(rank: int, layouts: list[tuple[str, int]]) -> None:
    for config_path, port in layouts:
        config = parse_trainer_config(yaml.safe_load(Path(config_path).read_text()))
        world = config.roles.actor.replicas
        if rank < world:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
            run_layout(rank, world, config, Path(config_path).parent)
            dist.barrier()
            dist.destroy_process_group()


if __name__ == "__main__":
    pairs = [(sys.argv[i], int(sys.argv[i + 1])) for i in range(1, len(sys.argv), 2)]
    worlds = [parse_trainer_config(yaml.safe_load(Path(c).read_text())).roles.actor.replicas for c, _ in pairs]
    mp.spawn(rank_main, args=(pairs,), nprocs=max(worlds), join=True)  # type: ignore[attr-defined, no-untyped-call]
