"""The recipe test_pipeline_parallel compares, and (run as a script) its pipelined side on N
gloo ranks: an actor's policy-loss update and a critic's value-loss update of a tiny 4-layer
model, mini-batch by mini-batch in micro-batches, as `workers.training.Trainable.update` runs
them, once on one process without a pipeline (`reference`) and once through
`parallel.pipeline` (`pipelined`), each recording the losses of every micro-batch, the
gradients of the first mini-batch and the weights after every update."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from rlkube_api.config import ActorConfig, CriticConfig
from rlkube_trainer.algos import compute_value_loss, get_policy_loss_fn
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.model.loading import load_causal_lm
from rlkube_trainer.model.packing import LossScale
from rlkube_trainer.model.token_scores import response_scores
from rlkube_trainer.model.value_head import CriticModel, response_values
from rlkube_trainer.parallel.pipeline import build_pipeline
from rlkube_trainer.model.stage_heads import ResponseScoresHead, ResponseValuesHead
from rlkube_trainer.workers.actor import actor_loss
from rlkube_trainer.workers.optimizer import build_optimizer

SAMPLES, PROMPT, RESPONSE = 8, 4, 3
MINI, MICRO, UPDATES, TEMPERATURE = 4, 2, 2, 0.7
ACTOR = ActorConfig(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1)
ACTOR.optim.lr = 1e-2
CRITIC = CriticConfig(cliprange_value=0.2)
CRITIC.optim.lr = 1e-2


def batch(vocab: int) -> TrainBatch:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab, (SAMPLES, PROMPT + RESPONSE), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[::3, 0] = 0  # some left padding
    response_mask = torch.ones(SAMPLES, RESPONSE)
    response_mask[1::4, -1] = 0  # and some responses ending early
    train = TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        responses=input_ids[:, -RESPONSE:],
        response_mask=response_mask,
        group_index=torch.arange(SAMPLES) // 4,
        prompt_lengths=attention_mask[:, :PROMPT].sum(-1),
    )
    train.advantages = torch.randn(SAMPLES, RESPONSE, generator=generator) * response_mask
    train.old_log_probs = -torch.rand(SAMPLES, RESPONSE, generator=generator) * 3
    train.ref_log_probs = -torch.rand(SAMPLES, RESPONSE, generator=generator) * 3
    train.values = torch.randn(SAMPLES, RESPONSE, generator=generator) * response_mask
    train.returns = torch.randn(SAMPLES, RESPONSE, generator=generator) * response_mask
    return train


def load(kind: str, path: str) -> nn.Module:
    if kind == "actor":
        return load_causal_lm(path)
    critic = CriticModel.from_pretrained(path)
    # A value head that is not zero, so that the backbone's gradients are not either.
    nn.init.normal_(critic.value_head.weight, std=0.5, generator=torch.Generator().manual_seed(1))
    return critic


def actor_micro_loss(micro: TrainBatch, scores: torch.Tensor, scale: LossScale) -> torch.Tensor:
    loss, _ = actor_loss(ACTOR, get_policy_loss_fn(ACTOR.policy_loss), micro, scores[..., 0], scores[..., 1], scale)
    return loss


def critic_micro_loss(micro: TrainBatch, values: torch.Tensor, scale: LossScale) -> torch.Tensor:
    assert micro.returns is not None and micro.values is not None
    loss, _ = compute_value_loss(
        values, micro.returns, micro.values, micro.response_mask, CRITIC.cliprange_value, CRITIC.loss_agg_mode
    )
    return loss * scale.weight(CRITIC.loss_agg_mode, micro.response_mask)


def output_of(kind: str, model: nn.Module, micro: TrainBatch) -> torch.Tensor:
    """What the last stage hands the loss, computed the unpipelined way."""
    if kind == "actor":
        scores = response_scores(
            model, micro.input_ids, micro.attention_mask, micro.response_length, TEMPERATURE, with_entropy=True
        )
        assert scores.entropy is not None
        return torch.stack([scores.log_probs, scores.entropy], dim=-1)
    return response_values(model, micro.input_ids, micro.attention_mask, micro.response_length)  # type: ignore[arg-type]


LOSSES = {"actor": actor_micro_loss, "critic": critic_micro_loss}
GRAD_CLIP = {"actor": ACTOR.grad_clip, "critic": CRITIC.grad_clip}
OPTIM = {"actor": ACTOR.optim, "critic": CRITIC.optim}


def reference(kind: str, path: str) -> dict[str, Any]:
    """One process, no pipeline: Trainable.update's loop over the same mini- and micro-batches."""
    torch.manual_seed(0)
    model = load(kind, path)
    train = batch(vocab_of(path))
    optimizer = build_optimizer(iter(p for p in model.parameters() if p.requires_grad), OPTIM[kind])
    record: dict[str, Any] = {"losses": [], "weights": []}
    for _ in range(UPDATES):
        for mini in in_order(train):
            scale = LossScale.of(mini.response_mask)
            for start in range(0, len(mini), MICRO):
                micro = mini.select(torch.arange(start, start + MICRO))
                loss = LOSSES[kind](micro, output_of(kind, model, micro), scale)
                loss.backward()
                record["losses"].append(float(loss.detach()))
            if "grads" not in record:
                record["grads"] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            record.setdefault("norms", []).append(float(nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP[kind])))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        record["weights"].append({n: p.detach().clone() for n, p in model.named_parameters()})
    with torch.no_grad():
        record["forward"] = output_of(kind, model, train)
    return record


