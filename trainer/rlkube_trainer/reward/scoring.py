"""Scores for responses: a user's Python reward function (run in this process, in a pool of worker
processes, or by a remote verifier's endpoint), or a sequence-classification reward model.

Both scorers take a batch of `RewardInput` (verl's `data_source, solution_str, ground_truth, extra_info`,
plus the row's raw prompt for reward models) and return `RewardScores(scores, extra)`: one float per
row, and per-row metrics keyed by name (from reward functions that return a dict).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlkube_api.config import RewardConfig
from rlkube_api.config.reward import RewardFailurePolicy
from rlkube_trainer.data.prompts import Message, RawPrompt, as_chat_messages, join_message_contents
from rlkube_trainer.model.packing import enable_packed_attention, packed_rows, token_bins
from rlkube_trainer.reward.function import (
    REWARD_FUNCTION_PARAMETERS,
    Call,
    CallFailed,
    FunctionSource,
    RewardFunction,
    RewardFunctionError,
    align_metrics,
    load_reward_function,
    parse_result,
    serial_calls,
    text_entries,
)
from rlkube_trainer.reward.pool import RewardPool
from rlkube_trainer.reward.remote import RemoteVerifier

__all__ = ["REWARD_FUNCTION_PARAMETERS", "RewardFunctionError", "load_reward_function"]

# Rows run elsewhere: their results (or CallFailed) in row order; the bool stops at a failure.
Calls = Callable[[Sequence[Call], bool], list[Any]]
# The per-row metric of on_failure "zero": 1 where the call failed and the row scored 0.
FAILED_METRIC = "reward_failed"


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


class FunctionRewardScorer:
    """Scores each row with a reward function returning a number or a dict with a "score" key.

    As in verl, the other numeric entries of a dict become per-row metrics in `extra`; a row that lacks
    a metric others have gets NaN there, so every list stays aligned with the rows. The function runs
    in this process, one row after another, unless `calls` runs the rows elsewhere (a RewardPool of
    worker processes, a RemoteVerifier). A call that fails (raises, times out, crashes its worker)
    fails the batch with its row named, or with on_failure "zero" scores 0 and is counted in the
    per-row metric FAILED_METRIC (its other numbers 0 too).
    """

    def __init__(
        self,
        function: RewardFunction | None,
        source: str | None = None,
        *,
        on_failure: RewardFailurePolicy = "fail",
        calls: Calls | None = None,
        description: str | None = None,
    ) -> None:
        if function is None and calls is None:
            raise ValueError("a reward function or a way to call one is needed")
        self.function = function
        self.calls = calls
        self.on_failure = on_failure
        name = getattr(function, "__name__", repr(function))
        self.description = description or (
            f"reward function {name} ({source})" if source else f"reward function {name}"
        )

    def score(self, batch: Sequence[RewardInput]) -> RewardScores:
        return self.score_labeled(batch)[0]

    def score_labeled(self, batch: Sequence[RewardInput]) -> tuple[RewardScores, Labels]:
        """The scores, and the text entries of dict results (such as `pred`)."""
        calls = [
            {
                "data_source": i.data_source,
                "solution_str": i.solution_str,
                "ground_truth": i.ground_truth,
                "extra_info": i.extra_info,
            }
            for i in batch
        ]
        stop = self.on_failure == "fail"
        if self.calls is not None:
            results = self.calls(calls, stop)
        else:
            assert self.function is not None
            results = serial_calls(self.function, calls, stop)
        results += [None] * (len(batch) - len(results))  # the rows a failure stopped
        failure = next((row for row, r in enumerate(results) if isinstance(r, CallFailed)), None)
        if failure is not None and stop:
            failed = results[failure]
            raise RewardFunctionError(f"{self._where(batch, failure)} {failed.why}") from failed.error
        scores: list[float] = []
        metrics: list[dict[str, float]] = []
        labels: list[dict[str, str]] = []
        for row, result in enumerate(results):
            if isinstance(result, CallFailed):
                scores.append(0.0)
                metrics.append({})
                labels.append({})
                continue
            score, row_metrics = parse_result(result, self._where(batch, row))
            scores.append(score)
            metrics.append(row_metrics)
            labels.append(text_entries(result))
        extra = align_metrics(metrics)
        if not stop:
            failed = [isinstance(r, CallFailed) for r in results]
            # A failed row scores 0 in every number, not NaN: a NaN would make the batch's mean NaN.
            extra = {k: [0.0 if f else v for v, f in zip(values, failed, strict=True)] for k, values in extra.items()}
            extra[FAILED_METRIC] = [float(f) for f in failed]
        names = list(dict.fromkeys(name for row in labels for name in row))
        return RewardScores(scores, extra), {name: [row.get(name, "") for row in labels] for name in names}

    def _where(self, batch: Sequence[RewardInput], row: int) -> str:
        return f"{self.description} on batch row {row} (data_source {batch[row].data_source!r})"

    def close(self) -> None:
        close = getattr(self.calls, "close", None)
        if close is not None:
            close()


def score_with_labels(scorer: RewardScorer, batch: Sequence[RewardInput]) -> tuple[RewardScores, Labels]:
    """Scores and, from reward functions, their text entries; a reward model has none."""
    if isinstance(scorer, FunctionRewardScorer):
        return scorer.score_labeled(batch)
    return scorer.score(batch), {}


def overlong_reward(response_length: int, max_response_length: int, buffer_length: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment: 0 up to `max_response_length - buffer_length` tokens,
    then falling linearly to `-penalty_factor` at `max_response_length`."""
    expected = max_response_length - buffer_length
    exceed = response_length - expected
    return min(-exceed / buffer_length * penalty_factor, 0.0)


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
    """The scorer for reward.function, reward.remote or reward.model, or with none of them the
    built-in scorers chosen by each row's data_source (`rlkube_trainer.scorers`).

    A reward model runs in float32 on CPU and bfloat16 on GPU unless `dtype` says otherwise.
    """
    if cfg.function is not None and cfg.model is not None:
        raise RewardConfigError("at most one of reward.function and reward.model may be set")
    if cfg.remote is not None:
        verifier = RemoteVerifier.from_config(cfg.remote)
        return FunctionRewardScorer(
            None, on_failure=cfg.on_failure, calls=verifier, description=f"remote verifier {cfg.remote.url}"
        )
    if cfg.model is None:
        return _function_scorer(cfg)
    model = cfg.model
    if dtype is None:
        dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    budget = model.forward_max_token_len_per_gpu if model.use_dynamic_bsz else None
    return ModelRewardScorer(
        model.path, device=device, dtype=dtype, packed=model.use_remove_padding, token_budget=budget
    )


