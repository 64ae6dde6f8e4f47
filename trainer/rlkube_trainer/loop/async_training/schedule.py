"""The one-step-off / bounded-staleness schedule (verl 0.9.1 `trainer.v1.trainer_mode`
`colocate_async` / `separate_async`), as a loop that reads like the algorithm:

    while updates remain:
        take a batch within the staleness bound (waiting for the rollout if there is none)
        start the next generation (pushing weights first every parameter_sync_step updates)
        update the actor on the batch, while that generation runs

One generation runs at a time, on a worker thread (the in-process vLLM CPU engine generates
safely off the main thread while torch trains on it, measured 2026-12-02); weights are pushed
only between generations, never during one, unless partial rollouts are on
(`async_training.partial_rollout`): then a push due after an update goes into the generation in
flight, which `push_weights` interrupts and resumes with the new weights (rollout/partial.py).
Its groups keep the version the generation began with, the oldest of their tokens, for the
staleness bound. Validation quiesces the schedule between rows
(`quiesce`): it waits for the generation in flight and validates with the newest weights. Generation, training and the weight push are
callables, so the same loop drives colocated and separate placements.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from rlkube_trainer.loop.async_training.staleness import OffPolicyBuffer, Taken

T = TypeVar("T")
Metrics = dict[str, float]
# Each row's actor version the engine held: the status shows how far generation lags (progress.py).
ROLLOUT_WEIGHT_VERSION = "training/rollout_weight_version"
# Generation with the engine's current weights: the groups of one batch of prompts.
Generate = Callable[[], list[T]]
# One actor update on a batch handed out by the buffer; returns its metrics.
Train = Callable[[Taken[T], int], Metrics]
# Push the actor's weights into the engine.
PushWeights = Callable[[], None]


@dataclass
class Versions:
    actor: int = 0  # updates done
    engine: int = 0  # the actor version the engine holds


class OneStepOff(Generic[T]):
    def __init__(
        self,
        buffer: OffPolicyBuffer[T],
        batch_groups: int,
        parameter_sync_step: int,
        generate: Generate[T],
        push_weights: PushWeights,
        partial_rollout: bool = False,
        version: int = 0,
    ) -> None:
        if parameter_sync_step < 1:
            raise ValueError(f"parameter_sync_step must be at least 1, got {parameter_sync_step}")
        self.buffer = buffer
        self.batch_groups = batch_groups
        self.parameter_sync_step = parameter_sync_step
        self.generate = generate
        self.push_weights = push_weights
        self.partial_rollout = partial_rollout
        # A resumed run goes on from its checkpoint's version (the engine was given those weights).
        self.versions = Versions(version, version)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="rollout")
        self.running: tuple[Future[list[T]], int] | None = None
        # The rollout side's idle time: from a generation's end to the next one's start.
        self.generation_ended: float | None = None
        self.rollout_idle = 0.0

    def run(self, updates: int, train: Train[T]) -> Iterator[Metrics]:
        try:
            self._start_generation(self.versions.actor)
            for done in range(1, updates + 1):
                wait_start = time.perf_counter()
                while (taken := self.buffer.take(self.batch_groups, self.versions.actor)) is None:
                    self._collect()
                    self._start_generation(self.versions.actor)
                    if self.running is None and not self.buffer.ready(self.batch_groups, self.versions.actor):
                        raise RuntimeError("the schedule can neither generate nor train: staleness bound too tight")
                waited = time.perf_counter() - wait_start
                # Overlap: the next batch generates while this one trains (if the bound allows).
                self._start_generation(self.versions.actor + 1)
                update_start = time.perf_counter()
                # The buffer's per-group metrics, unless train reports finer ones (per sample).
                metrics = taken.metrics(self.versions.actor) | train(taken, self.versions.actor)
                metrics["timing_s/wait_rollout"] = waited  # the trainer idle, waiting for samples
                metrics["timing_s/update_overlapped"] = time.perf_counter() - update_start
                # The rollout idle (waiting for the trainer: the bound, or a batch already waiting)
                # since the previous row.
                metrics["timing_s/wait_trainer"], self.rollout_idle = self.rollout_idle, 0.0
                metrics[ROLLOUT_WEIGHT_VERSION] = float(self.versions.engine)
                self.versions.actor += 1
                yield metrics
                if done < updates:
                    self._push_into_generation()
                # Between rows the consumer may have quiesced the engine (validation); after the
                # last update nothing more is generated.
                if self.running is None and done < updates:
                    self._start_generation(self.versions.actor)
        finally:
            # A generation already running finishes before the engine can close; a queued one never starts.
            if self.running is not None and not self.running[0].cancel():
                self.running[0].exception()
            self.pool.shutdown(wait=True)

    def quiesce(self) -> None:
        """Between rows of `run`: let the generation in flight finish (its groups go to the
        buffer, trained as usual) and give the engine the actor's newest weights, so another
        caller (validation) may use the engine until `run` goes on."""
        self._collect()
        if self.versions.engine != self.versions.actor:
            self.push_weights()
            self.versions.engine = self.versions.actor

    def _push_into_generation(self) -> None:
        """Partial rollouts: a push that is due goes into the generation in flight (which
        `push_weights` interrupts) rather than waiting for it to end."""
        v = self.versions
        if self.partial_rollout and self.running is not None and v.actor - v.engine >= self.parameter_sync_step:
            self.push_weights()
            v.engine = v.actor

    def _collect(self) -> None:
        """Block until the generation in flight finishes; its groups go to the buffer."""
        if self.running is None:
            return
        future, version = self.running
        self.running = None
        self.buffer.put(future.result(), version)

    def _start_generation(self, earliest_train_version: int) -> None:
        """Start the next generation unless one runs, a batch already waits, or its samples
        would be too stale when trained (then it starts after the update)."""
        if self.running is not None or len(self.buffer) >= self.batch_groups:
            return
        v = self.versions
        behind = v.actor - v.engine
        if behind and (
            behind >= self.parameter_sync_step or not self.buffer.may_begin(v.engine, earliest_train_version)
        ):
            self.push_weights()  # no generation runs now: the engine is free
            v.engine = v.actor
        if not self.buffer.may_begin(v.engine, earliest_train_version):
            return
        self.buffer.begin(v.engine)
        if self.generation_ended is not None:
            self.rollout_idle += time.perf_counter() - self.generation_ended
            self.generation_ended = None
        self.running = (self.pool.submit(self._generate), v.engine)

    def _generate(self) -> list[T]:
        """On the worker thread; its end is read only after its future is collected."""
        try:
            return self.generate()
        finally:
            self.generation_ended = time.perf_counter()
