"""Rollout engines: generate responses for the trainer and take its weight updates.

Engines are imported lazily by `build_rollout_engine`, so choosing "hf" never imports vLLM (whose
import is slow and changes process-wide state).
"""

from __future__ import annotations

from typing import Any

from rlkube_trainer.rollout.base import (
    FinishReason,
    RolloutBatch,
    RolloutEngine,
    RolloutSample,
    SamplingConfig,
)

ENGINE_NAMES = ("vllm", "hf")

__all__ = [
    "ENGINE_NAMES",
    "FinishReason",
    "RolloutBatch",
    "RolloutEngine",
    "RolloutSample",
    "SamplingConfig",
    "build_rollout_engine",
]


def build_rollout_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Start the rollout engine `name` ("vllm" or "hf"); kwargs go to its constructor.

    See `VLLMRolloutEngine` and `HFRolloutEngine` for the arguments each takes.
    """
    # Imported here, not at the top: importing vllm is slow and sets process-wide state.
    if name == "vllm":
        from rlkube_trainer.rollout.vllm_engine import VLLMRolloutEngine  # noqa: PLC0415

        return VLLMRolloutEngine(**kwargs)
    if name == "hf":
        from rlkube_trainer.rollout.hf_engine import HFRolloutEngine  # noqa: PLC0415

        return HFRolloutEngine(**kwargs)
    raise ValueError(f"unknown rollout engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
