"""Where the actor's new weights reach the rollout engines, after each update.

- `load_into_engine` is the one place weights enter an engine, whatever the placement.
- Colocated: each actor rank loads its own (gathered) weights into its own engine, in memory.
- Separate: every actor rank sends its own shards (its boxes of each tensor, read from the
  DTensor placements: `shard_boxes`) to every rollout rank, over a group of its own with them
  (`WeightSyncGroup`; ranks from `rlkube_api.placement.WeightSync`), in buckets of about
  `bucket_bytes` of full tensors, one flat tensor per sender per bucket; each rollout rank
  assembles each full tensor from every sender's boxes and loads it. No actor rank gathers
  anything: each sends 1/(actor ranks) of the model (LoRA: actor rank 0 sends the merged
  weights, which need the whole of each adapter).

The groups are stateless (a TCPStore plus process group objects) rather than
torch.distributed's default group, which each side already uses for its own role.
gloo on CPU; NCCL on GPU.
"""

from __future__ import annotations

import datetime
import logging
import math
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from rlkube_trainer.workers.shard_boxes import Box, Holdings, SyncLedger, boxes_by_rank, nbytes

if TYPE_CHECKING:
    from rlkube_trainer.rollout import RolloutEngine

log = logging.getLogger("rlkube.trainer")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    # Per sender (actor rank): the box of the full tensor it sends, None if it sends none
    # (a replica another rank sends). The boxes tile the tensor.
    boxes: tuple[Box | None, ...] = ()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return nbytes(self.numel, self.dtype)


Manifest = list[TensorSpec]


def manifest_of(named: Iterable[tuple[str, torch.Tensor]], senders: int = 1, group: Any = None) -> Manifest:
    """Names, full shapes and dtypes, and which sender sends which box of each tensor: from the
    DTensor placements over the actor's ranks (`senders`, `group` or the default group: a
    collective),
    each distinct box by its first holder (one sender: every tensor whole from actor rank 0)."""
    named = list(named)
    held = boxes_by_rank([t for _, t in named], group) if senders > 1 else []
    out = []
    for i, (name, tensor) in enumerate(named):
        shape = tuple(tensor.shape)
        if senders == 1:
            boxes: tuple[Box | None, ...] = (Box.whole(shape),)
        else:
            holdings = Holdings.of(held[i])
            if not holdings.covers(shape):
                raise ValueError(f"weight sync: the actor's shards of {name} do not tile its {shape}")
            first = {holders[0]: box for box, holders in zip(holdings.boxes, holdings.holders, strict=True)}
            boxes = tuple(first.get(rank) for rank in range(senders))
        out.append(TensorSpec(name, shape, tensor.dtype, boxes))
    return out


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


SENDERS_KEY = "senders"


def _box(spec: TensorSpec, sender: int) -> Box | None:
    return spec.boxes[sender] if sender < len(spec.boxes) else None


class WeightSyncGroup:
    """Every actor rank (a sender) and every rollout rank. Each sender has a process group of
    its own with every rollout rank (sender first), over which it broadcasts its shards; the
    rollout ranks take part in every sender's, all at once, and assemble each full tensor."""

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
        senders: int | None = None,
    ) -> None:
        is_master = rank == 0 if is_master is None else is_master
        self.device = device
        self.timeout = timeout
        # Actor rank 0 hosts the store and says how many senders there are; the others connect.
        # A rollout engine that joins later (elastic rollout) connects as a client whatever its rank.
        self.store = TCPStore(addr, port, world_size, is_master, timeout)
        if senders is not None and is_master:
            self.store.set(SENDERS_KEY, str(senders))
        self.senders = int(self.store.get(SENDERS_KEY))
        self.rank = rank
        self.groups: dict[int, Any] = {}
        self.reform(generation, world_size, rank)

    def _group(self, store: Any, rank: int, world_size: int) -> Any:
        if self.device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self.timeout
            return dist.ProcessGroupNCCL(store, rank, world_size, options)
        return dist.ProcessGroupGloo(store, rank, world_size, self.timeout)

    def reform(self, generation: int, world_size: int, rank: int) -> None:
        """A membership (rollout engines joined or left): new process groups over the same
        store, their keys under the generation, formed by every member at once."""
        self.rank = rank
        receivers = world_size - self.senders
        members = PrefixStore(f"members-{generation}/", self.store)
        # A sender forms its own group; a receiver every sender's, in sender order.
        mine = [rank] if rank < self.senders else range(self.senders)
        place = 0 if rank < self.senders else 1 + rank - self.senders
        self.groups = {s: self._group(PrefixStore(f"sender-{s}/", members), place, 1 + receivers) for s in mine}
        log.info("weight-sync group %d: rank %d of %d, %d senders", generation, rank, world_size, self.senders)

    def send(
        self, named: Iterable[tuple[str, torch.Tensor]], manifest: Manifest, bucket_bytes: int, ledger: SyncLedger
    ) -> int:
        """A sender: its box of each tensor (which come in manifest order: a DTensor's local
        shard, or a whole tensor), a bucket at a time. Returns the bytes it sent."""
        tensors = iter(named)
        for bucket in buckets(manifest, bucket_bytes):
            parts = []
            for spec in bucket:
                name, tensor = next(tensors)
                if name != spec.name:
                    raise RuntimeError(f"weight sync: {name} arrived where the manifest has {spec.name}")
                if spec.boxes[self.rank] is not None:
                    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
                    parts.append(local.detach().to(self.device, spec.dtype).reshape(-1))
            if not parts:
                continue
            flat = torch.cat(parts)
            del parts
            ledger.hold(flat)
            self.groups[self.rank].broadcast(flat, 0).wait()
            ledger.sent += flat.numel() * flat.element_size()
            ledger.release(flat)
        return ledger.sent

    def receive(self, manifest: Manifest, bucket_bytes: int, ledger: SyncLedger) -> Iterator[tuple[str, torch.Tensor]]:
        """A rollout rank: per bucket, every sender's boxes at once; then each full tensor,
        assembled from its boxes, one at a time."""
        for bucket in buckets(manifest, bucket_bytes):
            flats: dict[int, torch.Tensor] = {}
            works = []
            for sender, group in self.groups.items():
                # A manifest of fewer senders (LoRA's merged weights: actor rank 0 alone) leaves
                # the others' groups idle.
                numel = sum(box.numel for spec in bucket if (box := _box(spec, sender)) is not None)
                if numel:
                    flats[sender] = torch.empty(numel, dtype=bucket[0].dtype, device=self.device)
                    ledger.hold(flats[sender])
                    works.append(group.broadcast(flats[sender], 0))
            for work in works:
                work.wait()
            offsets = dict.fromkeys(flats, 0)
            for spec in bucket:
                full = torch.empty(spec.shape, dtype=spec.dtype, device=self.device)
                ledger.hold(full)
                whole = Box.whole(spec.shape)
                for sender, box in enumerate(spec.boxes):
                    if box is None:
                        continue
                    start = offsets[sender]
                    full[box.within(whole)] = flats[sender][start : start + box.numel].view(box.shape)
                    offsets[sender] = start + box.numel
                ledger.received += full.numel() * full.element_size()
                yield spec.name, full
                ledger.release(full)
                del full
            for flat in flats.values():
                ledger.release(flat)
