"""What the actor's and the critic's updates both set, declared once: the optimizer, micro-batches,
loss aggregation, gradient clipping, how the role's ranks hold the model, the decoder-layer compile."""

from __future__ import annotations

from pydantic import Field

from rlkube_api.base import ApiModel
from rlkube_api.config.common import MAX_BATCH, LossAggMode, TokenBudget
from rlkube_api.config.fsdp import COMPILE_DECODER_LAYERS, FSDPConfig, Strategy
from rlkube_api.config.optim import OptimConfig


class UpdateConfig(ApiModel):
    """The fields of a role trained by PPO updates (actor, critic), with verl's actor defaults;
    CriticConfig redeclares those whose default verl's critic sets otherwise (its learning rate,
    its token budget). ActorConfig and CriticConfig add their own fields after these."""

    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer of the role.")
    ppo_micro_batch_size_per_gpu: int = Field(
        8,
        ge=1,
        le=MAX_BATCH,
        description="Samples per forward/backward on each rank; a rank's share of a mini-batch "
        "(ppoMiniBatchSize × samplesPerPrompt / data-parallel ranks) must be a multiple of it.",
    )
    use_dynamic_bsz: bool = Field(
        False,
        description="Micro-batches by token count instead of ppoMicroBatchSizePerGpu samples: each holds "
        "as many samples as fit in ppoMaxTokenLenPerGpu (prompt + response tokens), for the update and the "
        "role's forward passes (the actor's old log-probs and the reference's, the critic's values). "
        "Gradients are those of the whole mini-batch.",
    )
    ppo_max_token_len_per_gpu: TokenBudget = Field(
        16384, description="useDynamicBsz: tokens per update micro-batch on each rank."
    )
    loss_agg_mode: LossAggMode = Field("token-mean", description="How token losses aggregate.")
    loss_scale_factor: int | None = Field(
        None,
        gt=0,
        description="seq-mean-token-sum-norm: the constant the sequence mean is divided by "
        "(default the batch's response length).",
    )
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clipping.")
    strategy: Strategy = Field(
        "auto", description="Data parallelism across the role's ranks: fsdp2, replicate, or auto (fsdp2 on GPU)."
    )
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig, description="FSDP2 settings of the role.")
    compile_decoder_layers: bool = Field(
        False,
        description=COMPILE_DECODER_LAYERS.format(
            role="the role's update and its forward-only pass: the actor's old log-probs, the critic's values"
        ),
    )
