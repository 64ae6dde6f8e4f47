"""A step retrained after a resume appears once, with the resumed run's values: metrics.jsonl
drops the rows after the checkpoint, TensorBoard purges the events after it."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlkube_trainer.loop.tracking import Tracker

KEY = "critic/score/mean"


def _log(out: Path, steps: range, value: float, resumed_at: int | None = None) -> Tracker:
    tracker = Tracker(out, ["tensorboard"], "run", resumed_at=resumed_at)
    if resumed_at is not None:
        tracker.rewind(resumed_at)
    for step in steps:
        tracker.log(step, {KEY: value + step})
    tracker.close()
    return tracker


def test_a_resumed_run_replaces_the_retrained_steps(tmp_path: Path) -> None:
    _log(tmp_path, range(1, 5), 0.0)  # steps 1-4 logged, then a crash; the last checkpoint is step 2
    tracker = _log(tmp_path, range(3, 7), 10.0, resumed_at=2)
    rows = tracker.history()
    assert [(r["step"], r[KEY]) for r in rows] == [(1, 1), (2, 2), (3, 13), (4, 14), (5, 15), (6, 16)]
    events = EventAccumulator(str(tmp_path / "tensorboard" / "run"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars(KEY)] == [(1, 1), (2, 2), (3, 13), (4, 14), (5, 15), (6, 16)]
