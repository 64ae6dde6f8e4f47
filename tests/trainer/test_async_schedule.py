"""The one-step-off schedule's order of events, with plain functions for the two sides: each
generated group records the weight version the engine really held, so the buffer's tags, the
staleness bound, the weight pushes and the overlap are checked against what happened."""

from __future__ import annotations

import time

import pytest

from rlkube_trainer.loop.async_training.schedule import OneStepOff
from rlkube_trainer.loop.async_training.staleness import OffPolicyBuffer, Taken, span_of

SECONDS = 0.05  # each side's work


class Sides:
    def __init__(self) -> None:
        self.engine_weights = 0  # the actor version the "engine" holds
        self.actor = 0
        self.pushes: list[int] = []
        self.spans: list[int] = []

    def generate(self) -> list[int]:
        held = self.engine_weights
        time.sleep(SECONDS)
        assert self.engine_weights == held, "weights pushed during a generation"
        return [held, held]  # two groups, each naming the weights that made it

    def push(self) -> None:
        self.engine_weights = self.actor
        self.pushes.append(self.actor)

    def train(self, taken: Taken[int], version: int) -> dict[str, float]:
        assert version == self.actor
        for group in taken.groups:
            assert group.item == group.version  # tagged with the weights that really produced it
            self.spans.append(span_of(group.version, version))
        time.sleep(SECONDS)
        self.actor += 1
        return {}


def run(
    threshold: int | None, strategy: str, sync_step: int, updates: int = 10
) -> tuple[Sides, list[dict[str, float]], float]:
    sides = Sides()
    buffer: OffPolicyBuffer[int] = OffPolicyBuffer(threshold, strategy)  # type: ignore[arg-type]
    schedule = OneStepOff(buffer, 2, sync_step, sides.generate, sides.push)
    start = time.perf_counter()
    rows = list(schedule.run(updates, sides.train))
    return sides, rows, time.perf_counter() - start


@pytest.mark.parametrize("strategy", ["drop", "wait"])
def test_one_step_off_overlaps_generation_with_the_update_within_the_bound(strategy: str) -> None:
    sides, rows, seconds = run(threshold=2, strategy=strategy, sync_step=1)
    assert len(rows) == 10 and max(sides.spans) == 2  # one step off, never more
    assert sides.spans.count(2) >= 16  # after the first batch, every batch is one step off
    assert all(r["training/off_policy/evicted_samples"] == 0 for r in rows)
    # Sequential would be 10 generations + 10 updates; overlapped about 11 sides' work.
    assert seconds < 16 * SECONDS
    assert rows[-1]["training/off_policy/trajectory_staleness/max"] == 1.0
    assert rows[-1]["timing_s/wait_rollout"] < SECONDS


def test_a_threshold_of_one_is_on_policy_and_does_not_overlap() -> None:
    sides, _, seconds = run(threshold=1, strategy="drop", sync_step=1)
    assert set(sides.spans) == {1}
    assert seconds >= 20 * SECONDS


def test_weights_are_pushed_every_parameter_sync_step_updates() -> None:
    sides, _, _ = run(threshold=4, strategy="drop", sync_step=3, updates=12)
    assert sides.pushes == [3, 6, 9]
    assert max(sides.spans) <= 4 and max(sides.spans) >= 3


def test_the_bound_forces_an_early_push_when_parameter_sync_step_is_too_long() -> None:
    sides, _, _ = run(threshold=2, strategy="wait", sync_step=5, updates=8)
    assert max(sides.spans) <= 2
    assert len(sides.pushes) >= 4


def test_wait_trainer_is_the_rollout_idle_time() -> None:
    # Threshold 1 is the synchronous order: the rollout sits idle through every update.
    _, strict, _ = run(threshold=1, strategy="wait", sync_step=1, updates=6)
    assert all(r["timing_s/wait_trainer"] >= 0.8 * SECONDS for r in strict[1:])
    # One step off, generation is restarted as soon as a batch is taken: almost no idle time.
    _, overlapped, _ = run(threshold=2, strategy="wait", sync_step=1, updates=6)
    assert sum(r["timing_s/wait_trainer"] for r in overlapped) < 0.5 * sum(r["timing_s/wait_trainer"] for r in strict)


def test_quiesce_between_rows_frees_the_engine_with_the_newest_weights_and_loses_nothing() -> None:
    """Validation's way in: between two rows no generation may be running, the engine must hold
    the actor's weights, and the batch that was in flight is trained as usual afterwards."""
    sides = Sides()
    buffer: OffPolicyBuffer[int] = OffPolicyBuffer(2, "drop")
    schedule = OneStepOff(buffer, 2, 1, sides.generate, sides.push)
    generated: list[int] = []
    generate = sides.generate

    def counting() -> list[int]:
        groups = generate()
        generated.append(len(groups))
        return groups

    schedule.generate = counting
    rows = 0
    for _ in schedule.run(6, sides.train):
        rows += 1
        if rows in (2, 4):
            schedule.quiesce()
            assert schedule.running is None
            assert sides.engine_weights == sides.actor  # validation would see the newest weights
    assert rows == 6 and len(sides.spans) == 12  # six updates, two groups each
    # Every generated group was trained, except what the last update left in the buffer or in
    # flight; after the last update nothing new starts.
    assert sum(generated) - len(sides.spans) <= 2
    assert max(sides.spans) <= 2
