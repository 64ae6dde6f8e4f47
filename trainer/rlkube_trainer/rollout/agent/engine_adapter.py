"""The episodes' `Generate` over a synchronous `RolloutEngine`, batching concurrent requests.

Episodes ask for a continuation one at a time; whatever requests are waiting when the engine
falls idle go to it as one batch (grouped by their token budget), in a worker thread, so tools
of other episodes keep running meanwhile.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Protocol

from rlkube_trainer.rollout.agent.episode import Generation
from rlkube_trainer.rollout.base import RolloutBatch, SamplingConfig


class Engine(Protocol):
    """What episodes need of an engine (a `RolloutEngine`, or the trainer's rollout role)."""

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch: ...


class BatchingGenerator:
    def __init__(self, engine: Engine, sampling: SamplingConfig) -> None:
        if sampling.n != 1:
            raise ValueError("multi-turn episodes sample one continuation per request (n=1); repeat the prompt")
        self.engine = engine
        self.sampling = sampling
        self._pending: list[tuple[list[int], int, asyncio.Future[Generation]]] = []
        self._worker: asyncio.Task[None] | None = None
        self.batches: list[int] = []  # sizes of the engine calls made, for metrics and tests

    async def __call__(self, context: list[int], max_tokens: int) -> Generation:
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._pending.append((context, max_tokens, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # let episodes that are ready now join this batch
            batch, self._pending = self._pending, []
            by_budget: dict[int, list[tuple[list[int], asyncio.Future[Generation]]]] = {}
            for context, budget, future in batch:
                by_budget.setdefault(budget, []).append((context, future))
            for budget, group in by_budget.items():
                # Log-probs only when the run asks for them (sampling.logprobs): vLLM computes them
                # with a torch.compile'd kernel, which on CPU needs a C++ compiler that the
                # trainer's CPU image lacks (every turn's generate then failed in the pods).
                sampling = replace(self.sampling, max_tokens=budget, n=1)
                try:
                    out = await asyncio.to_thread(self.engine.generate, [c for c, _ in group], sampling)
                except Exception as e:  # each waiting episode gets the engine's error
                    for _, future in group:
                        future.set_exception(e)
                    continue
                self.batches.append(len(group))
                for sample, (_, future) in zip(out.samples, group, strict=True):
                    future.set_result(Generation(sample.token_ids, sample.logprobs or [0.0] * len(sample.token_ids)))
