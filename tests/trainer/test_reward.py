"""rlkube_trainer.reward.scoring: loading reward functions from files, scoring with them, and reward models.

The reward model is a random-initialised one-layer Qwen2 classifier with a byte-level tokenizer,
both built in tmp_path: nothing is downloaded.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tiny_model import save_reward_model

from rlkube_api.config import RewardConfig
from rlkube_trainer.reward.scoring import (
    FunctionRewardScorer,
    ModelRewardScorer,
    RewardConfigError,
    RewardFunctionError,
    RewardInput,
    build_reward_scorer,
    load_reward_function,
)

EXACT_MATCH = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str.strip() == ground_truth else 0.0
"""


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def inputs(*solutions: str, ground_truth: str = "4") -> list[RewardInput]:
    return [RewardInput("toy", solution, ground_truth, {"i": i}) for i, solution in enumerate(solutions)]


# --------------------------------------------------------------------------- loading functions


def test_loads_and_scores_a_function(tmp_path: Path) -> None:
    scorer = FunctionRewardScorer(load_reward_function(write(tmp_path, "reward.py", EXACT_MATCH), "compute_score"))
    scores, extra = scorer.score(inputs("4", " 4\n", "5"))
    assert scores == [1.0, 1.0, 0.0]
    assert extra == {}


def test_loads_a_file_without_py_extension(tmp_path: Path) -> None:
    # A ConfigMap key mounted as a file can have any name.
    function = load_reward_function(write(tmp_path, "reward", EXACT_MATCH))
    assert function(data_source="toy", solution_str="4", ground_truth="4") == 1.0


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(RewardFunctionError, match=r"absent\.py does not exist"):
        load_reward_function(tmp_path / "absent.py")


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", "import math\n\ndef compute_score(:\n    pass\n")
    with pytest.raises(RewardFunctionError, match=r"broken\.py:3: syntax error"):
        load_reward_function(path)


def test_import_time_error_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "crashes.py", "raise RuntimeError('no GPU here')\n")
    with pytest.raises(RewardFunctionError, match=r"crashes\.py failed: RuntimeError: no GPU here"):
        load_reward_function(path)


def test_missing_function_names_file_and_lists_functions(tmp_path: Path) -> None:
    path = write(tmp_path, "reward.py", EXACT_MATCH)
    with pytest.raises(
        RewardFunctionError, match=r"reward\.py defines no 'score_math' \(functions defined: \['compute_score'\]\)"
    ):
        load_reward_function(path, "score_math")


def test_not_callable_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "reward.py", "compute_score = 0.5\n")
    with pytest.raises(RewardFunctionError, match=r"reward\.py: 'compute_score' is a float, not a function"):
        load_reward_function(path)


def test_wrong_signature_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "reward.py", "def compute_score(response, answer):\n    return 0.0\n")
    with pytest.raises(
        RewardFunctionError, match=r"reward\.py: compute_score\(response, answer\) must accept \(data_source"
    ):
        load_reward_function(path)


def test_kwargs_signature_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "reward.py", "def compute_score(**kwargs):\n    return len(kwargs)\n")
    assert FunctionRewardScorer(load_reward_function(path)).score(inputs("x")).scores == [4.0]


# --------------------------------------------------------------------------- scoring


def test_dict_results_give_score_and_aligned_metrics() -> None:
    results = iter(
        [
            {"score": 1.0, "acc": True, "format": 0.5, "pred": "4"},
            {"score": 0, "acc": False},
            0.25,
        ]
    )

    def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: object = None) -> object:
        return next(results)

    scores, extra = FunctionRewardScorer(compute_score).score(inputs("a", "b", "c"))
    assert scores == [1.0, 0.0, 0.25]
    # Non-numeric entries ("pred") are left out; rows without a metric get NaN.
    assert list(extra) == ["acc", "format"]
    assert extra["acc"][:2] == [1.0, 0.0] and math.isnan(extra["acc"][2])
    assert extra["format"][0] == 0.5 and math.isnan(extra["format"][1]) and math.isnan(extra["format"][2])


def test_extra_info_and_ground_truth_are_passed_through() -> None:
    seen = []

    def compute_score(data_source: str, solution_str: str, ground_truth: object, extra_info: object = None) -> float:
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return 0.0

    FunctionRewardScorer(compute_score).score([RewardInput("gsm8k", "42", ["42", "42.0"], {"index": 9})])
    assert seen == [("gsm8k", "42", ["42", "42.0"], {"index": 9})]


