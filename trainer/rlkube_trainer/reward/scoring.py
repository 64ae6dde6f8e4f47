"""Scores for responses: a user's Python reward function, or a sequence-classification reward model.

Both scorers take a batch of `RewardInput` (verl's `data_source, solution_str, ground_truth, extra_info`,
plus the row's raw prompt for reward models) and return `RewardScores(scores, extra)`: one float per
row, and per-row metrics keyed by name (from reward functions that return a dict).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple, Protocol, SupportsFloat, cast

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlkube_api.config import RewardConfig
from rlkube_trainer.data.prompts import Message, RawPrompt, as_chat_messages, join_message_contents
from rlkube_trainer.model.packing import enable_packed_attention, packed_rows, token_bins

RewardFunction = Callable[..., Any]

# verl calls reward functions with these keywords, so a function must accept them by name.
REWARD_FUNCTION_PARAMETERS = ("data_source", "solution_str", "ground_truth", "extra_info")


class RewardFunctionError(RuntimeError):
    """A reward function that cannot be loaded, or that failed or returned something unusable on a row."""


class RewardConfigError(ValueError):
    """A reward section the trainer cannot act on."""


class RewardInput(NamedTuple):
    """One response to score."""

    data_source: str
    solution_str: str  # the decoded response
    ground_truth: Any
    extra_info: Any = None
    prompt: RawPrompt | None = None  # the row's prompt, as read; only reward models use it


class RewardScores(NamedTuple):
    scores: list[float]
    extra: dict[str, list[float]]  # per-row metrics, each list as long as scores


# Per-row text a reward function returned (e.g. `pred`, the extracted answer that validation's
# majority vote counts), each list as long as the scores.
Labels = dict[str, list[str]]


class RewardScorer(Protocol):
    def score(self, batch: Sequence[RewardInput]) -> RewardScores: ...


# --------------------------------------------------------------------------- reward functions


def load_reward_function(path: str | Path, name: str = "compute_score") -> RewardFunction:
    """Imports a Python file and returns its function `name`, checked to accept verl's arguments."""
    file = Path(path)
    if not file.is_file():
        raise RewardFunctionError(f"reward function file {path} does not exist")
    module = _import_file(file)
    function = getattr(module, name, None)
    if function is None:
        defined = sorted(attr for attr, value in vars(module).items() if inspect.isfunction(value))
        raise RewardFunctionError(f"{path} defines no {name!r} (functions defined: {defined})")
    if not callable(function):
        raise RewardFunctionError(f"{path}: {name!r} is a {type(function).__name__}, not a function")
    _check_signature(function, f"{path}: {name}")
    return cast(RewardFunction, function)


