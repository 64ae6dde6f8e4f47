"""The adapter in PEFT's own format, so `PeftModel.from_pretrained(base, path)` (or vLLM's
LoRA loader) reads what the trainer wrote: adapter_config.json and adapter_model.safetensors
whose keys are `base_model.model.<layer>.lora_{A,B}.weight` (PEFT drops the adapter's name)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from rlkube_trainer.model.lora.adapters import ADAPTER, LoraSettings

PEFT_PREFIX = "base_model.model."
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# Beside the merged model in an HF export (verl writes its adapter to a folder of this name too).
ADAPTER_DIR = "lora_adapter"


def peft_adapter_state(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a (full, gathered) state dict under PEFT's saved names."""
    out = {}
    for name, tensor in named:
        if ".lora_A." in name or ".lora_B." in name:
            saved = PEFT_PREFIX + name.replace(f".{ADAPTER}.", ".")
            out[saved] = tensor.detach().to("cpu").contiguous()
    return out


def write_adapter(directory: Path, settings: LoraSettings, state: Mapping[str, torch.Tensor], base_model: str) -> None:
    """adapter_config.json + adapter_model.safetensors into `directory` (made if missing)."""
    from safetensors.torch import save_file  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    config = settings.peft_config()
    config.task_type = "CAUSAL_LM"
    config.base_model_name_or_path = base_model
    config.save_pretrained(str(directory))
    save_file(dict(state), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
