"""torch.distributed inside a role's group: the group itself (one per role with pods,
NCCL on GPU, gloo on CPU), and data parallelism over it.

On GPU the role's model is sharded with FSDP2 by default (`fully_shard` per decoder
layer, then the root; NCCL; HSDP when the role's fsdpSize is smaller than its group),
with bf16 compute weights over fp32 master weights. On CPU every rank keeps the full
model by default and gradients are averaged with an all-reduce over gloo (what DDP
does, without its wrapper changing the module's parameter names); FSDP2 over gloo
runs when asked for (strategy fsdp2), which is how the CPU tests cover the GPU path.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

log = logging.getLogger("rlkube.trainer")


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


def init_role_group(rendezvous: Rendezvous, device: torch.device, timeout: datetime.timedelta) -> None:
    """torch.distributed's default group = this role's ranks (NCCL on GPU, gloo on CPU). A dead
    peer must fail a collective after `timeout` (trainer.nccl_timeout), not hang it: the driver
    then exits naming the rank."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=rendezvous.init_method,
        rank=rendezvous.rank,
        world_size=rendezvous.world_size,
        timeout=timeout,
    )
    log.info(
        "joined %s group: rank %d of %d at %s", backend, rendezvous.rank, rendezvous.world_size, rendezvous.init_method
    )


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def device_mesh(device: torch.device, fsdp_size: int | None) -> DeviceMesh:
    """The role group as a mesh: 1-D (shard over every rank), or with `fsdp_size` smaller than
    the group, 2-D (replicate, shard): HSDP shards within groups of fsdp_size consecutive ranks
    and replicates across them."""
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    world = world_size()
    if fsdp_size is None or fsdp_size >= world:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    if world % fsdp_size:
        raise ValueError(f"fsdpSize {fsdp_size} does not divide the role's {world} ranks")
    return init_device_mesh(device.type, (world // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "shard"))


def shard_with_fsdp2(
    model: nn.Module,
    mesh: DeviceMesh,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    offload: bool = False,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """FSDP2 over `mesh`: each decoder layer its own unit, then the root. With `param_dtype`
    the gathered weights the forward and backward compute with are cast to it, while the
    sharded parameters the optimizer steps (the master weights) keep their own dtype, and
    gradients are reduced in `reduce_dtype` (verl's FSDP mixed precision). With `offload` the
    sharded parameters and gradients live in (pinned) host memory, and with them the optimizer
    state and step. Without `reshard_after_forward` each layer's gathered weights stay from its
    forward to its backward (the root's always do: FSDP2 keeps them for the backward that
    follows at once)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard  # noqa: PLC0415

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    # Pinned host memory (faster copies) needs a GPU driver; the CPU tests run without one.
    placement = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()
    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            fully_shard(
                module,
                mesh=mesh,
                mp_policy=policy,
                offload_policy=placement,
                reshard_after_forward=reshard_after_forward,
            )
    fully_shard(model, mesh=mesh, mp_policy=policy, offload_policy=placement)
    return model


def offloads_parameters(model: nn.Module) -> bool:
    """Whether FSDP2 keeps this model's sharded parameters in host memory."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule  # noqa: PLC0415

    if not isinstance(model, FSDPModule):
        return False
    group = model._get_fsdp_state()._fsdp_param_group
    return group is not None and isinstance(group.offload_policy, CPUOffloadPolicy)


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
