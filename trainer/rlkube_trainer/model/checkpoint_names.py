"""The policy's tensors under its checkpoint's names and shapes, for the rollout engine.

transformers 5 loads some architectures with their checkpoint's tensors converted: a mixture of
experts (Qwen2-MoE, Qwen3-MoE, Mixtral, ...) gets every expert's gate, up and down projections
fused into 3-D parameters per layer (`mlp.experts.gate_up_proj`), and `save_pretrained` converts
them back. vLLM loads checkpoints, so weight sync must hand it the checkpoint's tensors
(`mlp.experts.3.up_proj.weight`), not the module's. transformers' own reverse conversion does it;
it is applied tensor by tensor, as weights stream out in buckets, which is only right where each
checkpoint tensor comes from one model tensor. That is checked once, on meta tensors, when the
policy is built: an architecture whose reversal joins several model tensors is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import PrefixChange, revert_weight_conversion


class CheckpointNames:
    """Maps a model's state-dict tensors to its checkpoint's (the identity for most models)."""

    def __init__(self, model: nn.Module, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        pretrained = _pretrained(model)
        self.converts = pretrained is not None and bool(_conversions(pretrained))
        self._model: PreTrainedModel = pretrained  # type: ignore[assignment]  # read only when it converts
        if self.converts:
            self._check_tensor_by_tensor([(name, meta_like(t)) for name, t in items])

    def tensors(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's (name, tensor) pairs for the model's, in order."""
        if not self.converts:
            yield from named
            return
        for name, tensor in named:
            yield from revert_weight_conversion(self._model, {name: tensor}).items()

    def names(self, items: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """The checkpoint's names for the model's tensors, nothing gathered or computed."""
        return [name for name, _ in self.tensors((name, meta_like(t)) for name, t in items)]

    def _check_tensor_by_tensor(self, items: list[tuple[str, torch.Tensor]]) -> None:
        whole = revert_weight_conversion(self._model, dict(items))
        apart = dict(self.tensors(items))
        if whole.keys() != apart.keys() or any(whole[k].shape != apart[k].shape for k in whole):
            model_type = getattr(getattr(self._model, "config", None), "model_type", type(self._model).__name__)
            raise ValueError(
                f"model type {model_type!r}: its checkpoint's tensors are built from several of the loaded "
                "model's, which weight sync does not convert (it streams tensor by tensor)"
            )


def _pretrained(model: nn.Module) -> PreTrainedModel | None:
    """The transformers model inside wrappers (PEFT's, a value head's), if any."""
    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)


def _conversions(model: PreTrainedModel) -> list[object]:
    loaded = getattr(model, "_weight_conversions", None)
    if loaded is not None:
        return list(loaded)
    # Built from a config (a rank's meta skeleton): transformers' table for the architecture, as
    # revert_weight_conversion itself falls back to.
    return [c for c in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(c, PrefixChange)]


def meta_like(tensor: torch.Tensor) -> torch.Tensor:
    """A meta tensor of the full shape (a DTensor shard's too) and dtype."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
