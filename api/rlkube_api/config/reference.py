"""The ref section: the frozen reference policy's forward pass."""

from __future__ import annotations

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.config.common import TokenBudget
from rlkube_api.config.fsdp import COMPILE_DECODER_LAYERS, FSDPConfig


class ReferenceConfig(ApiModel):
    """The frozen reference policy (verl's ref section)."""

    cel_rules = (
        CelRule(
            "!has(self.fsdpConfig) || !has(self.fsdpConfig.optimizerOffload) || !self.fsdpConfig.optimizerOffload",
            "the reference has no optimizer: optimizerOffload applies to actor and critic",
            ".fsdpConfig.optimizerOffload",
        ),
        # The reference only runs forward passes in the dtype the model loads in (bf16 on GPU,
        # fp32 on CPU): it has no master weights to keep in another dtype and no gradients.
        *(
            CelRule(
                f"!has(self.fsdpConfig) || !has(self.fsdpConfig.mixedPrecision)"
                f" || !has(self.fsdpConfig.mixedPrecision.{name}) || self.fsdpConfig.mixedPrecision.{name} == '{default}'",
                "the reference computes in the dtype it loads in (bf16 on GPU) and reduces no gradients: "
                f"mixedPrecision.{name} applies to actor and critic",
                f".fsdpConfig.mixedPrecision.{name}",
            )
            for name, default in (("paramDtype", "bf16"), ("reduceDtype", "fp32"))
        ),
        CelRule(
            "!has(self.fsdpConfig) || !has(self.fsdpConfig.modelDtype) || self.fsdpConfig.modelDtype == 'fp32'",
            "the reference has no master weights: modelDtype applies to actor and critic",
            ".fsdpConfig.modelDtype",
        ),
    )

    log_prob_max_token_len_per_gpu: TokenBudget | None = Field(
        None,
        description="actor.useDynamicBsz: tokens per micro-batch of the reference's log-prob pass; default "
        "the actor's logProbMaxTokenLenPerGpu.",
    )

    fsdp_config: FSDPConfig = Field(
        default_factory=FSDPConfig,
        description="FSDP2 settings of the reference; it has no master weights and no gradients, so "
        "mixedPrecision and modelDtype other than their defaults are refused; paramOffload is what applies.",
    )
    compile_decoder_layers: bool | None = Field(
        None,
        description=COMPILE_DECODER_LAYERS.format(role="the reference's log-prob pass")
        + " Unset: as actor.compileDecoderLayers. With model.loraRank the reference is the actor's model, "
        "compiled as the actor's is: another value is refused.",
    )
