"""The critic section: the value model gae trains beside the actor."""

from __future__ import annotations

from pydantic import Field, field_validator

from rlkube_api.config.common import MAX_BATCH, TokenBudget
from rlkube_api.config.model import MAX_LORA_RANK, LoraModules, lora_module_names
from rlkube_api.config.optim import OptimConfig
from rlkube_api.config.update import UpdateConfig


class CriticOptimConfig(OptimConfig):
    """The critic's optimizer: verl's critic learns at 1e-5, ten times its actor's rate. The
    default sits on the field, so it holds whatever other optimizer keys a job sets."""

    lr: float = Field(1e-5, gt=0, description="Peak learning rate.")


class CriticConfig(UpdateConfig):
    """The value model for gae: a causal-LM backbone with a scalar head."""

    # verl's critic defaults where they differ from its actor's.
    optim: CriticOptimConfig = Field(default_factory=CriticOptimConfig, description="Optimizer of the critic.")
    ppo_max_token_len_per_gpu: TokenBudget = Field(
        32768, description="useDynamicBsz: tokens per update micro-batch on each rank."
    )

    model_path: str | None = Field(None, max_length=4096, description="Backbone (defaults to model.path).")
    ppo_mini_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH, description="Defaults to the actor's.")
    ppo_epochs: int | None = Field(None, ge=1, description="Defaults to the actor's.")
    use_remove_padding: bool | None = Field(
        None, description="Sequence packing for the critic (as model.useRemovePadding, its default)."
    )
    forward_max_token_len_per_gpu: TokenBudget | None = Field(
        None, description="useDynamicBsz: tokens per micro-batch of the value pass; default ppoMaxTokenLenPerGpu."
    )
    cliprange_value: float = Field(0.5, gt=0, description="Value clipping range.")
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


class AppliedCriticConfig(CriticConfig):
    """The critic section with the values it leaves unset taken from the actor's and the model's
    sections (as verl's critic config interpolates them): what the trainer's critic reads."""

    model_path: str
    ppo_mini_batch_size: int
    ppo_epochs: int
    use_remove_padding: bool
