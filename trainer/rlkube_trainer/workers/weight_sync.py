"""Where the actor's new weights reach the rollout engines, after each update.

- `load_into_engine` is the one place weights enter an engine, whatever the placement.
- Colocated: each actor rank loads its own (gathered) weights into its own engine, in memory.
- Separate: actor rank 0 broadcasts the full weights to every rollout rank over a group of
  their own (`BroadcastGroup`; ranks from `rlkube_api.placement.WeightSync`), in buckets of
  about `bucket_bytes`, one flat tensor per bucket; each rollout rank loads what arrives.

The broadcast group is stateless (a TCPStore plus a process group object) rather than
torch.distributed's default group, which each side already uses for its own role.
gloo on CPU; NCCL on GPU.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

if TYPE_CHECKING:
    from rlkube_trainer.rollout import RolloutEngine

log = logging.getLogger("rlkube.trainer")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


Manifest = list[TensorSpec]


def manifest_of(named: Iterable[tuple[str, torch.Tensor]]) -> Manifest:
    return [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in named]


def buckets(manifest: Manifest, bucket_bytes: int) -> list[list[TensorSpec]]:
    """Consecutive tensors of one dtype, up to bucket_bytes each (a larger tensor alone)."""
    out: list[list[TensorSpec]] = []
    size = 0
    for spec in manifest:
        if not out or out[-1][0].dtype != spec.dtype or size + spec.nbytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(spec)
        size += spec.nbytes
    return out


def load_into_engine(
    engine: RolloutEngine, named: Iterable[tuple[str, torch.Tensor]], names: Collection[str] | None = None
) -> int:
    """New weights into a running engine (which drops its prefix cache); returns the bytes.
    With `names` (what `named` will yield) the engine takes each tensor as it comes, so a
    bucketed gather or broadcast holds one bucket at a time."""
    loaded = 0

    def counted() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal loaded
        for name, tensor in named:
            loaded += tensor.numel() * tensor.element_size()
            yield name, tensor

    engine.update_weights(counted(), names)
    return loaded


class BroadcastGroup:
    def __init__(
        self,
        addr: str,
        port: int,
        world_size: int,
        rank: int,
        device: torch.device,
        timeout: datetime.timedelta,
        is_master: bool | None = None,
        generation: int = 0,
    ) -> None:
        is_master = rank == 0 if is_master is None else is_master
        self.rank = rank
        self.device = device
        self.timeout = timeout
        # The actor (rank 0) hosts the store; rollout workers connect to it. A rollout engine
        # that joins later (elastic rollout) connects as a client whatever its rank.
        self.store = TCPStore(addr, port, world_size, is_master, timeout)
        self.group: Any = None
        if generation == 0:
            self.group = self._group(self.store, rank, world_size)
            log.info("weight-sync group: rank %d of %d at %s:%d", rank, world_size, addr, port)
        else:
            self.reform(generation, world_size, rank)

    def _group(self, store: Any, rank: int, world_size: int) -> Any:
        if self.device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self.timeout
            return dist.ProcessGroupNCCL(store, rank, world_size, options)
        return dist.ProcessGroupGloo(store, rank, world_size, self.timeout)

    def reform(self, generation: int, world_size: int, rank: int) -> None:
        """A new membership (rollout engines joined or left): a new process group over the same
        store, its keys under the generation, formed by every member at once."""
        self.rank = rank
        self.group = self._group(PrefixStore(f"members-{generation}/", self.store), rank, world_size)
        log.info("weight-sync group %d: rank %d of %d", generation, rank, world_size)

    def send(self, named: Iterable[tuple[str, torch.Tensor]], manifest: Manifest, bucket_bytes: int) -> int:
        """Rank 0: broadcasts the tensors, which come in manifest order, a bucket at a time.
        Returns the bytes sent."""
        tensors = iter(named)
        sent = 0
        for bucket in buckets(manifest, bucket_bytes):
            parts = []
            for spec in bucket:
                name, tensor = next(tensors)
                if name != spec.name:
                    raise RuntimeError(f"weight sync: {name} arrived where the manifest has {spec.name}")
                parts.append(tensor.to(self.device, spec.dtype).reshape(-1))
            flat = torch.cat(parts)
            del parts
            self.group.broadcast(flat, 0).wait()
            sent += flat.numel() * flat.element_size()
        return sent

    def receive(self, manifest: Manifest, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
        """Rollout ranks: yields (name, tensor) as each bucket arrives."""
        for bucket in buckets(manifest, bucket_bytes):
            flat = torch.empty(sum(s.numel for s in bucket), dtype=bucket[0].dtype, device=self.device)
            self.group.broadcast(flat, 0).wait()
            offset = 0
            for spec in bucket:
                yield spec.name, flat[offset : offset + spec.numel].view(spec.shape)
                offset += spec.numel
