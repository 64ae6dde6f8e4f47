"""Built-in scorers, chosen by a row's data_source as verl's `default_compute_score` chooses
them: a job without `reward.function` or `reward.model` scores gsm8k and MATH rows with
these, and an agent harness's episode (rollout.harness) with the reward the harness reported,
whatever its data_source. A reward function from a file or ConfigMap replaces them entirely.

Each returns verl's reward-function result: a dict with `score` (the reward) and `pred`
(the extracted answer, which validation uses for majority voting, maj@N).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlkube_trainer.scorers import boxed, gsm8k, harness

Scorer = Callable[[str, Any], dict[str, Any]]

# verl's data_source names (the Hugging Face dataset each came from).
SCORERS: dict[str, Scorer] = {
    "openai/gsm8k": gsm8k.compute_score,
    "lighteval/MATH": boxed.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": boxed.compute_score,
    "HuggingFaceH4/MATH-500": boxed.compute_score,
}


class UnknownDataSource(ValueError):
    """A row whose data_source has no built-in scorer (and no reward function was given)."""


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, Any]:
    """The built-in scorer of `data_source`, with verl's reward-function signature; a harness's
    reported reward first."""
    reward = harness.reported(extra_info)
    if reward is not None:
        return {"score": reward}
    scorer = SCORERS.get(data_source)
    if scorer is None:
        raise UnknownDataSource(
            f"no built-in scorer for data_source {data_source!r} (built in: {', '.join(sorted(SCORERS))}); "
            "set reward.function to a file defining compute_score"
        )
    return scorer(solution_str, ground_truth)
