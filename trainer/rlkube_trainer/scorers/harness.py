"""The reward an agent harness reported for its episode (rollout.harness), as the score: what a
job with a harness and no reward function trains on."""

from __future__ import annotations

from typing import Any

# The key of extra_info under which a harness episode's reported reward reaches the reward function.
HARNESS_REWARD = "harness_reward"


def reported(extra_info: Any) -> float | None:
    """The harness's reported reward in a row's extra_info, or None (not a harness episode, or none reported)."""
    if not isinstance(extra_info, dict) or extra_info.get(HARNESS_REWARD) is None:
        return None
    return float(extra_info[HARNESS_REWARD])


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """verl's reward-function signature; the harness's reward, which it must have reported."""
    reward = reported(extra_info)
    if reward is None:
        raise ValueError(f"extra_info.{HARNESS_REWARD} is missing: the row is not a harness episode that reported one")
    return reward
