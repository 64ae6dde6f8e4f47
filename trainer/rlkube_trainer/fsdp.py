"""torch.distributed inside a role's group: the group itself (one per role with pods,
NCCL on GPU, gloo on CPU), and data parallelism over it.

On GPU the role's model is sharded with FSDP2 (`fully_shard` per decoder layer,
then the root; NCCL). On CPU torch's FSDP2 has no gloo reduce-scatter support
worth relying on, so every rank keeps the full model and gradients are averaged
with an all-reduce over gloo (what DDP does, without its wrapper changing the
module's parameter names).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger("rlkube.trainer")

# A dead peer must fail a collective, not hang it: the driver then exits naming the rank.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=300)


@dataclass(frozen=True)
class Rendezvous:
    """Where a role group meets, and this process's place in it."""

    master_addr: str
    master_port: int
    world_size: int
    rank: int

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"


def init_role_group(rendezvous: Rendezvous, device: torch.device) -> None:
    """torch.distributed's default group = this role's ranks (NCCL on GPU, gloo on CPU)."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=rendezvous.init_method,
        rank=rendezvous.rank,
        world_size=rendezvous.world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    log.info(
        "joined %s group: rank %d of %d at %s", backend, rendezvous.rank, rendezvous.world_size, rendezvous.init_method
    )


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def shard_with_fsdp2(model: nn.Module) -> nn.Module:
    """FSDP2 over the whole role group: each decoder layer its own unit, then the root."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415  (GPU path only)

    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            fully_shard(module)
    fully_shard(model)
    return model


def is_sharded(model: nn.Module) -> bool:
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def average_gradients(model: nn.Module) -> None:
    """All-reduce (mean) of every gradient across the group; a no-op for one rank or FSDP."""
    size = world_size()
    if size == 1 or is_sharded(model):
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(size)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def full_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the model's state dict, whole (sharded ones gathered)."""
    for name, tensor in model.state_dict().items():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        yield name, full.detach()
