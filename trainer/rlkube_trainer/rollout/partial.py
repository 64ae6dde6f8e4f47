"""Partial rollouts (verl's `async_training.partial_rollout`, AReaL's interruptible rollout):
the bookkeeping of samples whose generation a weight update interrupts.

A sample in flight is its tokens so far, their log-probs and the weight version that produced
each token. When generation is interrupted, the unfinished samples are resumed as new requests
whose prompt is the original prompt followed by the tokens generated so far, with the budget
that is left; what comes back is appended. Pure functions, no engine: the engines
(`vllm/resumable.py`) only carry them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkube_trainer.rollout.base import FinishReason, RolloutSample


@dataclass
class InFlight:
    """One sample being generated, possibly across several weight versions."""

    prompt_index: int
    sample_index: int  # which of the prompt's n samples
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None  # None when log-probs were not requested
    token_versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None  # None while unfinished

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def start(num_prompts: int, n: int, logprobs: bool) -> list[InFlight]:
    """The samples of a batch before any token: prompt 0's n samples, then prompt 1's, ..."""
    return [InFlight(p, j, logprobs=[] if logprobs else None) for p in range(num_prompts) for j in range(n)]


def extend(
    sample: InFlight,
    token_ids: list[int],
    logprobs: list[float] | None,
    version: int,
    finish_reason: FinishReason | None,
) -> None:
    """Append tokens generated with weights `version` (and their log-probs, aligned one to one);
    `finish_reason` set when the sample finished with them."""
    if sample.finished:
        raise ValueError(f"sample {sample.prompt_index}/{sample.sample_index} already finished")
    if (logprobs is None) != (sample.logprobs is None):
        raise ValueError("log-probs must be given for every part of a sample or for none")
    if logprobs is not None and len(logprobs) != len(token_ids):
        raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} log-probs")
    sample.token_ids.extend(token_ids)
    if sample.logprobs is not None and logprobs is not None:
        sample.logprobs.extend(logprobs)
    sample.token_versions.extend([version] * len(token_ids))
    sample.finish_reason = finish_reason


def resume_prompt(prompt_token_ids: list[int], sample: InFlight) -> list[int]:
    """The prompt an unfinished sample resumes from: the original prompt and its tokens so far
    (verl's `prompt_ids + final_output.token_ids`)."""
    return prompt_token_ids + sample.token_ids


def remaining_tokens(max_tokens: int, sample: InFlight) -> int:
    """The response budget left to a sample (verl: `original_max_tokens - len(token_ids)`)."""
    return max_tokens - len(sample.token_ids)


def interrupted(sample: InFlight, max_tokens: int) -> None:
    """The generation of an unfinished sample stopped for a weight update: it resumes later,
    unless its budget is spent (then it is finished, as verl's resume loop sets "length")."""
    if not sample.finished and remaining_tokens(max_tokens, sample) <= 0:
        sample.finish_reason = "length"


def unfinished(samples: list[InFlight]) -> list[InFlight]:
    return [s for s in samples if not s.finished]


def to_sample(sample: InFlight) -> RolloutSample:
    if sample.finish_reason is None:
        raise ValueError(f"sample {sample.prompt_index}/{sample.sample_index} is unfinished")
    return RolloutSample(
        prompt_index=sample.prompt_index,
        token_ids=list(sample.token_ids),
        logprobs=list(sample.logprobs) if sample.logprobs is not None else None,
        finish_reason=sample.finish_reason,
        token_versions=list(sample.token_versions),
    )
