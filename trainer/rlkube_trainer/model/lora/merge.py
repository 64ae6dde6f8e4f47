"""An adapted model's state as plain Hugging Face weights: what a rollout engine loads, and
the merged export. Pure over (name, tensor) streams, so it runs on gathered full tensors as
they come out of FSDP2's shards (resharding.gather_full_tensors)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

BASE = ".base_layer."


def _lora_part(name: str) -> tuple[str, str] | None:
    """(layer prefix, "A" or "B") of an adapter tensor, e.g. `m.q_proj.lora_A.default.weight`."""
    for part in ("A", "B"):
        marker = f".lora_{part}."
        if marker in name:
            return name.split(marker, 1)[0], part
    return None


def merged_names(names: Iterable[str]) -> list[str]:
    """The names `merged_weights` yields for a state dict with these names, in its order."""
    return [name.replace(BASE, ".") for name in names if _lora_part(name) is None]


def merged_weights(named: Iterable[tuple[str, torch.Tensor]], scaling: float) -> Iterator[tuple[str, torch.Tensor]]:
    """Each adapted layer's weight as `W + scaling * B @ A` (computed in fp32, returned in W's
    dtype) under the base layer's own name; every other tensor as it comes. An adapted
    layer's tensors come together (its base weight and bias, then A, then B, as a state dict
    lists them): they are held until its B arrives, then yielded in their state-dict order."""
    held: dict[str, list[tuple[str, torch.Tensor]]] = {}
    lora_a: dict[str, torch.Tensor] = {}
    for name, tensor in named:
        part = _lora_part(name)
        if part is None:
            if BASE in name:
                held.setdefault(name.split(BASE, 1)[0], []).append((name.replace(BASE, "."), tensor))
            else:
                yield name, tensor
            continue
        prefix, which = part
        if which == "A":
            lora_a[prefix] = tensor
            continue
        a, base = lora_a.pop(prefix), held.pop(prefix)
        for base_name, base_tensor in base:
            if base_name == f"{prefix}.weight":
                delta = tensor.float() @ a.float()
                yield base_name, (base_tensor.float() + scaling * delta).to(base_tensor.dtype)
            else:
                yield base_name, base_tensor
    if held or lora_a:
        raise ValueError(f"LoRA merge: adapted layers without their A or B: {sorted({*held, *lora_a})[:5]}")
