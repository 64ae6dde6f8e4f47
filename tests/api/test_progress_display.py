"""status.progress keeps the reward and the throughput rounded: `kubectl get rljobs`
prints numbers as stored (the exact values are in the driver's metrics)."""

from __future__ import annotations

from rlkube_api.rljob import Progress


def test_reward_and_throughput_are_stored_rounded() -> None:
    progress = Progress.model_validate(
        {"step": 3, "rewardMean": 0.612345678, "tokensPerSecondPerGPU": 5554.641976871484, "totalSteps": 60}
    )
    assert progress.to_wire() == {"step": 3, "totalSteps": 60, "rewardMean": 0.6123, "tokensPerSecondPerGPU": 5554.6}


def test_missing_values_stay_missing() -> None:
    assert Progress.model_validate({"step": 1}).to_wire() == {"step": 1}
