"""Tensor parallel for Hugging Face decoder layers, with torch's DTensor plans
(`parallelize_module`): each attention's query/key/value and each MLP's gate/up projection split
by output features (ColwiseParallel: every rank computes its heads, its slice of the MLP), the
attention's output and the MLP's down projection by input features (RowwiseParallel: one
all-reduce each), as Megatron-LM splits a transformer layer. transformers' attention reshapes to
`(..., -1, head_dim)`, so a rank's attention runs on its own heads unchanged.

What stays whole on every tensor-parallel rank (and is sharded by FSDP2 over the data ranks only):
the embeddings, the norms and the LM head. Megatron's sequence parallel for the norms
(SequenceParallel) does not fit transformers' decoder: its causal mask and rotary angles are
built from the embedding output's length, which sequence sharding would cut. Loss parallel does
not fit the LM head's chunked scores (`model.token_scores`), which take plain tensors.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from rlkube_trainer.parallel.layout import LayoutError, ParallelLayout

# Architectures whose decoder layers have the projections the plan names (q/k/v/o, gate/up/down).
PLANNED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})

DECODER_LAYER_PLAN = (
    ("self_attn.q_proj", "colwise"),
    ("self_attn.k_proj", "colwise"),
    ("self_attn.v_proj", "colwise"),
    ("self_attn.o_proj", "rowwise"),
    ("mlp.gate_proj", "colwise"),
    ("mlp.up_proj", "colwise"),
    ("mlp.down_proj", "rowwise"),
)


def _config(model: nn.Module) -> Any:
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "num_attention_heads"):
            return config
    raise LayoutError(f"{type(model).__name__} has no transformers config to split by")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def check_tensor_parallel(model: nn.Module, layout: ParallelLayout) -> None:
    """Refuse, naming the field, a model the plan does not cover: another architecture (a
    mixture of experts among them), or one with LoRA adapters (PEFT's layers wrap the very
    projections the plan splits)."""
    if layout.tensor == 1:
        return
    config = _config(model)
    field = f"{layout.field('tensorParallelSize')} {layout.tensor}"
    if config.model_type not in PLANNED_MODEL_TYPES:
        raise LayoutError(
            f"{field}: no tensor-parallel plan for model type {config.model_type!r} "
            f"(planned: {', '.join(sorted(PLANNED_MODEL_TYPES))})"
        )
    if any(type(m).__module__.startswith("peft.") for m in model.modules()):
        raise LayoutError(
            f"{field} cannot be combined with LoRA (model.lora_rank): PEFT's adapters wrap the split projections"
        )


def parallelize_decoder_layers(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Each decoder layer's projections split over `tp_mesh` (a 1-D DeviceMesh), in place."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: PLC0415

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for layer in decoder_layers(model):
        plan = {name: styles[style]() for name, style in DECODER_LAYER_PLAN}
        parallelize_module(layer, tp_mesh, plan)
    return model
