"""status.progress keeps the reward, the validation score and the throughput rounded:
`kubectl get rljobs` prints numbers as stored (the exact values are in the driver's metrics);
its time left reads as kubectl's durations do."""

from __future__ import annotations

import pytest

from rlkube_api.durations import short_duration
from rlkube_api.rljob import Progress


def test_reward_and_throughput_are_stored_rounded() -> None:
    progress = Progress.model_validate(
        {"step": 3, "rewardMean": 0.612345678, "tokensPerSecondPerGPU": 5554.641976871484, "totalSteps": 60}
    )
    assert progress.to_wire() == {"step": 3, "totalSteps": 60, "rewardMean": 0.6123, "tokensPerSecondPerGPU": 5554.6}


def test_the_validation_score_is_stored_rounded() -> None:
    assert Progress.model_validate({"step": 3, "valScore": 0.5833333333333334}).val_score == 0.5833


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-5, "0s"),
        (0.2, "1s"),
        (45, "45s"),
        (60, "1m"),
        (200, "3m20s"),
        (3600, "1h"),
        (7500, "2h5m"),
        (86400, "1d"),
        (3 * 86400 + 4 * 3600 + 59, "3d4h"),
        (float("inf"), "0s"),
    ],
)
def test_time_left_reads_as_kubectl_durations(seconds: float, text: str) -> None:
    assert short_duration(seconds) == text


def test_missing_values_stay_missing() -> None:
    assert Progress.model_validate({"step": 1}).to_wire() == {"step": 1}
