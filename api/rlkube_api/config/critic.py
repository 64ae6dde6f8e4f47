"""The critic section: the value model gae trains beside the actor."""

from __future__ import annotations

from pydantic import Field, field_validator

from rlkube_api.base import ApiModel
from rlkube_api.config.common import MAX_BATCH, LossAggMode, TokenBudget
from rlkube_api.config.fsdp import COMPILE_DECODER_LAYERS, FSDPConfig, Strategy
from rlkube_api.config.model import MAX_LORA_RANK, LoraModules, lora_module_names
from rlkube_api.config.optim import OptimConfig


class CriticOptimConfig(OptimConfig):
    """The critic's optimizer: verl's critic learns at 1e-5, ten times its actor's rate. The
    default sits on the field, so it holds whatever other optimizer keys a job sets."""

    lr: float = Field(1e-5, gt=0, description="Peak learning rate.")


class CriticConfig(ApiModel):
    """The value model for gae: a causal-LM backbone with a scalar head."""

    model_path: str | None = Field(None, max_length=4096, description="Backbone (defaults to model.path).")
    optim: CriticOptimConfig = Field(default_factory=CriticOptimConfig, description="Optimizer of the critic.")
    ppo_mini_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH, description="Defaults to the actor's.")
    ppo_micro_batch_size_per_gpu: int = Field(
        8, ge=1, le=MAX_BATCH, description="Samples per forward/backward on each rank (as the actor's)."
    )
    ppo_epochs: int | None = Field(None, ge=1, description="Defaults to the actor's.")
    use_remove_padding: bool | None = Field(
        None, description="Sequence packing for the critic (as model.useRemovePadding, its default)."
    )
    use_dynamic_bsz: bool = Field(
        False, description="Micro-batches by token count (as actor.useDynamicBsz) for the critic."
    )
    ppo_max_token_len_per_gpu: TokenBudget = Field(
        32768, description="useDynamicBsz: tokens per update micro-batch on each rank."
    )
    forward_max_token_len_per_gpu: TokenBudget | None = Field(
        None, description="useDynamicBsz: tokens per micro-batch of the value pass; default ppoMaxTokenLenPerGpu."
    )
    cliprange_value: float = Field(0.5, gt=0, description="Value clipping range.")
    loss_agg_mode: LossAggMode = Field("token-mean", description="How token losses aggregate.")
    loss_scale_factor: int | None = Field(
        None,
        gt=0,
        description="seq-mean-token-sum-norm: the constant the sequence mean is divided by "
        "(default the batch's response length).",
    )
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clipping.")
    strategy: Strategy = Field(
        "auto", description="Data parallelism across the critic's ranks: fsdp2, replicate, or auto (fsdp2 on GPU)."
    )
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig, description="FSDP2 settings of the critic.")
    compile_decoder_layers: bool = Field(
        False, description=COMPILE_DECODER_LAYERS.format(role="the critic's update and its value pass")
    )
    lora_rank: int = Field(
        0,
        ge=0,
        le=MAX_LORA_RANK,
        description="LoRA for the critic (verl's critic.model.lora_rank): above 0, adapters of this rank on a "
        "frozen backbone; the value head trains in full.",
    )
    lora_alpha: int = Field(16, ge=1, description="The critic's LoRA scaling (as model.loraAlpha).")
    target_modules: LoraModules = Field(
        default_factory=lambda: ["all-linear"], description="The critic's adapted modules (as model.targetModules)."
    )
    exclude_modules: LoraModules = Field(
        default_factory=list, description="The critic's modules kept without adapters (as model.excludeModules)."
    )

    _lora_lists = field_validator("target_modules", "exclude_modules", mode="before")(lora_module_names)
