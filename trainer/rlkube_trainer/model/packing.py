"""Sequence packing (verl's use_remove_padding) and micro-batches by token count (verl's
use_dynamic_bsz).

Packing: the real tokens of a padded micro-batch `[batch, seq]` are laid end to end in one
row `[1, tokens]`, each sequence with its own positions 0, 1, ..., and attention is causal
within each sequence only (a document mask). No compute goes to padding, and a sequence
gives the numbers it gives padded, on either side.

The document mask reaches the model as its `attention_mask` in 4-D form, which transformers
passes through to the attention function unchanged: on GPU a FlexAttention `BlockMask`
built from the sequence boundaries at block granularity (no `[tokens, tokens]` tensor is
made, and blocks of other sequences are skipped, not masked), run by `packed_attention`, the
attention implementation `enable_packed_attention` gives a model; elsewhere a dense boolean
mask for SDPA (FlexAttention has no backward on CPU). Both are the same mask, built from the
same sequence ids; a padded batch (a 2-D mask) still runs through SDPA as before.

Dynamic batches: `token_bins` groups samples so that each micro-batch's real tokens fit a
budget, with the same number of micro-batches on every rank of the group (a rank with fewer
forwards would leave FSDP's collectives of the others waiting). `LossScale` weighs each
micro-batch's loss so that the gradient of a mini-batch is that of its loss aggregated over
the whole mini-batch, across ranks, however it is split.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

if TYPE_CHECKING:  # torch and transformers only at run time: bench/gpu/packing_bench.py runs without the rest
    from rlkube_api.config import LossAggMode

# The name under which models find `packed_attention` (transformers' attention registry).
PACKED_ATTENTION = "rlkube_packed"
# FlexAttention's tile; the packed row is padded up to a multiple of it so that the kernel sees
# whole blocks and few distinct lengths (each new length can cost a recompilation).
BLOCK = 128


@dataclass(frozen=True)
class PackedBatch:
    """A padded micro-batch as one packed row, and the way back to `[batch, response_length]`."""

    input_ids: torch.Tensor  # [1, tokens]
    position_ids: torch.Tensor  # [1, tokens]
    attention_mask: torch.Tensor | BlockMask  # the document mask, 4-D
    # Packed index of the position that scores each real response token (the one before it),
    # in row-major order of `response_mask`.
    score_index: torch.Tensor  # [n]
    targets: torch.Tensor  # [n] the response tokens scored there
    response_mask: torch.Tensor  # [batch, response_length] bool

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """[n] values at `score_index` back to [batch, response_length], 0 at padding."""
        out = values.new_zeros(self.response_mask.shape)
        return out.masked_scatter(self.response_mask, values)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int) -> PackedBatch:
    """The packed row of a `[prompt | response]` batch (`batch.py`'s layout; any padding side)."""
    real = attention_mask.bool()
    batch, seq = real.shape
    tokens = int(real.sum())
    length = max(BLOCK, math.ceil(tokens / BLOCK) * BLOCK)
    device = input_ids.device
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    rows = torch.arange(batch, device=device).unsqueeze(1).expand(batch, seq)
    tail = length - tokens
    # The tail that rounds the row up is one more sequence of its own, never read.
    ids = torch.cat([input_ids[real], input_ids.new_zeros(tail)])
    pos = torch.cat([positions[real], torch.arange(tail, device=device)])
    sequence = torch.cat([rows[real], torch.full((tail,), batch, device=device)])
    index = torch.full((batch, seq), -1, dtype=torch.long, device=device)
    index[real] = torch.arange(tokens, device=device)
    response_mask = real[:, seq - response_length :]
    score_index = index[:, seq - response_length - 1 : seq - 1][response_mask]
    if bool((score_index < 0).any()):
        raise ValueError("a response token follows padding: a sequence must be contiguous to be packed")
    return PackedBatch(
        input_ids=ids.unsqueeze(0),
        position_ids=pos.unsqueeze(0),
        attention_mask=document_mask(sequence),
        score_index=score_index,
        targets=input_ids[:, seq - response_length :][response_mask],
        response_mask=response_mask,
    )


def packed_rows(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, Any, torch.Tensor]:
    """Token lists as one packed row: input_ids [1, tokens], position_ids [1, tokens], the
    document mask, and the packed index of each list's last token."""
    lengths = torch.tensor([len(r) for r in rows])
    tokens = int(lengths.sum())
    length = max(BLOCK, math.ceil(tokens / BLOCK) * BLOCK)
    tail = length - tokens
    ids = torch.tensor([t for r in rows for t in r] + [0] * tail, device=device)
    pos = torch.cat([torch.arange(n) for n in [*lengths.tolist(), tail]]).to(device)
    sequence = torch.repeat_interleave(torch.arange(len(rows) + 1), torch.tensor([*lengths.tolist(), tail])).to(device)
    return ids[None], pos[None], document_mask(sequence), (lengths.cumsum(0) - 1).to(device)


def document_mask(sequence: torch.Tensor) -> torch.Tensor | BlockMask:
    """Causal attention within each sequence of a packed row (`sequence`: [tokens] ids, sorted)."""
    if sequence.device.type == "cuda":
        return document_block_mask(sequence)
    causal = torch.ones(len(sequence), len(sequence), dtype=torch.bool, device=sequence.device).tril()
    return (causal & (sequence.unsqueeze(1) == sequence.unsqueeze(0)))[None, None]


def document_block_mask(sequence: torch.Tensor) -> BlockMask:
    """The FlexAttention BlockMask of `document_mask`, from each block's first and last sequence id:
    O(blocks²) work, never O(tokens²). Rows are sorted by sequence, so query block q and key block k
    (k <= q) share a sequence iff k's last id reaches q's first; the pair is full (no per-element
    mask needed) when both blocks lie in one and the same sequence and k is strictly before q."""
    tokens = len(sequence)
    assert tokens % BLOCK == 0, "pack() rounds the row up to whole blocks"
    blocks = sequence.view(-1, BLOCK)
    first, last = blocks[:, 0], blocks[:, -1]
    q = torch.arange(len(blocks), device=sequence.device)
    causal = q.unsqueeze(0) <= q.unsqueeze(1)  # [q, k]: k <= q
    touches = causal & (last.unsqueeze(0) >= first.unsqueeze(1))
    single = first == last
    full = touches & (q.unsqueeze(0) < q.unsqueeze(1)) & single & (first == first.unsqueeze(1)) & single.unsqueeze(1)
    partial = touches & ~full

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (sequence[q_idx] == sequence[kv_idx]) & (kv_idx <= q_idx)

    def ordered(blocks_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Each query block's key blocks, ascending, first in its row; the count says how many count.
        counts = blocks_mask.sum(-1, dtype=torch.int32)
        indices = torch.argsort((~blocks_mask).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[None, None], indices[None, None]

    kv_num, kv_indices = ordered(partial)
    full_num, full_indices = ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_indices, full_num, full_indices, BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(tokens, tokens)
    )


@functools.cache
def _flex() -> Callable[..., torch.Tensor]:
    """FlexAttention compiled once (its fused kernels exist only compiled), shapes left dynamic:
    packed rows differ in length from one micro-batch to the next."""
    return torch.compile(flex_attention, dynamic=True)


def packed_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | BlockMask | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface: FlexAttention for a BlockMask, SDPA otherwise
    (dense document masks, and the padded batches of a model that packs)."""
    if not isinstance(attention_mask, BlockMask):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    out = _flex()(
        query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_ATTENTION, packed_attention)
# Padded batches of such a model get SDPA's masks.
ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_ATTENTION, sdpa_mask)


def enable_packed_attention(model: nn.Module) -> None:
    """Every attention layer of `model` (a transformers model, or one holding one) runs
    `packed_attention` from now on."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = PACKED_ATTENTION


# --------------------------------------------------------------------------- dynamic batches


def token_bins(lengths: list[int], budget: int, what: str, same_count_on_every_rank: bool = True) -> list[list[int]]:
    """Sample indices grouped so that each group's tokens fit `budget` (first fit, longest
    first), then split further until every rank of the group has as many groups (the most
    any rank needs; a collective) unless `same_count_on_every_rank` is False (a model that is
    not sharded). `what` names the budget in the error when one sample alone exceeds it."""
    longest = max(lengths, default=0)
    if longest > budget:
        raise ValueError(f"{what} ({budget}) is smaller than a sequence of {longest} tokens")
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, load in enumerate(loads):
            if load + lengths[i] <= budget:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    wanted = _most_across_ranks(len(bins)) if same_count_on_every_rank else len(bins)
    while len(bins) < wanted:
        # Halving the most populous group keeps both halves under the budget; ranks hold equal
        # shares of a batch, so there is one with two or more.
        largest = max(range(len(bins)), key=lambda b: len(bins[b]), default=None)
        if largest is None or len(bins[largest]) < 2:
            raise ValueError(
                f"{what}: {len(lengths)} samples on this rank cannot make the {wanted} micro-batches another rank needs"
            )
        group = bins.pop(largest)
        bins += [group[: len(group) // 2], group[len(group) // 2 :]]
    return [sorted(b) for b in bins]


def _most_across_ranks(count: int) -> int:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return count
    value = torch.tensor([count], dtype=torch.long, device=_collective_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


@dataclass(frozen=True)
class LossScale:
    """What a micro-batch's loss is multiplied by so that the mini-batch's gradient is that of
    `agg_loss` over the whole mini-batch, across the group's ranks (whose gradients are averaged,
    hence the factor `ranks`): the micro-batch's denominator over the mini-batch's.

    token-mean divides by tokens, the seq-mean modes (seq-mean-token-sum-norm too, which then
    divides by a constant) by sequences that have tokens (as `algos.agg_loss` counts them);
    token-sum divides by nothing, so only the ranks' averaging is undone. As verl 0.9.1's
    `agg_loss` with the global batch's token and sequence counts."""

    tokens: float  # response tokens of the mini-batch, all ranks
    sequences: float  # its sequences with at least one response token, all ranks
    ranks: int

    @classmethod
    def of(cls, response_mask: torch.Tensor, copies: int = 1) -> LossScale:
        """The scale of this rank's share of a mini-batch (a collective over the group). `copies`:
        the ranks that hold each sample (a tensor or sequence parallel group runs the same
        samples, and its gradients are one data-parallel rank's)."""
        counts = torch.stack([response_mask.sum(), (response_mask.sum(-1) > 0).sum()]).double()
        ranks = 1
        if dist.is_initialized() and dist.get_world_size() > 1:
            counts = counts.to(_collective_device())
            dist.all_reduce(counts)
            ranks = dist.get_world_size()
        return cls(float(counts[0]) / copies, float(counts[1]) / copies, ranks // copies)

    def weight(self, mode: LossAggMode | str, micro_mask: torch.Tensor) -> float:
        if mode == "token-mean":
            share, total = float(micro_mask.sum()), self.tokens
        elif mode == "token-sum":
            share, total = 1.0, 1.0
        elif mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
            share, total = float((micro_mask.sum(-1) > 0).sum()), self.sequences
        else:
            raise ValueError(f"unknown loss_agg_mode {mode!r}")
        return share * self.ranks / total if total else 0.0
