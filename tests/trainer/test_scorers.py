"""The built-in scorers (chosen by data_source when the job names no reward function or
model), DAPO's overlong penalty, and text entries (pred) of reward-function results."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkube_api.config import RewardConfig
from rlkube_trainer.reward.scoring import (
    FunctionRewardScorer,
    RewardInput,
    build_reward_scorer,
    overlong_reward,
    score_with_labels,
)
from rlkube_trainer.scorers import SCORERS, UnknownDataSource, default_compute_score
from rlkube_trainer.scorers.boxed import last_boxed
from rlkube_trainer.scorers.gsm8k import extract_solution


@pytest.mark.parametrize(
    ("response", "truth", "score", "pred"),
    [
        ("6 * 7 = 42\n#### 42", "42", 1.0, "42"),
        ("#### 1,234", "1234", 1.0, "1234"),  # thousands separators go
        ("first #### 3, then #### 4", "4", 1.0, "4"),  # the last answer counts
        ("the answer is 42", "42", 0.0, ""),  # strict: no #### line, no score
        ("#### 41", "42", 0.0, "41"),
        ("#### -5", "-5", 1.0, "-5"),
    ],
)
def test_gsm8k(response: str, truth: str, score: float, pred: str) -> None:
    assert default_compute_score("openai/gsm8k", response, truth) == {"score": score, "pred": pred}


def test_gsm8k_reads_only_the_tail_of_a_long_response() -> None:
    assert extract_solution("#### 7" + " filler" * 100) is None
    assert extract_solution(" filler" * 100 + "#### 7") == "7"


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [
        ("so x = \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("so x = \\boxed{0.5}", "\\frac{1}{2}", 1.0),  # equivalent, not equal: math-verify
        ("\\boxed{\\dfrac12}", "\\frac{1}{2}", 1.0),
        ("\\boxed{3}", "\\frac{1}{2}", 0.0),
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),
        ("no answer at all", "2", 0.0),
    ],
)
def test_math_boxed_answers_by_equivalence(response: str, truth: str, score: float) -> None:
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert default_compute_score(source, response, truth)["score"] == score


def test_last_boxed_balances_braces() -> None:
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed{unclosed") is None
    assert last_boxed("nothing") is None


def test_an_unknown_data_source_names_the_known_ones() -> None:
    with pytest.raises(UnknownDataSource, match=r"'mine'.*openai/gsm8k.*set reward.function"):
        default_compute_score("mine", "x", "y")
    assert set(SCORERS) >= {"openai/gsm8k", "lighteval/MATH"}


def test_neither_function_nor_model_means_the_built_in_scorers(tmp_path: Path) -> None:
    scorer = build_reward_scorer(RewardConfig())
    rows = [RewardInput("openai/gsm8k", "#### 5", "5"), RewardInput("lighteval/MATH", "\\boxed{2}", "3")]
    scores, labels = score_with_labels(scorer, rows)
    assert scores.scores == [1.0, 0.0]
    assert scores.extra == {}  # pred is text: a label, not a metric
    assert labels == {"pred": ["5", "2"]}
    # A function from a file overrides them, whatever the data_source.
    path = tmp_path / "reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.25\n")
    own = build_reward_scorer(RewardConfig(function={"path": str(path)}))
    assert own.score(rows).scores == [0.25, 0.25]


def test_labels_of_dict_results_stay_aligned_with_the_rows() -> None:
    def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: object = None) -> object:
        return {"score": 1.0, "pred": solution_str} if solution_str else 0.0

    result, labels = FunctionRewardScorer(compute_score).score_labeled(
        [RewardInput("s", "a", "t"), RewardInput("s", "", "t")]
    )
    assert result.scores == [1.0, 0.0]
    assert labels == {"pred": ["a", ""]}


# max_response_length 10, buffer 4: no penalty up to 6 tokens, then -factor * (len - 6) / 4.
@pytest.mark.parametrize(
    ("length", "factor", "expected"),
    [(3, 1.0, 0.0), (6, 1.0, 0.0), (7, 1.0, -0.25), (8, 1.0, -0.5), (10, 1.0, -1.0), (10, 0.5, -0.5)],
)
def test_overlong_reward(length: int, factor: float, expected: float) -> None:
    assert overlong_reward(length, 10, 4, factor) == pytest.approx(expected, abs=1e-12)
