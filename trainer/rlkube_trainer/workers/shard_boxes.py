"""Where each rank's part of a sharded tensor lies in the whole tensor, read from its DTensor
placements: a box (an offset and a shape per dimension) per rank of the training layout.

Every `Shard` placement on any mesh dimension cuts a box out of the box before it (FSDP2's rows,
a tensor-parallel plan's rows or columns, both at once on a 2-D mesh); `Replicate` gives several
ranks the same box. torch computes a rank's box from its mesh coordinate
(`compute_local_shape_and_global_offset`); the ranks exchange theirs once per sync (a few bytes
per tensor), and the resharding moves exactly the overlap of a holder's box and a receiver's need. A rank's
local tensor (`to_local()`) is its box, row-major.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Box:
    """The block [offset[d], offset[d] + shape[d]) of every dimension d of a tensor."""

    offset: tuple[int, ...]
    shape: tuple[int, ...]

    @staticmethod
    def whole(shape: tuple[int, ...]) -> Box:
        return Box((0,) * len(shape), shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def intersect(self, other: Box) -> Box | None:
        lo = tuple(max(a, b) for a, b in zip(self.offset, other.offset, strict=True))
        hi = tuple(
            min(a + n, b + m) for a, n, b, m in zip(self.offset, self.shape, other.offset, other.shape, strict=True)
        )
        if any(h <= low for low, h in zip(lo, hi, strict=True)):
            return None
        return Box(lo, tuple(h - low for low, h in zip(lo, hi, strict=True)))

    def within(self, outer: Box) -> tuple[slice, ...]:
        """This box as index slices of a tensor that holds `outer` (which contains it)."""
        return tuple(slice(o - p, o - p + n) for o, p, n in zip(self.offset, outer.offset, self.shape, strict=True))


def own_box(tensor: Any) -> Box:
    """The box this rank holds of `tensor`: from its placements over its mesh for a DTensor,
    the whole tensor for a plain one."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC0415

    shape = tuple(tensor.shape)
    if not isinstance(tensor, DTensor):
        return Box.whole(shape)
    local, offset = compute_local_shape_and_global_offset(shape, tensor.device_mesh, tensor.placements)
    return Box(tuple(offset), tuple(local))


def boxes_by_rank(tensors: list[Any], group: Any = None) -> list[list[Box]]:
    """Per tensor, the box every rank of `group` (the default group) holds of it: each rank's own,
    exchanged once (a collective: every rank passes the same tensors in the same order). Each
    rank's own placements alone cannot say it: a tensor may live on a sub-mesh that differs from
    rank to rank (FSDP's dimension of a 2-D mesh for the parameters outside the tensor-parallel
    plan), replicated over the ranks its mesh leaves out."""
    import torch.distributed as dist  # noqa: PLC0415

    mine = [own_box(t) for t in tensors]
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [[box] for box in mine]
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return [[every[rank][i] for rank in range(len(every))] for i in range(len(tensors))]


@dataclass(frozen=True)
class Holdings:
    """The distinct boxes of one tensor and the ranks that hold each (replicas hold the same)."""

    boxes: tuple[Box, ...]
    holders: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(by_rank: list[Box]) -> Holdings:
        distinct: dict[Box, list[int]] = {}
        for rank, box in enumerate(by_rank):
            if box.numel:
                distinct.setdefault(box, []).append(rank)
        return Holdings(tuple(distinct), tuple(tuple(r) for r in distinct.values()))

    def source(self, index: int, receiver: int) -> int:
        """Who sends box `index` to `receiver`: the receiver itself if it holds a replica, else
        the replicas take turns by receiver, so no one replica sends to everyone."""
        holders = self.holders[index]
        return receiver if receiver in holders else holders[receiver % len(holders)]

    def covers(self, shape: tuple[int, ...]) -> bool:
        """The boxes tile the tensor: each element in exactly one."""
        return sum(b.numel for b in self.boxes) == math.prod(shape)


def nbytes(numel: int, dtype: torch.dtype) -> int:
    return numel * torch.empty((), dtype=dtype).element_size()


@dataclass
class SyncLedger:
    """What one rank moves and holds during a weight sync: bytes sent to other ranks, bytes
    received from them, and the sync's own buffers alive at once (the peak), counted where the
    buffers are made and let go."""

    sent: int = 0
    received: int = 0
    held: int = 0
    peak: int = 0

    def hold(self, tensor: torch.Tensor) -> None:
        self.held += tensor.numel() * tensor.element_size()
        self.peak = max(self.peak, self.held)

    def release(self, tensor: torch.Tensor) -> None:
        self.held -= tensor.numel() * tensor.element_size()
