"""How a role's ranks hold its model: data-parallel strategy, FSDP2 sharding, mixed precision,
offload, and the decoder-layer compile."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkube_api.base import ApiModel

# How a role's ranks share a model: FSDP2 shards parameters, gradients and optimizer state
# (`fully_shard` per decoder layer; HSDP with roles.<role>.fsdpSize); replicate keeps a full
# copy per rank and all-reduces gradients. auto = fsdp2 on GPU (one rank too: its mixed
# precision is how the weights compute in bf16), replicate on CPU.
Strategy = Literal["auto", "fsdp2", "replicate"]
FSDPDtype = Literal["bf16", "fp32"]


class MixedPrecisionConfig(ApiModel):
    """FSDP2 mixed precision (verl's fsdp_config.mixed_precision); applies where the role is
    sharded with FSDP2 (strategy fsdp2, or auto on GPU)."""

    param_dtype: FSDPDtype = Field(
        "bf16",
        description="Dtype the forward and backward compute in; the master weights and the optimizer state stay fp32.",
    )
    reduce_dtype: FSDPDtype = Field("fp32", description="Dtype gradients are reduced in across ranks.")


class FSDPConfig(ApiModel):
    """How a role is sharded (verl's fsdp_config); applies where the role is sharded with FSDP2
    (strategy fsdp2, or auto on GPU)."""

    mixed_precision: MixedPrecisionConfig = Field(
        default_factory=MixedPrecisionConfig, description="Compute and gradient-reduction dtypes."
    )
    model_dtype: FSDPDtype = Field(
        "fp32",
        description="Dtype of the sharded parameters the optimizer steps (the master weights), and so of "
        "their gradients and the optimizer state: bf16 halves all three (what TRL trains with by default), "
        "at the precision of bf16 updates.",
    )
    param_offload: bool = Field(
        False,
        description="Keep the sharded parameters, their gradients and the optimizer state in host memory; "
        "each layer's weights reach the GPU only for its forward and backward, and the optimizer steps on "
        "the CPU. The most GPU memory saved, at the optimizer's speed on the CPU.",
    )
    optimizer_offload: bool = Field(
        False,
        description="Keep the optimizer state (AdamW's moments) in host memory between updates: it moves to "
        "the GPU just before the update's first optimizer step and back to the host after the update, so it "
        "is off the GPU while the rollout engine generates and syncs. Actor and critic (the reference has "
        "no optimizer); with paramOffload the state is in host memory anyway.",
    )
    reshard_after_forward: bool = Field(
        True,
        description="Free each layer's gathered weights after its forward and gather them again for the "
        "backward. false keeps them from the forward to the backward: fewer gathers (on one GPU, fewer "
        "casts to the compute dtype) for the memory of a full compute-dtype copy of the model.",
    )


# rlkube's decoder-layer compile, not verl's use_torch_compile, which in verl 0.9.1's FSDP
# engine compiles only its entropy-from-logits helper (rlkube's log-probs and entropy come from
# its chunked LM head, uncompiled either way).
COMPILE_DECODER_LAYERS = (
    "torch.compile each decoder layer's forward ({role}); FSDP2's hooks around the layers stay "
    "eager. The first micro-batches pay the compile (tens of seconds on GPU), later ones run the "
    "fused kernels: on an H100 the actor update went from 22.8 % to 31.7 % of the bf16 matmul rate "
    "(bench/gpu/liger_bench.py). Not verl's useTorchCompile, which compiles only verl's "
    "entropy-from-logits helper."
)
