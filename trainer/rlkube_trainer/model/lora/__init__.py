"""LoRA (verl's model.lora_rank): low-rank adapters on a frozen base, for actor and critic.

- `adapters`: what a rank does to its model: inject PEFT's LoRA layers (`LoraSettings`),
  turn them off for a forward (the reference is the base model), list what trains.
- `merge`: the adapted model's state as the plain Hugging Face weights the rollout engine
  loads, `W + (alpha / r) * B @ A` per adapted layer, streamed as the tensors arrive.
- `export`: the adapter as PEFT writes it (adapter_config.json + adapter_model.safetensors).
"""

from rlkube_trainer.model.lora.adapters import LoraSettings, adapters_disabled, apply_lora, is_adapted
from rlkube_trainer.model.lora.merge import merged_names, merged_weights

__all__ = [
    "LoraSettings",
    "adapters_disabled",
    "apply_lora",
    "is_adapted",
    "merged_names",
    "merged_weights",
]
