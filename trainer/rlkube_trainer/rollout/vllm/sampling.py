"""A batch on vLLM: `SamplingConfig` as vLLM's `SamplingParams`, one `generate` call for the
whole batch, and vLLM's outputs as the trainer's `RolloutSample`s (token ids, the sampled tokens'
log-probs, the finish reason).

The conversion is shared with `resumable.py`, which sends the same requests one sample at a time.
"""

from __future__ import annotations

from typing import Any

from vllm import SamplingParams

from rlkube_trainer.rollout.base import FinishReason, RolloutBatch, RolloutSample, SamplingConfig

# SamplingParams fields of the installed vLLM (a msgspec struct): optional ones are used only when
# present. `flat_logprobs` (vLLM >= 0.11) returns a request's log-probs as flat lists instead of one
# dict of Logprob objects per token, which is most of the per-token Python cost of logprobs.
SAMPLING_FIELDS: frozenset[str] = frozenset(getattr(SamplingParams, "__struct_fields__", ()))


def logprobs_options(sampling: SamplingConfig) -> dict[str, Any]:
    """The optional SamplingParams fields a request with `sampling` takes on this vLLM."""
    return {"flat_logprobs": True} if sampling.logprobs and "flat_logprobs" in SAMPLING_FIELDS else {}


def generate_batch(
    llm: Any, prompt_token_ids: list[list[int]], sampling: SamplingConfig, per_request_seed: bool
) -> RolloutBatch:
    """`sampling.n` samples of every prompt, from one `llm.generate` call: one request per prompt.
    With `per_request_seed` each request carries its own seed (see `VLLMRolloutEngine`)."""
    extra = logprobs_options(sampling)
    params = [
        SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0 if sampling.top_k == -1 else sampling.top_k,
            max_tokens=sampling.max_tokens,
            # vLLM gives a request's n samples the seeds seed, seed+1, ..., seed+n-1; spacing the
            # prompts n apart keeps every sample's random stream distinct.
            seed=sampling.seed + i * sampling.n if per_request_seed and sampling.seed is not None else None,
            ignore_eos=sampling.ignore_eos,
            # 0 = no alternatives, only the sampled token's log-prob.
            logprobs=0 if sampling.logprobs else None,
            # The trainer works on token ids; detokenizing would be wasted work.
            detokenize=False,
            **extra,
        )
        for i in range(len(prompt_token_ids))
    ]
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_token_ids], params, use_tqdm=False)
    samples: list[RolloutSample] = []
    for prompt_index, request_output in enumerate(outputs):
        for completion in sorted(request_output.outputs, key=lambda c: c.index):
            token_ids = list(completion.token_ids)
            logprobs = sampled_logprobs(completion.logprobs, token_ids) if sampling.logprobs else None
            samples.append(
                RolloutSample(
                    prompt_index=prompt_index,
                    token_ids=token_ids,
                    logprobs=logprobs,
                    finish_reason=finish_reason(completion.finish_reason),
                )
            )
    return RolloutBatch(samples=samples, n=sampling.n)


def sampled_logprobs(step_logprobs: Any, token_ids: list[int]) -> list[float]:
    """The sampled tokens' log-probs, from vLLM's per-step `{token: Logprob}` list or its flat form.

    With logprobs=0 each step holds exactly the sampled token; the flat form (FlatLogprobs) then has
    one entry per step and its `logprobs` list is the answer, with no per-token objects.
    """
    flat = getattr(step_logprobs, "logprobs", None)
    flat_ids = getattr(step_logprobs, "token_ids", None)
    if isinstance(flat, list) and len(flat) == len(token_ids) and flat_ids == token_ids:
        return [float(x) for x in flat]
    return [float(step[token].logprob) for step, token in zip(step_logprobs, token_ids, strict=True)]


def finish_reason(reason: str | None) -> FinishReason:
    if reason == "stop":
        return "stop"
    if reason == "length":
        return "length"
    raise RuntimeError(f"vLLM finished a sequence for an unexpected reason: {reason!r}")
