"""Run as a script by test_packing: one actor mini-batch on 2 gloo ranks with FSDP2, packed,
in micro-batches by token count, each rank holding sequences of very different lengths (so
they need different numbers of micro-batches and different token counts). Writes rank 0's
gathered gradient (before the optimizer steps) and each rank's number of micro-batches.

Also the batch the test builds: `make_batch`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.cluster.rank_group import split
from rlkube_trainer.workers.builders import build_actor

# (prompt, response) lengths: uneven, a one-token prompt, a one-token response, a full row.
LENGTHS = [(6, 5), (2, 1), (4, 3), (1, 5), (6, 2), (3, 4), (5, 5)]
# Two ranks: the first holds long sequences, the second short ones.
SKEWED = [(6, 5), (5, 5), (6, 4), (4, 5), (2, 1), (1, 2), (2, 2), (1, 1)]
PROMPT, RESPONSE = 6, 5


def make_batch(lengths: list[tuple[int, int]] = LENGTHS, pad_left: int = 0, pad_right: int = 0) -> TrainBatch:
    """[prompt (left-padded) | response (right-padded)], with `pad_left`/`pad_right` extra padding
    columns on each side; random tokens, advantages, values, returns and old/reference log-probs."""
    g = torch.Generator().manual_seed(0)
    prompt, response = PROMPT + pad_left, RESPONSE + pad_right
    batch = len(lengths)
    ids = torch.zeros(batch, prompt + response, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(lengths):
        ids[i, prompt - p : prompt + r] = torch.randint(3, 300, (p + r,), generator=g)
        mask[i, prompt - p : prompt + r] = 1
    response_mask = mask[:, prompt:].float()
    out = TrainBatch(
        input_ids=ids,
        attention_mask=mask,
        responses=ids[:, prompt:],
        response_mask=response_mask,
        group_index=torch.arange(batch) // 2,
        prompt_lengths=mask[:, :prompt].sum(-1),
    )
    out.advantages = torch.randn(batch, response, generator=g) * response_mask
    out.returns = torch.randn(batch, response, generator=g) * response_mask
    out.values = torch.randn(batch, response, generator=g) * response_mask
    out.old_log_probs = (-2 + 0.3 * torch.randn(batch, response, generator=g)) * response_mask
    out.ref_log_probs = (-2 + 0.3 * torch.randn(batch, response, generator=g)) * response_mask
    return out


def rank_main(rank: int, world: int, port: int, config_path: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    config = parse_trainer_config(yaml.safe_load(Path(config_path).read_text()))
    actor = build_actor(config, torch.device("cpu"), total_steps=1)
    whole = make_batch(SKEWED)
    share = whole.select(torch.arange(len(whole))[split(len(whole), world)[rank]])
    captured: dict[str, torch.Tensor] = {}

    def capture() -> float:
        for name, p in actor.model.named_parameters():
            if p.grad is not None:
                grad = p.grad
                captured[name] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        actor.optimizer.zero_grad(set_to_none=True)
        return 0.0

    actor._optimizer_step = capture  # type: ignore[method-assign]
    actor.samples_per_mini_batch = len(whole)  # one mini-batch: this rank's whole share
    micro_batches = len(actor.micro_batching.groups(share))
    actor.update(share)
    Path(out, f"rank_{rank}.json").write_text(json.dumps({"micro_batches": micro_batches}))
    if rank == 0:
        torch.save(captured, Path(out, "grads.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    world, port, config_path, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    mp.spawn(rank_main, args=(world, port, config_path, out), nprocs=world, join=True)
