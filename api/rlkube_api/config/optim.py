"""The optimizer of a trained role (actor, critic)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkube_api.base import ApiModel


class OptimConfig(ApiModel):
    """AdamW with linear warmup, then constant or cosine decay."""

    lr: float = Field(1e-6, gt=0, description="Peak learning rate.")
    lr_warmup_steps: int = Field(0, ge=0, description="Linear warmup steps (optimizer steps).")
    lr_warmup_steps_ratio: float = Field(
        0.0, ge=0, le=1, description="Warmup as a fraction of all steps, when lrWarmupSteps is 0."
    )
    warmup_style: Literal["constant", "cosine"] = Field("constant", description="Schedule after warmup.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Cosine: floor as a fraction of lr.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay.")
    betas: list[float] = Field(
        default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2, description="AdamW betas."
    )
