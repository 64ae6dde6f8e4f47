"""Ulysses sequence parallel (DeepSpeed-Ulysses, as verl's FSDP workers run it): each sequence
is cut along its length over the ranks of a sequence-parallel group, every rank runs the
embeddings, the projections and the MLPs on its own cut, and around attention an all-to-all
swaps the sequence cuts for head cuts, so that each rank attends over the whole sequence with
1/sp of the heads; a second all-to-all swaps them back. After the last layer the hidden states
are gathered, so the LM head, the value head and the losses see whole sequences, unchanged.

Positions are those of the whole sequence (each cut keeps its own slice of position ids), and
the attention mask is built once over the whole sequence: causal, real tokens only.

Gradients: the hidden-state gather's backward keeps a rank's own cut, times sp. Everything after
the gather is computed identically on the group's ranks, and FSDP2 averages gradients over data
× sequence ranks (`mesh.py`), so the sp factor makes that average the sum over the cuts: the
gradient of the whole sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

ULYSSES_ATTENTION = "rlkube_ulysses"


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """`x` cut in `size` pieces along `scatter_dim`, piece j sent to rank j; the pieces received
    joined along `gather_dim` in rank order."""
    size = dist.get_world_size(group)
    send = torch.stack([c.contiguous() for c in x.chunk(size, dim=scatter_dim)])
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        size = dist.get_world_size(ctx.group)
        own = grad.chunk(size, dim=ctx.dim)[dist.get_rank(ctx.group)]
        return own * size, None, None


def _all_to_all_differentiable(
    x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup
) -> torch.Tensor:
    out: torch.Tensor = _AllToAll.apply(x, scatter_dim, gather_dim, group)  # type: ignore[no-untyped-call]
    return out


def _gather_sequence(x: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    out: torch.Tensor = _GatherSequence.apply(x, dim, group)  # type: ignore[no-untyped-call]
    return out


@dataclass
class _UlyssesState:
    """What the attention layers of a sequence-parallel model read: the group, and the whole
    sequence's mask of the forward that ran last (a recomputing backward, under gradient
    checkpointing, runs after it and before the next)."""

    group: dist.ProcessGroup
    mask: torch.Tensor | None = None


STATE_ATTRIBUTE = "_ulysses_state"


def ulysses_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface: [batch, heads, cut, dim] in, heads exchanged
    for the whole sequence, SDPA under the whole sequence's mask, exchanged back. The mask
    transformers built for the cut is not the one that applies."""
    state: _UlyssesState = getattr(module, STATE_ATTRIBUTE)
    group = state.group
    q, k, v = (_all_to_all_differentiable(t, 1, 2, group) for t in (query, key, value))
    out, _ = sdpa_attention_forward(module, q, k, v, state.mask, scaling=scaling, dropout=dropout, **kwargs)
    # [batch, sequence, heads / sp, dim] -> [batch, cut, heads, dim]
    return _all_to_all_differentiable(out, 1, 2, group), None


AttentionInterface.register(ULYSSES_ATTENTION, ulysses_attention)
# transformers builds a mask for each cut too; SDPA's form, unused by the attention above.
ALL_MASK_ATTENTION_FUNCTIONS.register(ULYSSES_ATTENTION, sdpa_mask)


def whole_sequence_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[batch, 1, seq, seq] booleans: a token sees the real tokens up to itself. Padding
    positions also see themselves, so that no row of the softmax is empty (their outputs are
    never read)."""
    seq = attention_mask.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=attention_mask.device).tril()
    real = attention_mask.bool()[:, None, None, :]
    return (causal & real) | torch.eye(seq, dtype=torch.bool, device=attention_mask.device)


def _backbone(model: nn.Module) -> nn.Module:
    """The transformers base model inside `model`: the module that embeds the tokens."""
    for module in model.modules():
        if hasattr(module, "embed_tokens") and hasattr(module, "layers"):
            return module
    raise ValueError(f"{type(model).__name__} has no decoder backbone (embed_tokens, layers) to cut sequences for")


def _padded(t: torch.Tensor, length: int) -> torch.Tensor:
    return nn.functional.pad(t, (0, length - t.shape[1])) if t.shape[1] < length else t


def enable_ulysses(model: nn.Module, group: dist.ProcessGroup) -> nn.Module:
    """From now on `model`'s forward is sequence parallel over `group` (the ranks of one Ulysses
    group, all running the same samples), in place. Padded batches: input_ids, attention_mask
    [batch, seq] and position_ids passed by keyword, as `model.token_scores` and
    `model.value_head` do."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    backbone = _backbone(model)
    state = _UlyssesState(group)
    seq_lengths: list[int] = []

    def cut(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        mask = kwargs.get("attention_mask")
        if args or mask is None or mask.dim() != 2 or kwargs.get("position_ids") is None:
            raise ValueError(
                "Ulysses sequence parallel runs padded batches with keyword input_ids, attention_mask, position_ids"
            )
        seq = mask.shape[1]
        length = -(-seq // size) * size  # rounded up to a multiple of the group's size
        seq_lengths.append(seq)
        whole = {name: _padded(kwargs[name], length) for name in ("input_ids", "attention_mask", "position_ids")}
        state.mask = whole_sequence_mask(whole["attention_mask"])
        width = length // size
        own = slice(rank * width, (rank + 1) * width)
        return args, {**kwargs, **{name: t[:, own] for name, t in whole.items()}}

    def gather(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        gathered = _gather_sequence(output.last_hidden_state, 1, group)
        output.last_hidden_state = gathered[:, : seq_lengths.pop()]
        return output

    backbone.register_forward_pre_hook(cut, with_kwargs=True)
    backbone.register_forward_hook(gather, with_kwargs=True)
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = ULYSSES_ATTENTION
        if type(module).__name__.endswith("Attention"):
            setattr(module, STATE_ATTRIBUTE, state)
    return model
