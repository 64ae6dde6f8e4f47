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
    )

    log_prob_max_token_len_per_gpu: TokenBudget | None = Field(
        None,
        description="actor.useDynamicBsz: tokens per micro-batch of the reference's log-prob pass; default "
        "the actor's logProbMaxTokenLenPerGpu.",
    )

    fsdp_config: FSDPConfig = Field(
        default_factory=FSDPConfig,
        description="FSDP2 settings of the reference; it computes in bf16 on GPU whatever mixedPrecision "
        "says (it has no master weights), so paramOffload is what applies.",
    )
    compile_decoder_layers: bool | None = Field(
        None,
        description=COMPILE_DECODER_LAYERS.format(role="the reference's log-prob pass")
        + " Unset: as actor.compileDecoderLayers. With model.loraRank the reference is the actor's model, "
        "compiled as the actor's is: another value is refused.",
    )