def test_exception_in_the_function_names_row_and_data_source(tmp_path: Path) -> None:
    source = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1 / int(solution_str)\n"
    path = write(tmp_path, "reward.py", source)
    scorer = FunctionRewardScorer(load_reward_function(path), source=str(path))
    with pytest.raises(
        RewardFunctionError, match=r"reward\.py\) on batch row 1 \(data_source 'toy'\) raised ZeroDivisionError"
    ) as info:
        scorer.score(inputs("2", "0"))
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize(
    "result, message",
    [
        ("1.0", r"batch row 0 .* returned '1\.0'; expected a number"),
        ({"acc": 1.0}, r"batch row 0 .* returned a dict without a 'score' key"),
        (float("nan"), r"batch row 0 .* returned a non-finite score nan"),
    ],
)
def test_unusable_results_name_the_row(result: object, message: str) -> None:
    def compute_score(data_source: str, solution_str: str, ground_truth: object, extra_info: object = None) -> object:
        return result

    with pytest.raises(RewardFunctionError, match=message):
        FunctionRewardScorer(compute_score).score(inputs("x"))


# --------------------------------------------------------------------------- from the config


def test_build_from_config_loads_the_function(tmp_path: Path) -> None:
    path = write(tmp_path, "reward.py", EXACT_MATCH.replace("compute_score", "exact"))
    scorer = build_reward_scorer(RewardConfig(function={"path": str(path), "name": "exact"}))
    assert scorer.score(inputs("4")).scores == [1.0]


def test_build_from_config_map_explains_the_operator_resolves_it() -> None:
    cfg = RewardConfig(function={"config_map": {"name": "rewards", "key": "reward.py"}})
    with pytest.raises(RewardConfigError, match=r"configMap is resolved to a file path by the operator"):
        build_reward_scorer(cfg)


# --------------------------------------------------------------------------- reward model


@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_reward_model(tmp_path_factory.mktemp("rm"))


def rm_inputs(*responses: str) -> list[RewardInput]:
    prompt = [{"role": "user", "content": "what is two plus two"}]
    return [RewardInput("chat", response, None, None, prompt) for response in responses]


def test_reward_model_gives_one_finite_score_per_row(reward_model_path: Path) -> None:
    scorer = ModelRewardScorer(reward_model_path, device="cpu", dtype=torch.float32, batch_size=2)
    assert scorer.conversation_text("what is two plus two", "four") == (
        "<|user|> what is two plus two </s> <|assistant|> four </s> "
    )
    scores, extra = scorer.score(rm_inputs("four", "five", "a long answer indeed", "four"))
    assert len(scores) == 4 and all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert extra == {}
    # The same text scores the same whatever it is batched with (here: different padding lengths).
    assert scores[0] == pytest.approx(scores[3], abs=1e-5)
    assert scorer.score(rm_inputs("four")).scores[0] == pytest.approx(scores[0], abs=1e-5)
    assert scores[0] != pytest.approx(scores[1], abs=1e-6)


def test_reward_model_needs_the_prompt(reward_model_path: Path) -> None:
    scorer = ModelRewardScorer(reward_model_path)
    with pytest.raises(ValueError, match=r"batch row 0 has no prompt"):
        scorer.score([RewardInput("chat", "four", None)])


def test_causal_lm_is_refused_as_a_reward_model(tmp_path: Path) -> None:
    path = save_reward_model(tmp_path / "lm", causal_lm=True)
    with pytest.raises(RewardConfigError, match=r"lacks trained weights \['score\.weight'\]"):
        ModelRewardScorer(path)


def test_build_from_config_loads_the_model(reward_model_path: Path) -> None:
    scorer = build_reward_scorer(RewardConfig(model={"path": str(reward_model_path)}))
    assert isinstance(scorer, ModelRewardScorer)
    assert scorer.model.dtype == torch.float32


def test_the_shipped_gsm8k_reward_example_loads_and_scores() -> None:
    """examples/rewards/gsm8k.py, which examples/gpu-multipool.yaml and the README mount from a
    ConfigMap: verl's signature, right 1.0, a well-formed wrong answer its format score."""
    path = Path(__file__).resolve().parents[2] / "examples" / "rewards" / "gsm8k.py"
    score = load_reward_function(path)
    assert score("openai/gsm8k", "18 - 3 = 15 eggs.\n#### 1,5", "15") == 1.0
    assert score("openai/gsm8k", "#### 14", "15") == 0.1
    assert score("openai/gsm8k", "the answer is 15", "15") == 0.0
