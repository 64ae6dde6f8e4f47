"""Training shards → tensor-parallel slices: what each rank of a rollout engine needs of the
policy's weights, and how a sharded actor's ranks hand each other only that (HybridFlow's
3D-HybridEngine idea, for FSDP2 → vLLM).

An engine of tensor-parallel size tp spans tp consecutive ranks (`placement.Engines`); vLLM's
rank t of it keeps, of each Hugging Face tensor, one slice (`tp_slice`):
- q/k/v and gate/up projections (column parallel): rows, a 1/tp block (k/v by heads,
  replicated heads when tp exceeds the KV heads);
- o/down projections (row parallel): columns, a 1/tp block;
- the embedding and LM head (vocabulary parallel): rows, the vocabulary padded to a
  multiple of 64 and split in tp ranges;
- everything else (norms, row-parallel biases): the whole tensor.

With FSDP2 each actor rank holds a block of rows of every tensor. `gather_slices` moves, in
one all-to-all per bucket of tensors over the shard group, exactly the rows × columns each
rank's slice needs from each other rank; a naive sync gathers every full tensor on every rank
(`gather_full_tensors`, one all-gather per bucket: what tensor parallel 1 needs).
`sync_bytes` computes both per rank, without running anything.

vLLM's loaders take the full Hugging Face tensor and cut the rank's slice themselves
(`narrow`), so `staged` hands them a full-shaped buffer with only the slice written: the
rest is never read (a test fills it with NaN to prove it) and never moved.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rlkube_trainer.workers.shard_boxes import Box, Holdings, SyncLedger, boxes_by_rank, nbytes

# vLLM pads the vocabulary of its embedding and LM head to a multiple of this before
# splitting it (vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING = 64

# Set (to any value) to fill the unsent part of each staged tensor with NaN: a loader that
# read outside its slice would then produce NaN logits. The tests set it; it costs a write
# of the full tensor, so it is off by default.
CHECK_SLICES_ENV = "RLKUBE_CHECK_TP_SLICES"

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")
_VOCAB = ("embed_tokens", "lm_head")


@dataclass(frozen=True)
class Slice:
    """A block of one dimension of a tensor: [start, start + length) along `dim`."""

    dim: int
    start: int
    length: int

    def rows(self, n: int) -> tuple[int, int]:
        return (self.start, self.start + self.length) if self.dim == 0 else (0, n)

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(self.length if d == self.dim else s for d, s in enumerate(shape))


@dataclass(frozen=True)
class ModelShape:
    """What the slicing rules need of a model's config."""

    num_attention_heads: int
    num_key_value_heads: int

    @staticmethod
    def of(hf_config: Any) -> ModelShape:
        heads = int(hf_config.num_attention_heads)
        return ModelShape(heads, int(getattr(hf_config, "num_key_value_heads", None) or heads))


