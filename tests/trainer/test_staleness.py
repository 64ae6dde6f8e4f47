"""The off-policy buffer's staleness bound (verl 0.9.1 trainer.v1.sampler), hand-worked."""

from __future__ import annotations

import random

import pytest

from rlkube_trainer.loop.async_training.staleness import OffPolicyBuffer, span_of


def test_span_is_verls_global_steps_minus_prompt_steps_plus_one() -> None:
    assert span_of(version=3, current_version=3) == 1  # on-policy
    assert span_of(version=2, current_version=3) == 2  # one step off


def test_drop_discards_groups_over_the_threshold_and_counts_them() -> None:
    buffer: OffPolicyBuffer[str] = OffPolicyBuffer(threshold=2, strategy="drop")
    buffer.put(["a", "b"], version=0)
    buffer.put(["c", "d"], version=1)
    taken = buffer.take(2, current_version=2)
    assert taken is not None
    # span(v0 at 2) = 3 > 2: dropped; span(v1 at 2) = 2: kept.
    assert [g.item for g in taken.groups] == ["c", "d"]
    assert [g.item for g in taken.dropped] == ["a", "b"]
    metrics = taken.metrics(current_version=2)
    assert metrics["training/off_policy/evicted_samples"] == 2.0
    assert metrics["training/off_policy/evicted_samples_staleness/mean"] == 3.0
    assert metrics["training/off_policy/trajectory_staleness/max"] == 1.0
    assert metrics["training/off_policy/trajectory_spans/max"] == 1.0
    assert len(buffer) == 0


def test_drop_refuses_a_short_batch_and_reports_its_drops_with_the_next_one() -> None:
    buffer: OffPolicyBuffer[str] = OffPolicyBuffer(threshold=1, strategy="drop")
    buffer.put(["old"], version=0)
    buffer.put(["new"], version=1)
    assert buffer.take(2, current_version=1) is None  # one fresh group, two wanted
    buffer.put(["newer"], version=1)
    taken = buffer.take(2, current_version=1)
    assert taken is not None
    assert [g.item for g in taken.groups] == ["new", "newer"]
    assert [g.item for g in taken.dropped] == ["old"]


def test_wait_refuses_while_a_generation_in_flight_would_pass_the_bound_then_trains_it() -> None:
    buffer: OffPolicyBuffer[str] = OffPolicyBuffer(threshold=2, strategy="wait")
    buffer.begin(version=0)  # a slow generation with the initial weights
    buffer.put(["x", "y"], version=1)
    # Handing out x, y moves the actor to 2, where the in-flight v0 generation would span 3 > 2.
    assert not buffer.ready(2, current_version=1)
    assert buffer.take(2, current_version=1) is None
    buffer.put(["a", "b"], version=0)
    taken = buffer.take(2, current_version=1)
    assert taken is not None
    # Dropless, oldest first: the v0 groups are trained (span 2), nothing is discarded.
    assert [g.item for g in taken.groups] == ["a", "b"]
    assert taken.dropped == []
    assert taken.metrics(current_version=1)["training/off_policy/evicted_samples"] == 0.0


def test_wait_hands_out_when_everything_left_stays_within_the_bound() -> None:
    buffer: OffPolicyBuffer[str] = OffPolicyBuffer(threshold=2, strategy="wait")
    buffer.put(["a"], version=0)
    buffer.begin(version=1)
    # After this batch the actor is at 2; the v1 generation then spans 2 <= 2.
    taken = buffer.take(1, current_version=1)
    assert taken is not None and [g.item for g in taken.groups] == ["a"]


def test_no_threshold_disables_version_control() -> None:
    buffer: OffPolicyBuffer[int] = OffPolicyBuffer(threshold=None, strategy="drop")
    buffer.put([1], version=0)
    taken = buffer.take(1, current_version=100)
    assert taken is not None and taken.dropped == []


@pytest.mark.parametrize(("threshold", "strategy"), [(0, "drop"), (2, "keep")])
def test_invalid_settings_are_refused_naming_the_field(threshold: int, strategy: str) -> None:
    with pytest.raises(ValueError, match="max_off_policy"):
        OffPolicyBuffer(threshold=threshold, strategy=strategy)  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", ["drop", "wait"])
@pytest.mark.parametrize("threshold", [1, 2, 3])
def test_the_bound_holds_under_random_interleavings(strategy: str, threshold: int) -> None:
    """A producer running generations ahead (under `wait` up to `threshold`, the dropless
    schedule's limit; under `drop` further, so some groups go stale), finishing them in random
    order: every batch trained spans at most `threshold` versions, and `wait` never discards."""
    rng = random.Random(threshold * 7 + len(strategy))
    n = 2
    buffer: OffPolicyBuffer[int] = OffPolicyBuffer(threshold=threshold, strategy=strategy)  # type: ignore[arg-type]
    lead = threshold if strategy == "wait" else threshold + 2
    version, produced, trained, dropped, in_flight = 0, 0, 0, 0, []
    for _ in range(2000):
        choice = rng.random()
        if choice < 0.35 and len(in_flight) + len(buffer) // n < lead:
            buffer.begin(version)
            in_flight.append(version)
        elif choice < 0.7 and in_flight:
            started = in_flight.pop(rng.randrange(len(in_flight)))
            buffer.put([produced, produced + 1], started)
            produced += 2
        else:
            taken = buffer.take(n, version)
            if taken is None:
                continue
            assert max(span_of(g.version, version) for g in taken.groups) <= threshold
            trained += len(taken.groups)
            dropped += len(taken.dropped)
            version += 1
    assert version > 100  # the schedule made progress: neither strategy deadlocks
    if strategy == "wait":
        assert dropped == 0
    else:
        assert dropped > 0  # the interleavings did produce too-stale groups to drop
    assert trained + dropped + len(buffer) == produced