def _import_file(file: Path) -> ModuleType:
    # An explicit source loader imports any file name: a ConfigMap key need not end in ".py".
    module_name = f"rlkube_reward_{abs(hash(str(file.resolve())))}"
    loader = importlib.machinery.SourceFileLoader(module_name, str(file))
    spec = importlib.util.spec_from_file_location(module_name, file, loader=loader)
    if spec is None:
        raise RewardFunctionError(f"reward function file {file} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    # Registered before running, as a normal import would be: dataclasses and pickling in the user's
    # file look their module up in sys.modules.
    sys.modules[module_name] = module
    try:
        loader.exec_module(module)
    except SyntaxError as err:
        del sys.modules[module_name]
        raise RewardFunctionError(f"{file}:{err.lineno}: syntax error: {err.msg}") from err
    except Exception as err:
        del sys.modules[module_name]
        raise RewardFunctionError(f"importing reward function file {file} failed: {type(err).__name__}: {err}") from err
    return module


def _check_signature(function: RewardFunction, what: str) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # some builtins and extension functions have none to inspect
        return
    try:
        signature.bind(**dict.fromkeys(REWARD_FUNCTION_PARAMETERS))
    except TypeError as err:
        raise RewardFunctionError(
            f"{what}{signature} must accept (data_source, solution_str, ground_truth, extra_info=None): {err}"
        ) from err


class FunctionRewardScorer:
    """Scores each row with a reward function returning a number or a dict with a "score" key.

    As in verl, the other numeric entries of a dict become per-row metrics in `extra`; a row that lacks
    a metric others have gets NaN there, so every list stays aligned with the rows.
    """

    def __init__(self, function: RewardFunction, source: str | None = None) -> None:
        self.function = function
        name = getattr(function, "__name__", repr(function))
        self.description = f"{name} ({source})" if source else name

    def score(self, batch: Sequence[RewardInput]) -> RewardScores:
        return self.score_labeled(batch)[0]

    def score_labeled(self, batch: Sequence[RewardInput]) -> tuple[RewardScores, Labels]:
        """The scores, and the text entries of dict results (such as `pred`)."""
        scores: list[float] = []
        metrics: list[dict[str, float]] = []
        labels: list[dict[str, str]] = []
        for row, item in enumerate(batch):
            where = f"reward function {self.description} on batch row {row} (data_source {item.data_source!r})"
            try:
                result = self.function(
                    data_source=item.data_source,
                    solution_str=item.solution_str,
                    ground_truth=item.ground_truth,
                    extra_info=item.extra_info,
                )
            except Exception as err:
                raise RewardFunctionError(f"{where} raised {type(err).__name__}: {err}") from err
            score, row_metrics = _parse_result(result, where)
            scores.append(score)
            metrics.append(row_metrics)
            labels.append(_text_entries(result))
        names = list(dict.fromkeys(name for row in labels for name in row))
        return RewardScores(scores, _align_metrics(metrics)), {
            name: [row.get(name, "") for row in labels] for name in names
        }


def score_with_labels(scorer: RewardScorer, batch: Sequence[RewardInput]) -> tuple[RewardScores, Labels]:
    """Scores and, from reward functions, their text entries; a reward model has none."""
    if isinstance(scorer, FunctionRewardScorer):
        return scorer.score_labeled(batch)
    return scorer.score(batch), {}


def _parse_result(result: Any, where: str) -> tuple[float, dict[str, float]]:
    if isinstance(result, Mapping):
        if "score" not in result:
            raise RewardFunctionError(f"{where} returned a dict without a 'score' key: {sorted(result)}")
        row_metrics = {
            str(key): float(value)
            for key, value in result.items()
            if key != "score" and isinstance(value, SupportsFloat)
        }
        return _as_score(result["score"], where), row_metrics
    return _as_score(result, where), {}


def _text_entries(result: Any) -> dict[str, str]:
    if not isinstance(result, Mapping):
        return {}
    return {str(key): value for key, value in result.items() if isinstance(value, str)}


def overlong_reward(response_length: int, max_response_length: int, buffer_length: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment: 0 up to `max_response_length - buffer_length` tokens,
    then falling linearly to `-penalty_factor` at `max_response_length`."""
    expected = max_response_length - buffer_length
    exceed = response_length - expected
    return min(-exceed / buffer_length * penalty_factor, 0.0)


def _as_score(value: Any, where: str) -> float:
    # SupportsFloat covers Python and numpy numbers and one-element tensors, but not strings.
    if not isinstance(value, SupportsFloat):
        raise RewardFunctionError(f"{where} returned {value!r}; expected a number or a dict with a 'score'")
    score = float(value)
    # A NaN or infinite reward would silently poison every advantage in the batch.
    if not math.isfinite(score):
        raise RewardFunctionError(f"{where} returned a non-finite score {score}")
    return score


def _align_metrics(metrics: Sequence[Mapping[str, float]]) -> dict[str, list[float]]:
    names = list(dict.fromkeys(name for row in metrics for name in row))
    return {name: [row.get(name, math.nan) for row in metrics] for name in names}


# --------------------------------------------------------------------------- reward models


class ModelRewardScorer:
    """Scores prompt + response with a Hugging Face sequence-classification model (one label).

    The text is built with the reward model's own chat template when its tokenizer has one (the
    response as the assistant turn), else the prompt's text followed by the response. Rows are padded
    on the right: with causal attention the padding then cannot change a row's score.
    """

    def __init__(
        self,
        model_path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        batch_size: int = 8,
        max_length: int | None = None,
        packed: bool = False,
        token_budget: int | None = None,
    ) -> None:
        self.model_path = str(model_path)
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.max_length = max_length
        # The reward model is on a mounted volume; nothing is downloaded at run time.
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        self.tokenizer.padding_side = "right"
        # Truncation keeps the end: the score is read at the last token of the response.
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = _load_reward_model(self.model_path, dtype).to(self.device).eval()
        if self.model.config.pad_token_id is None:
            # The classification head finds each row's last token by the pad id.
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.use_chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        self.token_budget = token_budget
        self.head: torch.nn.Linear | None = None
        if packed:
            head = getattr(self.model, "score", None)
            if not isinstance(head, torch.nn.Linear):
                raise RewardConfigError(
                    f"reward.model.useRemovePadding: {self.model_path}'s {type(self.model).__name__} has no "
                    "linear `score` head to apply at each packed row's last token"
                )
            self.head = head
            enable_packed_attention(self.model)

    def conversation_text(self, prompt: RawPrompt, response: str) -> str:
        if not self.use_chat_template:
            return join_message_contents(prompt) + response
        messages: list[Message] = [*as_chat_messages(prompt), {"role": "assistant", "content": response}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False)
        assert isinstance(text, str)  # tokenize=False returns the rendered text
        return text

    def score(self, batch: Sequence[RewardInput]) -> RewardScores:
        texts = []
        for row, item in enumerate(batch):
            if item.prompt is None:
                raise ValueError(f"reward model {self.model_path}: batch row {row} has no prompt to score with")
            texts.append(self.conversation_text(item.prompt, item.solution_str))
        encoded = self.tokenizer(
            texts,
            # A chat template places its own special tokens.
            add_special_tokens=not self.use_chat_template,
            truncation=self.max_length is not None,
            max_length=self.max_length,
        )["input_ids"]
        if self.token_budget is None:
            groups = [
                list(range(i, min(i + self.batch_size, len(texts)))) for i in range(0, len(texts), self.batch_size)
            ]
        else:
            # The reward model is not sharded: each rank may run its own number of passes.
            lengths = [len(ids) for ids in encoded]
            what = "reward.model.forward_max_token_len_per_gpu"
            groups = token_bins(lengths, self.token_budget, what, same_count_on_every_rank=False)
        scores = [0.0] * len(texts)
        for group in groups:
            for row, score in zip(group, self._score_rows([encoded[i] for i in group]), strict=True):
                scores[row] = score
        return RewardScores(scores, {})

    @torch.inference_mode()
    def _score_rows(self, rows: list[list[int]]) -> list[float]:
        if self.head is not None:
            input_ids, position_ids, mask, last = packed_rows(rows, self.device)
            hidden = self.model.base_model(
                input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False
            ).last_hidden_state
            logits = self.head(hidden[0, last])
        else:
            padded = self.tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt").to(self.device)
            logits = self.model(**padded).logits
        return [float(value) for value in logits[:, 0].float().cpu()]


def _load_reward_model(model_path: str, dtype: torch.dtype) -> Any:
    model, loading_info = AutoModelForSequenceClassification.from_pretrained(
        model_path, num_labels=1, dtype=dtype, local_files_only=True, output_loading_info=True
    )
    # A causal LM loads as a classifier too, with a randomly initialised head: random rewards.
    if loading_info["missing_keys"]:
        raise RewardConfigError(
            f"reward model {model_path} lacks trained weights {sorted(loading_info['missing_keys'])}; "
            "is it a causal LM rather than a sequence-classification reward model?"
        )
    return model


# --------------------------------------------------------------------------- from the config


def build_reward_scorer(
    cfg: RewardConfig, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> RewardScorer:
    """The scorer for reward.function or reward.model, or with neither the built-in scorers
    chosen by each row's data_source (`rlkube_trainer.scorers`).

    A reward model runs in float32 on CPU and bfloat16 on GPU unless `dtype` says otherwise.
    """
    if cfg.function is not None and cfg.model is not None:
        raise RewardConfigError("at most one of reward.function and reward.model may be set")
    if cfg.function is None and cfg.model is None:
        from rlkube_trainer.scorers import default_compute_score  # noqa: PLC0415  (math-verify: only when used)

        return FunctionRewardScorer(default_compute_score, source="built-in, by data_source")
    if cfg.function is not None:
        if cfg.function.path is None:
            raise RewardConfigError(
                "reward.function.configMap is resolved to a file path by the operator inside RLJob pods; "
                "outside a cluster set reward.function.path"
            )
        function = load_reward_function(cfg.function.path, cfg.function.name)
        return FunctionRewardScorer(function, source=cfg.function.path)
    assert cfg.model is not None
    if dtype is None:
        dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    model = cfg.model
    budget = model.forward_max_token_len_per_gpu if model.use_dynamic_bsz else None
    return ModelRewardScorer(
        model.path, device=device, dtype=dtype, packed=model.use_remove_padding, token_budget=budget
    )
