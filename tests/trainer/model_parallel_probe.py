"""Run as a script by test_model_parallel: the actor's and the critic's real updates on gloo
ranks under each of several layouts (roles.<actor|critic|reference>.tensorParallelSize and
ulyssesSequenceParallelSize; one config file each, whose actor replicas are its world size),
fp32 under FSDP2. One start of the processes for all layouts: each layout's ranks form a
process group of their own in turn, the others wait. For each layout rank 0 writes
LAYOUT/results.pt: the old log-probs and values of the whole batch, the reference's log-probs, each update's metrics,
the gradients of the first optimizer step (whole tensors), the weights after the last update,
and how the model was split (the attention function, a split projection's local shape).

Every rank builds the same global batch and takes its contiguous share, as the driver's
data-parallel dispatch does; the ranks of a model-parallel group pool theirs."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from fsdp_probe import SAMPLES, global_batch  # type: ignore[import-not-found]

from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.cluster.rank_group import split
from rlkube_trainer.parallel.sequence import STATE_ATTRIBUTE
from rlkube_trainer.workers.builders import build_actor, build_critic, build_reference
from rlkube_trainer.workers.training import Trainable

UPDATES = 3
UNSET = SimpleNamespace(inner=None)


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def local_tensor(t: Any) -> torch.Tensor:
    local: torch.Tensor = getattr(t, "_local_tensor", t)
    return local


def first_step_gradients(role: Trainable) -> dict[str, torch.Tensor]:
    """The whole gradient of every parameter at the role's first optimizer step (a collective)."""
    grads: dict[str, torch.Tensor] = {}
    step = role._optimizer_step

    def recording() -> float:
        if not grads:
            for name, p in role.model.named_parameters():
                if p.grad is not None:
                    grads[name] = full(p.grad)
        return step()

    role._optimizer_step = recording  # type: ignore[method-assign]
    return grads


def gathered(part: torch.Tensor) -> torch.Tensor:
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, part)
    return torch.cat(parts)


def scored_batch(actor: Any, critic: Any, vocab: Any, shares: torch.Tensor, update: int) -> TrainBatch:
    """This rank's share of update `update`'s batch, with the old log-probs, values and returns
    the actor's and the critic's updates read."""
    batch: TrainBatch = global_batch(vocab, seed=update).select(shares)
    batch.old_log_probs = actor.compute_log_prob(batch)
    batch.values = critic.compute_values(batch)
    assert batch.advantages is not None
    batch.returns = batch.values + batch.advantages
    return batch


def run_layout(rank: int, world: int, config: Any, out: Path) -> None:
    cpu = torch.device("cpu")
    actor, critic = build_actor(config, cpu, total_steps=10), build_critic(config, cpu, total_steps=10)
    reference = build_reference(config, cpu)
    actor_grads, critic_grads = first_step_gradients(actor), first_step_gradients(critic)
    vocab = int(actor.model.config.vocab_size)  # type: ignore[union-attr, arg-type]
    shares = torch.arange(SAMPLES)[split(SAMPLES, world)[rank]]
    results: dict[str, Any] = {"actor": [], "critic": []}
    for update in range(UPDATES):
        batch = scored_batch(actor, critic, vocab, shares, update)
        if update == 0:
            results["old_log_probs"] = gathered(batch.old_log_probs)
            results["values"] = gathered(batch.values)
            results["ref_log_probs"] = gathered(reference.compute_ref_log_prob(batch))
        results["actor"].append(mean_over_ranks(actor.update(batch)))
        results["critic"].append(mean_over_ranks(critic.update(batch)))
    results["actor_grads"], results["critic_grads"] = actor_grads, critic_grads
    results["actor_weights"] = {name: t.clone() for name, t in actor.named_weights()}
    results["critic_weights"] = {name: full(t) for name, t in critic.model.state_dict().items()}
    q_proj = actor.model.get_submodule("model.layers.0.self_attn.q_proj").weight
    results["split"] = {
        "attention": actor.model.config._attn_implementation,  # type: ignore[union-attr]
        "q_proj": list(local_tensor(q_proj).shape),
        # The attention a Ulysses critic runs inside its all-to-alls (None without Ulysses).
        "critic_inner": getattr(
            critic.model.get_submodule("backbone.layers.0.self_attn"), STATE_ATTRIBUTE, UNSET
        ).inner,
    }
    if rank == 0:
        torch.save(results, out / "results.pt")


def mean_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Each metric's mean over the ranks, as the driver reports an update's."""
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, metrics)
    return {key: sum(p[key] for p in parts) / len(parts) for key in metrics}


def rank_main(rank: int, layouts: list[tuple[str, int]]) -> None:
    """`layouts`: (config file, port) each; the config's directory receives the results."""
    for config_path, port in layouts:
        config = parse_trainer_config(yaml.safe_load(Path(config_path).read_text()))
        world = config.roles.actor.replicas
        if rank < world:
            init = f"tcp://127.0.0.1:{port}"
            dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
            run_layout(rank, world, config, Path(config_path).parent)
            # Every rank done with every collective before any closes its connections.
            dist.barrier()
            dist.destroy_process_group()


if __name__ == "__main__":
    pairs = [(sys.argv[i], int(sys.argv[i + 1])) for i in range(1, len(sys.argv), 2)]
    worlds = [parse_trainer_config(yaml.safe_load(Path(c).read_text())).roles.actor.replicas for c, _ in pairs]
    mp.spawn(rank_main, args=(pairs,), nprocs=max(worlds), join=True)  # type: ignore[attr-defined, no-untyped-call]
