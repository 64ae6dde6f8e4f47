"""PEFT's LoRA layers injected into a model in place: the model keeps its class, its forward
and its config (the log-prob path, packing and FSDP2's per-layer units see the same model),
and gains `<layer>.base_layer.*` (the frozen weights) and `<layer>.lora_{A,B}.default.weight`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlkube_api.config import CriticConfig, ModelConfig

ADAPTER = "default"  # PEFT's name for a model's only adapter
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraSettings:
    """One model's LoRA, from verl's keys (model.* for the actor, critic.* for the critic)."""

    rank: int
    alpha: int
    target_modules: tuple[str, ...] = (ALL_LINEAR,)
    exclude_modules: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        """What B @ A is multiplied by (PEFT's, without rank-stabilised scaling)."""
        return self.alpha / self.rank

    @classmethod
    def of(cls, config: ModelConfig | CriticConfig) -> LoraSettings:
        return cls(config.lora_rank, config.lora_alpha, tuple(config.target_modules), tuple(config.exclude_modules))

    def peft_config(self) -> Any:
        from peft import LoraConfig  # noqa: PLC0415  (only where LoRA is on)

        # PEFT reads all-linear only as the bare string; a list of names matches name suffixes.
        targets: str | list[str] = ALL_LINEAR if self.target_modules == (ALL_LINEAR,) else list(self.target_modules)
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            target_modules=targets,
            exclude_modules=list(self.exclude_modules) or None,
            lora_dropout=0.0,
            bias="none",
        )


def apply_lora(model: nn.Module, settings: LoraSettings, seed: int = 0) -> nn.Module:
    """Injects the adapters (B = 0, so the model computes what the base does) and freezes
    everything else. The A matrices are drawn under `seed` whatever the caller's RNG: every
    rank of a role must start from the same adapter. Works on the meta device too."""
    from peft import inject_adapter_in_model  # noqa: PLC0415

    if not settings.enabled:
        return model
    nothing = f"LoRA: no module of {type(model).__name__} matches targetModules {list(settings.target_modules)}"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            inject_adapter_in_model(settings.peft_config(), model, adapter_name=ADAPTER)
        except ValueError as error:  # PEFT's "Target modules ... not found", among others
            raise ValueError(f"{nothing} (excludeModules {list(settings.exclude_modules)}): {error}") from None
    adapted = False
    for name, param in model.named_parameters():
        trains = ".lora_" in name
        adapted |= trains
        param.requires_grad_(trains)
    if not adapted:
        raise ValueError(nothing)
    return model


def is_adapted(model: nn.Module) -> bool:
    return any(".lora_A." in name for name, _ in model.named_parameters())


def _adapter_layers(model: nn.Module) -> list[Any]:
    from peft.tuners.tuners_utils import BaseTunerLayer  # noqa: PLC0415

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Within the block the model computes as its base (the reference policy). PEFT's own
    switch (enable_adapters) also flips the adapters' requires_grad, which FSDP2 copies into
    the unsharded parameters it builds at the first all-gather: the flag is set directly."""
    layers = _adapter_layers(model)
    before = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, was in zip(layers, before, strict=True):
            layer._disable_adapters = was


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