def _even(n: int, tp: int, rank: int, dim: int) -> Slice:
    if n % tp:
        raise ValueError(f"dimension {dim} of size {n} does not split over tensor parallel {tp}")
    return Slice(dim, rank * (n // tp), n // tp)


def tp_slice(name: str, shape: tuple[int, ...], model: ModelShape, tp: int, rank: int) -> Slice | None:
    """The part of Hugging Face tensor `name` that tensor-parallel rank `rank` of `tp` keeps,
    or None for the whole tensor."""
    if tp == 1:
        return None
    parts = name.split(".")
    module, kind = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", "")
    if module in ("k_proj", "v_proj"):
        kv = model.num_key_value_heads
        head_dim = shape[0] // kv
        if tp >= kv:
            # vLLM replicates each KV head over tp / kv ranks.
            return Slice(0, (rank // (tp // kv)) * head_dim, head_dim)
        return _even(shape[0], tp, rank, 0)
    if module in _COLUMN:
        return _even(shape[0], tp, rank, 0)
    if module in _ROW:
        return _even(shape[1], tp, rank, 1) if kind == "weight" else None
    if module in _VOCAB:
        vocab = shape[0]
        per = math.ceil(vocab / VOCAB_PADDING) * VOCAB_PADDING // tp
        start = min(rank * per, vocab)
        return Slice(0, start, min(start + per, vocab) - start)
    return None


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _shard_rows(n: int, world: int, index: int) -> tuple[int, int]:
    """The rows FSDP2 gives shard `index` of `world` (torch.chunk: blocks of ceil(n / world))."""
    block = math.ceil(n / world)
    start = min(index * block, n)
    return start, min(start + block, n)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return lo, max(lo, hi)


def _piece(shape: tuple[int, ...], rows: tuple[int, int], need: Slice | None) -> tuple[int, ...]:
    """The shape of the rows `rows` of a tensor, cut to a slice's columns."""
    out = (rows[1] - rows[0], *shape[1:])
    return need.shape(out) if need is not None and need.dim != 0 else out


@dataclass(frozen=True)
class SyncBytes:
    """Bytes one rank receives from the others in one weight sync."""

    sliced: int  # only its tensor-parallel slice
    full: int  # every full tensor (the naive gather)


def sync_bytes(
    manifest: Iterable[tuple[str, tuple[int, ...], torch.dtype]],
    model: ModelShape,
    world: int,
    rank: int,
    tp: int,
) -> SyncBytes:
    """What rank `rank` of a group of `world`, its parameters sharded by rows over the whole
    group, receives per sync: its tp slice of every tensor vs every full tensor."""
    sliced = full = 0
    for name, shape, dtype in manifest:
        own = _shard_rows(shape[0], world, rank)
        full += _nbytes(shape, dtype) - _nbytes(_piece(shape, own, None), dtype)
        need = tp_slice(name, shape, model, tp, rank % tp)
        rows = need.rows(shape[0]) if need is not None else (0, shape[0])
        wanted = _nbytes(_piece(shape, rows, need), dtype)
        sliced += wanted - _nbytes(_piece(shape, _overlap(own, rows), need), dtype)
    return SyncBytes(sliced, full)


NeedFn = Callable[[str, tuple[int, ...], int], Slice | None]


def row_sharding(tensor: Any) -> Any | None:
    """The process group a DTensor is sharded over by rows, when it is sharded by rows over one
    mesh dimension and replicated over the others (FSDP2, HSDP); None otherwise."""
    from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: PLC0415

    if not isinstance(tensor, DTensor):
        return None
    sharded = [i for i, p in enumerate(tensor.placements) if isinstance(p, Shard) and p.dim == 0]
    others_replicated = all(isinstance(p, Replicate) for i, p in enumerate(tensor.placements) if i not in sharded)
    if len(sharded) != 1 or not others_replicated:
        return None
    return tensor.device_mesh.get_group(sharded[0])


Named = list[tuple[str, torch.Tensor]]


def shard_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[tuple[Any | None, Named]]:
    """(shard group, tensors): consecutive row-sharded tensors of one shard group and dtype, up
    to `bucket_bytes` of full tensors each (a larger tensor alone), for one collective each;
    any other tensor alone, with no group. Every rank forms the same buckets: they depend only
    on the names, global shapes and dtypes."""
    bucket: Named = []
    group: Any = None
    size = 0
    for name, tensor in named:
        sharding = row_sharding(tensor)
        full_bytes = tensor.numel() * tensor.element_size()
        fits = (
            bucket
            and sharding is not None
            and sharding.group_name == group.group_name
            and tensor.dtype == bucket[0][1].dtype
            and size + full_bytes <= bucket_bytes
        )
        if bucket and not fits:
            yield group, bucket
            bucket, size = [], 0
        if sharding is None:
            yield None, [(name, tensor)]
            continue
        group = sharding
        bucket.append((name, tensor))
        size += full_bytes
    if bucket:
        yield group, bucket


def _local(tensor: Any, device: torch.device) -> torch.Tensor:
    """A DTensor's own shard, on the collective's device (host memory with paramOffload)."""
    return tensor.to_local().detach().to(device)  # type: ignore[no-any-return]


def gather_full_tensors(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor whole, gathered from FSDP2 shards in buckets of about `bucket_bytes` of full
    tensors: one all-gather per bucket over the shard group (per tensor, 18 GB/s was measured on
    2 GPUs), not one per tensor. Each rank lays its shard of each tensor of the bucket, padded to
    the rows of the largest shard (ceil(rows / ranks), FSDP2's torch.chunk), end to end in one
    flat buffer; the gathered buffer is then rank by rank, and each full tensor is its rows from
    every rank, cut to its real rows. The tensors of a bucket are made before any is yielded, so
    a consumer that lets each bucket go before the next holds one bucket (two while one is cut
    out of its flat buffer). A collective over each shard group: every rank must iterate."""
    for group, bucket in shard_buckets(named, bucket_bytes):
        if group is None:
            name, tensor = bucket[0]
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            yield name, full.detach()
            continue
        world = dist.get_world_size(group)
        rows = [math.ceil(t.shape[0] / world) for _, t in bucket]
        widths = [r * math.prod(t.shape[1:]) for r, (_, t) in zip(rows, bucket, strict=True)]
        flat = torch.empty(sum(widths), dtype=bucket[0][1].dtype, device=device)
        offset = 0
        for (_, tensor), width in zip(bucket, widths, strict=True):
            local = _local(tensor, device)
            flat[offset : offset + local.numel()].copy_(local.reshape(-1))
            offset += width
        gathered = torch.empty(world * flat.numel(), dtype=flat.dtype, device=device)
        dist.all_gather_into_tensor(gathered, flat, group=group)
        del flat
        grid = gathered.view(world, -1)
        out, offset = [], 0
        for (name, tensor), width, r in zip(bucket, widths, rows, strict=True):
            shape = tuple(tensor.shape)
            out.append((name, grid[:, offset : offset + width].reshape(world * r, *shape[1:])[: shape[0]]))
            offset += width
        del grid, gathered
        yield from out


def _need_box(need: Slice | None, shape: tuple[int, ...]) -> Box:
    if need is None:
        return Box.whole(shape)
    offset = tuple(need.start if d == need.dim else 0 for d in range(len(shape)))
    return Box(offset, need.shape(shape))


def _sharded_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[Named]:
    """Consecutive DTensors of one dtype, up to `bucket_bytes` of full tensors (a larger one
    alone); a plain tensor alone. Every rank forms the same buckets (names, shapes, dtypes)."""
    bucket: Named = []
    size = 0
    for name, tensor in named:
        full_bytes = tensor.numel() * tensor.element_size()
        sharded = hasattr(tensor, "device_mesh")
        if bucket and (not sharded or tensor.dtype != bucket[0][1].dtype or size + full_bytes > bucket_bytes):
            yield bucket
            bucket, size = [], 0
        if not sharded:
            yield [(name, tensor)]
            continue
        bucket.append((name, tensor))
        size += full_bytes
    if bucket:
        yield bucket


def gather_slices(
    named: Iterable[tuple[str, torch.Tensor]],
    need: NeedFn,
    device: torch.device,
    bucket_bytes: int,
    ledger: SyncLedger | None = None,
) -> Iterator[tuple[str, torch.Tensor, Slice | None, int]]:
    """(name, this rank's slice, which slice, bytes received) for every tensor, in buckets of
    about `bucket_bytes` of full tensors: one all-to-all per bucket over the default group, so
    every rank must iterate.

    Whatever the training layout (FSDP2 rows, tensor-parallel rows or columns, both on a 2-D
    mesh, replicas), each rank's box of each tensor comes from its DTensor placements
    (`shard_boxes`), and `need(name, shape, global_rank)` says which slice a rank keeps: every
    rank knows every other's, so each sends each other rank exactly the overlap of its box and
    their slice, and no rank holds more than its slices of one bucket and what it sends of it."""
    ledger = ledger if ledger is not None else SyncLedger()
    me = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    named = list(named)
    held = dict(zip((name for name, _ in named), boxes_by_rank([t for _, t in named]), strict=True))
    for bucket in _sharded_buckets(named, bucket_bytes):
        if not hasattr(bucket[0][1], "device_mesh"):
            name, tensor = bucket[0]
            mine = need(name, tuple(tensor.shape), me)
            piece = tensor.detach().narrow(mine.dim, mine.start, mine.length) if mine is not None else tensor.detach()
            yield name, piece.to(device), mine, 0
            continue
        # Per tensor: its distinct boxes and holders, each rank's need, and for each receiver
        # the (box index, overlap) pairs it gets, in box order, from whom.
        plans = []
        sends: list[list[torch.Tensor]] = [[] for _ in range(world)]
        recv_sizes = [0] * world
        for name, tensor in bucket:
            shape = tuple(tensor.shape)
            holdings = Holdings.of(held[name])
            needs = [_need_box(need(name, shape, r), shape) for r in range(world)]
            local = _local(tensor, device)
            mine_box = held[name][me]
            incoming = []
            for i, box in enumerate(holdings.boxes):
                for receiver in range(world):
                    overlap = box.intersect(needs[receiver])
                    if overlap is None or holdings.source(i, receiver) != me:
                        continue
                    assert mine_box == box
                    sends[receiver].append(local[overlap.within(box)].reshape(-1))
                overlap = box.intersect(needs[me])
                if overlap is not None:
                    source = holdings.source(i, me)
                    incoming.append((source, overlap))
                    recv_sizes[source] += overlap.numel
            plans.append((name, shape, needs[me], incoming))
        send_sizes = [sum(b.numel() for b in blocks) for blocks in sends]
        dtype = bucket[0][1].dtype
        flat = torch.cat([b for blocks in sends for b in blocks]) if sum(send_sizes) else torch.empty(0, dtype=dtype)
        del sends
        out = torch.empty(sum(recv_sizes), dtype=dtype, device=device)
        ledger.hold(flat)
        ledger.hold(out)
        dist.all_to_all_single(out, flat.to(device), recv_sizes, send_sizes)
        ledger.sent += nbytes(sum(send_sizes) - send_sizes[me], dtype)
        ledger.release(flat)
        del flat
        # From each rank, its pieces of the bucket's tensors in the order both sides planned.
        from_rank = list(torch.split(out, recv_sizes))
        slices = []
        for name, shape, mine_box, incoming in plans:
            piece = torch.empty(mine_box.shape, dtype=dtype, device=device)
            ledger.hold(piece)
            received = 0
            for source, overlap in incoming:
                piece[overlap.within(mine_box)] = from_rank[source][: overlap.numel].view(overlap.shape)
                from_rank[source] = from_rank[source][overlap.numel :]
                if source != me:
                    received += nbytes(overlap.numel, dtype)
            mine = need(name, shape, me)
            slices.append((name, piece, mine, received))
        ledger.received += nbytes(sum(recv_sizes) - recv_sizes[me], dtype)
        ledger.release(out)
        del out, from_rank
        for name, piece, mine, received in slices:
            yield name, piece, mine, received
        for _, piece, _, _ in slices:
            ledger.release(piece)


def staged(piece: torch.Tensor, part: Slice | None, full_shape: tuple[int, ...]) -> torch.Tensor:
    """The slice inside a full-shaped buffer, for vLLM's loaders (which cut the slice out of
    the full tensor themselves); the rest of the buffer is never written or read."""
    if part is None:
        return piece
    buffer = torch.empty(full_shape, dtype=piece.dtype, device=piece.device)
    if os.environ.get(CHECK_SLICES_ENV):
        buffer.fill_(float("nan"))
    buffer.narrow(part.dim, part.start, part.length).copy_(piece)
    return buffer


def load_slices(
    engine: Any, model: torch.nn.Module, tp: int, device: torch.device, bucket_bytes: int, ledger: SyncLedger
) -> int:
    """Colocated, tensor parallel: this rank's slice of each tensor, from the training shards
    (`gather_slices`), into its own engine, each in a full-shaped buffer (`staged`) made only
    as the engine takes it. Returns the bytes of the slices."""
    log = logging.getLogger("rlkube.trainer")
    shape = ModelShape.of(model.config)
    state = model.state_dict()
    loaded = 0

    def slices() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal loaded
        for name, piece, part, _ in gather_slices(
            state.items(), lambda n, s, r: tp_slice(n, s, shape, tp, r % tp), device, bucket_bytes, ledger
        ):
            loaded += piece.numel() * piece.element_size()
            buffer = staged(piece, part, tuple(state[name].shape))
            if buffer is not piece:
                ledger.hold(buffer)
            yield name, buffer
            if buffer is not piece:
                ledger.release(buffer)

    engine.update_weights(slices(), list(state))
    log.info(
        "weight sync: %d bytes of tensor-parallel slices, %d received from other ranks, %d held at most%s",
        loaded,
        ledger.received,
        ledger.peak,
        " (the rest of each tensor NaN)" if os.environ.get(CHECK_SLICES_ENV) else "",
    )
    return loaded