def in_order(train: TrainBatch) -> list[TrainBatch]:
    """The mini-batches of one update, without shuffling (a pipeline's ranks share every sample)."""
    return [train.select(torch.arange(start, start + MINI)) for start in range(0, len(train), MINI)]


def vocab_of(path: str) -> int:
    from transformers import AutoConfig  # noqa: PLC0415

    return int(AutoConfig.from_pretrained(path).vocab_size)


def pipelined(kind: str, path: str, group: dist.ProcessGroup, virtual: int | None) -> dict[str, Any]:
    """The same updates through this rank's pipeline stages."""
    torch.manual_seed(0)
    model = load(kind, path)
    train = batch(vocab_of(path))
    if kind == "actor":
        head = ResponseScoresHead(model.lm_head, TEMPERATURE)  # type: ignore[arg-type]
        head.with_entropy = True
        pipeline = build_pipeline(model, lambda: head, ("lm_head",), group, torch.device("cpu"), virtual, kind)
    else:
        pipeline = build_pipeline(
            model,
            lambda: ResponseValuesHead(model.value_head),
            ("value_head",),
            group,
            torch.device("cpu"),
            virtual,
            kind,  # type: ignore[arg-type]
        )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(iter(params), OPTIM[kind])
    record: dict[str, Any] = {"losses": [], "weights": [], "stages": pipeline.split.indices}
    for _ in range(UPDATES):
        for mini in in_order(train):
            scale = LossScale(float(mini.response_mask.sum()), float((mini.response_mask.sum(-1) > 0).sum()), 1)
            losses: dict[int, float] = {}

            def loss_of(
                output: torch.Tensor,
                rows: torch.Tensor,
                mini: TrainBatch = mini,
                scale: LossScale = scale,
                losses: dict[int, float] = losses,
            ) -> torch.Tensor:
                loss = LOSSES[kind](mini.select(rows), output, scale)
                losses[int(rows[0])] = float(loss.detach())
                return loss

            inputs = pipeline_inputs(mini)
            pipeline.train(inputs, MICRO, loss_of)
            record["losses"].extend(pipeline.share([losses[k] for k in sorted(losses)]))
            if "grads" not in record:
                record["grads"] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            record.setdefault("norms", []).append(float(pipeline.clip_grad_norm(params, GRAD_CLIP[kind])))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        record["weights"].append({n: p.detach().clone() for n, p in model.named_parameters()})
    like = torch.empty(SAMPLES, RESPONSE, 3) if kind == "actor" else torch.empty(SAMPLES, RESPONSE)
    if kind == "actor":
        head.with_entropy = True
    record["forward"] = pipeline.forward(pipeline_inputs(train), 3, like)
    return record


def pipeline_inputs(batch: TrainBatch) -> dict[str, torch.Tensor]:
    from rlkube_trainer.model.token_scores import position_ids_from_mask  # noqa: PLC0415

    return {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "position_ids": position_ids_from_mask(batch.attention_mask),
        "response_mask": batch.response_mask,
    }


def rank_main(rank: int, world: int, port: int, path: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = dist.group.WORLD
    results = {
        f"{kind}-v{virtual or 1}": pipelined(kind, path, group, virtual)
        for kind in ("actor", "critic")
        for virtual in (None, 2)
    }
    torch.save(results, Path(out, f"rank_{rank}.pt"))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    world = int(sys.argv[1])
    mp.spawn(rank_main, args=(world, free_port(), sys.argv[2], sys.argv[3]), nprocs=world)
