"""Partial rollouts on vLLM: generation that a weight update interrupts at a step boundary and
that then goes on with the new weights (verl's FullyAsyncLLMServerClient.generate loop).

Every sample is its own request, streamed token by token, so one interrupted keeps its tokens:
its request is aborted and, once resumed, it continues as a new request from prompt + tokens so
far. The samples' bookkeeping (the splice, the budget left, the weight version of each token) is
`rollout/partial.py`; this module drives vLLM's engine step by step and holds the handshake
between the thread generating and the one pausing it to update weights.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind

from rlkube_trainer.rollout import partial
from rlkube_trainer.rollout.base import RolloutBatch, SamplingConfig
from rlkube_trainer.rollout.vllm.sampling import finish_reason, logprobs_options, sampled_logprobs


class ResumableGeneration:
    """The generation of one engine that `pause` stops at its next step boundary and `resume`
    lets go on, with the weight version then held."""

    def __init__(self) -> None:
        # The version of the weights held (set by resume) and the handshake between the
        # generating thread and the one updating weights.
        self.weight_version = 0
        self.pause_requested = False
        self._condition = threading.Condition()
        self._stepping = False
        self._request_ids = itertools.count()

    def pause(self) -> None:
        """Ask the generation in flight to stop at its next step boundary; return once it has."""
        with self._condition:
            self.pause_requested = True
            while self._stepping:
                self._condition.wait()

    def resume(self, weight_version: int) -> None:
        with self._condition:
            self.weight_version = weight_version
            self.pause_requested = False
            self._condition.notify_all()

    def _begin_stepping(self) -> int:
        """Wait while paused; the weight version the steps that follow generate with."""
        with self._condition:
            while self.pause_requested:
                self._condition.wait()
            self._stepping = True
            return self.weight_version

    def _end_stepping(self) -> None:
        with self._condition:
            self._stepping = False
            self._condition.notify_all()

    def generate(
        self, llm: Any, prompt_token_ids: list[list[int]], sampling: SamplingConfig, per_request_seed: bool
    ) -> RolloutBatch:
        """Generation that `pause` interrupts at a step boundary: the unfinished requests are
        aborted, their tokens kept, and once resumed they continue as new requests from
        prompt + tokens so far."""
        engine = llm.llm_engine
        samples = partial.start(len(prompt_token_ids), sampling.n, sampling.logprobs)
        extra = logprobs_options(sampling)

        def params(sample: partial.InFlight, resumed: bool) -> SamplingParams:
            # The seed vLLM gives sample j of prompt i; a resumed request draws a new stream.
            seed = None
            if per_request_seed and sampling.seed is not None:
                seed = sampling.seed + sample.prompt_index * sampling.n + sample.sample_index
                seed += len(sample.token_ids) if resumed else 0
            return SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=0 if sampling.top_k == -1 else sampling.top_k,
                max_tokens=partial.remaining_tokens(sampling.max_tokens, sample),
                seed=seed,
                ignore_eos=sampling.ignore_eos,
                logprobs=0 if sampling.logprobs else None,
                detokenize=False,
                output_kind=RequestOutputKind.DELTA,
                **extra,
            )

        resumed = False
        while pending := partial.unfinished(samples):
            version = self._begin_stepping()
            try:
                running: dict[str, partial.InFlight] = {}
                for sample in pending:
                    request_id = f"partial-{next(self._request_ids)}"
                    prompt = partial.resume_prompt(prompt_token_ids[sample.prompt_index], sample)
                    engine.add_request(request_id, {"prompt_token_ids": prompt}, params(sample, resumed))
                    running[request_id] = sample
                while engine.has_unfinished_requests() and not self.pause_requested:
                    for output in engine.step():
                        sample = running[output.request_id]
                        for completion in output.outputs:  # one (n=1), its new tokens
                            tokens = list(completion.token_ids)
                            logprobs = sampled_logprobs(completion.logprobs, tokens) if sampling.logprobs else None
                            reason = finish_reason(completion.finish_reason) if completion.finish_reason else None
                            partial.extend(sample, tokens, logprobs, version, reason)
                left = [rid for rid, sample in running.items() if not sample.finished]
                if left:
                    engine.abort_request(left)
                for sample in running.values():
                    partial.interrupted(sample, sampling.max_tokens)
            finally:
                self._end_stepping()
            resumed = True
        return RolloutBatch([partial.to_sample(s) for s in samples], sampling.n)