def _function_scorer(cfg: RewardConfig) -> FunctionRewardScorer:
    """reward.function, or the built-in scorers; loaded here first, so that a broken file fails at
    start, and in each worker process of the pool (reward.numWorkers) once more."""
    if cfg.function is None:
        from rlkube_trainer.scorers import default_compute_score  # noqa: PLC0415  (math-verify: only when used)

        function: RewardFunction = default_compute_score
        where = FunctionSource("default_compute_score", module="rlkube_trainer.scorers")
        source = "built-in, by data_source"
    else:
        if cfg.function.path is None:
            raise RewardConfigError(
                "reward.function.configMap is resolved to a file path by the operator inside RLJob pods; "
                "outside a cluster set reward.function.path"
            )
        function = load_reward_function(cfg.function.path, cfg.function.name)
        where = FunctionSource(cfg.function.name, path=cfg.function.path)
        source = cfg.function.path
    workers = reward_workers(cfg.num_workers)
    pool = RewardPool(where, workers, cfg.timeout_seconds) if workers > 0 else None
    return FunctionRewardScorer(function, source=source, on_failure=cfg.on_failure, calls=pool)


def reward_workers(num_workers: int | None, cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """reward.numWorkers; unset, the CPUs this process may use: its affinity, and no more than a
    container's CPU limit (cgroup v2's cpu.max) where one is set."""
    if num_workers is not None:
        return num_workers
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = cgroup.read_text().split()
        return max(1, min(cpus, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):  # no cgroup v2 file, or "max": no limit
        return cpus
