"""checkpoint.async_save: a save holds the step only while the ranks copy their state into host
memory; the files are written on a thread while training goes on, and the checkpoint becomes the
one a resume takes only once every rank's files are written (and its step's row is logged).

Each rank's write is held here until a chosen later update has run, so the tests see the write
overlap training: the saved weights are still those of the save's step, the checkpoint is not the
latest while written, at most one write is in flight, and a failure, an error, a kill or a SIGTERM
while a write is in flight never leaves a half checkpoint that a resume would take."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rlkube_api.config import TrainerConfig
from rlkube_trainer.checkpoint import state
from rlkube_trainer.checkpoint.folder import COMPLETE, CheckpointError
from rlkube_trainer.checkpoint.manager import CheckpointManager
from rlkube_trainer.checkpoint.state import BackgroundSave, load_torch, stage_rank_state
from rlkube_trainer.loop.driver import run_in_process
from rlkube_trainer.loop.termination import Terminated
from rlkube_trainer.pod import cli
from rlkube_trainer.workers.rank import Rank
from tests.trainer.test_termination import COMPARED, config_in, on, rows

STEPS = 4


def async_config(config: TrainerConfig, save_freq: int = 1, **checkpoint: Any) -> TrainerConfig:
    return config.model_copy(
        update={
            "trainer": config.trainer.model_copy(update={"save_freq": save_freq}),
            "checkpoint": config.checkpoint.model_copy(update={"max_to_keep": STEPS, **checkpoint}),
        }
    )


def model_of(checkpoint: Path) -> dict[str, torch.Tensor]:
    return dict(load_torch(checkpoint / "actor" / "rank_0.pt")["state"]["model"])


def history_of(root: Path) -> dict[int, dict[str, float]]:
    return rows([json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()])


def nth_call(n: int) -> Callable[[], bool]:
    """A `when` for `on`: True at the n-th call only."""
    calls: list[int] = []

    def when() -> bool:
        calls.append(1)
        return len(calls) == n

    return when


class HeldWrites:
    """Each rank's background write waits (in its thread, before its first file) until
    `release(n)` was called for its save's number n (the first background save is 1): the test
    decides when it may go on. Blocking saves (on the training thread) are not held."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started: list[BackgroundSave] = []
        # A write's thread (the object: a finished thread's ident is reused): its save's number.
        self.number_of: dict[threading.Thread, int] = {}
        self.released: set[int] = set()
        self.changed = threading.Condition()
        self.writing = 0
        self.most_at_once = 0
        original_save, original_stage, original_run = state.save_torch, state.stage_rank_state, BackgroundSave._run

        def save_torch(path: Any, obj: Any) -> None:
            me = threading.current_thread()
            if me.name == "rlkube-checkpoint-write":
                with self.changed:
                    assert self.changed.wait_for(lambda: self.number_of.get(me) in self.released, timeout=60)
            original_save(path, obj)

        def stage(*args: Any) -> BackgroundSave:
            background = original_stage(*args)
            with self.changed:
                self.started.append(background)
                self.number_of[background._thread] = len(self.started)
                self.changed.notify_all()
            return background

        def run(background: BackgroundSave, write: Callable[[], Any]) -> None:
            with self.changed:
                self.writing += 1
                self.most_at_once = max(self.most_at_once, self.writing)
            try:
                original_run(background, write)
            finally:
                with self.changed:
                    self.writing -= 1

        monkeypatch.setattr(state, "save_torch", save_torch)
        # rank.py imported the name: the rank's own reference is the one to wrap.
        monkeypatch.setattr("rlkube_trainer.workers.rank.stage_rank_state", stage)
        monkeypatch.setattr(BackgroundSave, "_run", run)

    def release(self, *numbers: int) -> None:
        with self.changed:
            self.released.update(numbers)
            self.changed.notify_all()

    def join(self) -> None:
        self.release(*range(1, len(self.started) + 1))
        for background in self.started:
            background._thread.join()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldWrites]:
    writes = HeldWrites(monkeypatch)
    try:
        yield writes
    finally:
        writes.join()


def test_the_host_copy_is_taken_before_the_next_update_changes_the_weights(tmp_path: Path) -> None:
    """A rank's state staged for the background write, then an optimizer step before the
    thread writes: the file holds the weights at the save, not the later ones."""

    class Linear:
        sharded = False

        def __init__(self) -> None:
            self.model = nn.Linear(4, 4)
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.1)

        def state_dict(self) -> dict[str, Any]:
            return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

        def update(self) -> None:
            self.model(torch.ones(2, 4)).sum().backward()
            self.optimizer.step()

    part = Linear()
    part.update()
    at_save = {name: t.clone() for name, t in part.model.state_dict().items()}
    gate = threading.Event()
    original = state.save_torch

    def after_the_update(path: Any, obj: Any) -> None:
        assert gate.wait(30)
        original(path, obj)

    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(state, "save_torch", after_the_update)
        background = stage_rank_state(staging, {"actor": part}, 0)  # type: ignore[dict-item]
        assert background.result(wait=False) is None  # still writing
        part.update()  # the next step, while the write waits
        gate.set()
        done = background.result(wait=True)
    assert done is not None and sorted(done.files) == ["actor/rank_0.pt"]
    saved = load_torch(staging / "actor" / "rank_0.pt")["state"]
    for name, tensor in at_save.items():
        assert torch.equal(saved["model"][name], tensor), name
        assert not torch.equal(part.model.state_dict()[name], tensor), name  # the update did change it
    assert saved["optimizer"]["state"][0]["step"] == 1  # AdamW's count at the save, not 2


def test_a_rank_refuses_a_second_background_save_until_the_first_is_finished(tmp_path: Path, held: HeldWrites) -> None:
    rank = Rank.__new__(Rank)  # only the checkpoint methods: no model to load
    rank.background_save = None
    rank._trainables = dict  # type: ignore[method-assign]
    rank._checkpoint_path = Path  # type: ignore[method-assign]
    rank.spec = type("Spec", (), {"rank": 0})()  # type: ignore[assignment]
    rank.save_in_background(str(tmp_path))
    with pytest.raises(RuntimeError, match="still being written"):
        rank.save_in_background(str(tmp_path))
    held.release(1)
    assert rank.finish_save(wait=True) is not None
    assert rank.finish_save(wait=True) is None  # reported once
    rank.save_in_background(str(tmp_path))  # then the next one may start


@pytest.mark.trainer
def test_async_saves_overlap_training_and_hold_the_weights_of_their_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: HeldWrites
) -> None:
    """Every step saved (save_freq 1); save n's write goes on only once update n + 1 has run.
    The checkpoints equal a blocking run's, each committed only once written, one write at a
    time, and the two parts of a save timed apart."""
    blocking = async_config(config_in(tmp_path / "task", tmp_path / "blocking"))
    run_in_process(blocking, progress=False)
    config = async_config(config_in(tmp_path / "task", tmp_path / "ckpt"), async_save=True)
    checkpoints = CheckpointManager(tmp_path / "ckpt", max_to_keep=STEPS)
    latest_at_update: list[int | None] = []

    def next_update() -> None:
        latest = checkpoints.latest()
        latest_at_update.append(latest.step if latest else None)
        held.release(len(latest_at_update) - 1)  # the previous step's save may now be written

    held.release(STEPS)  # the last save: nothing trains after it
    on(monkeypatch, Rank, "update_actor", lambda: True, next_update)
    result = run_in_process(config, progress=False)

    # Update n + 1 ran while save n was still held: the latest was then save n - 1.
    assert latest_at_update == [None, None, 1, 2]
    assert held.most_at_once == 1
    assert [c.step for c in checkpoints.checkpoints()] == [1, 2, 3, 4]
    assert result.last_checkpoint == tmp_path / "ckpt" / "step_000004"
    for step in range(1, STEPS + 1):
        name = f"step_{step:06d}"
        ours, theirs = model_of(tmp_path / "ckpt" / name), model_of(tmp_path / "blocking" / name)
        for key, tensor in theirs.items():
            torch.testing.assert_close(
                ours[key], tensor, rtol=1e-4, atol=1e-6, msg=lambda m, s=step, k=key: f"{s} {k}: {m}"
            )
    first, second = model_of(tmp_path / "ckpt" / "step_000001"), model_of(tmp_path / "ckpt" / "step_000002")
    assert any(not torch.equal(first[key], second[key]) for key in first)  # the steps' weights differ
    history = history_of(tmp_path / "ckpt")
    assert all("timing_s/save_checkpoint" in history[step] for step in range(1, STEPS + 1))
    # Save n's write is found done at a later step's end, or by save n + 1 waiting for it; the
    # last one at its own step (the run's end waits).
    found = {step for step, row in history.items() if "timing_s/save_checkpoint_background" in row}
    assert STEPS in found and found <= {2, 3, 4}, found
    assert all(history[step]["timing_s/save_checkpoint_background"] > 0 for step in found)
    assert "timing_s/save_checkpoint_background" not in history_of(tmp_path / "blocking")[STEPS]


@pytest.mark.trainer
def test_a_failed_background_write_is_the_runs_error_and_never_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = async_config(config_in(tmp_path / "task", tmp_path / "ckpt"), save_freq=2, async_save=True)
    original = state.save_torch

    def full_disk(path: Any, obj: Any) -> None:
        if "step_000002" in str(path):
            raise OSError(28, "No space left on device")
        original(path, obj)

    monkeypatch.setattr(state, "save_torch", full_disk)
    with pytest.raises(CheckpointError, match=r"background checkpoint write failed: .*No space left"):
        run_in_process(config, progress=False)
    assert CheckpointManager(tmp_path / "ckpt", max_to_keep=STEPS).latest() is None
    assert not list((tmp_path / "ckpt").glob(f"*/{COMPLETE}"))


@pytest.mark.trainer
def test_a_kill_during_a_background_write_resumes_from_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: HeldWrites
) -> None:
    """Killed (here an exception no handler takes, like a SIGKILL's end) in step 4 while step
    3's write is held: step 2 stays the latest, the resumed run trains steps 3 and 4 again, and
    each step has one row, with the losses of an unbroken run."""
    unbroken = rows(run_in_process(config_in(tmp_path / "task", tmp_path / "unbroken"), progress=False).history)
    config = async_config(config_in(tmp_path / "task", tmp_path / "ckpt"), async_save=True)
    held.release(1, 2)

    class Killed(BaseException):
        pass

    def kill() -> None:
        raise Killed

    on(monkeypatch, Rank, "update_actor", nth_call(4), kill)
    with pytest.raises(Killed):
        run_in_process(config, progress=False)
    checkpoints = CheckpointManager(tmp_path / "ckpt", max_to_keep=STEPS)
    assert checkpoints.latest().step == 2  # type: ignore[union-attr]
    staging = tmp_path / "ckpt" / ".tmp-step_000003"
    assert staging.is_dir() and not (staging / COMPLETE).exists()
    held.join()  # the abandoned write ends (a killed process's thread would die with it)
    assert checkpoints.latest().step == 2  # type: ignore[union-attr]  # written, never committed
    monkeypatch.undo()

    run_in_process(config, progress=False)
    assert checkpoints.latest().step == STEPS  # type: ignore[union-attr]
    resumed = history_of(tmp_path / "ckpt")
    assert sorted(resumed) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in COMPARED:
            assert resumed[step][key] == pytest.approx(unbroken[step][key], rel=1e-4, abs=1e-6), (step, key)


@pytest.mark.trainer
def test_an_error_commits_the_write_in_flight_of_an_earlier_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: HeldWrites
) -> None:
    """An error in step 3 while step 2's write is held: the run waits for it, commits it, and
    raises its own error."""
    config = async_config(config_in(tmp_path / "task", tmp_path / "ckpt"), save_freq=2, async_save=True)

    def fail() -> None:
        held.release(1)  # the write goes on only once the step has begun failing
        raise RuntimeError("the update failed")

    on(monkeypatch, Rank, "update_actor", nth_call(3), fail)
    with pytest.raises(RuntimeError, match="the update failed"):
        run_in_process(config, progress=False)
    assert CheckpointManager(tmp_path / "ckpt", max_to_keep=STEPS).latest().step == 2  # type: ignore[union-attr]


@pytest.fixture
def sigterm_handler() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, cli._exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.trainer
def test_sigterm_waits_for_the_write_in_flight_then_saves_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: HeldWrites, sigterm_handler: None
) -> None:
    """SIGTERM in step 3 while step 2's write is held: step 2 is committed once written, then
    step 3 saved, and the exit is 143 naming step 3's checkpoint."""
    config = async_config(config_in(tmp_path / "task", tmp_path / "ckpt"), save_freq=2, async_save=True)

    def sigterm() -> None:
        held.release(1, 2)
        os.kill(os.getpid(), signal.SIGTERM)

    on(monkeypatch, Rank, "update_actor", nth_call(3), sigterm)
    with pytest.raises(Terminated) as stopped:
        run_in_process(config, progress=False)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert "at step 3 (checkpoint" in stopped.value.message and "step_000003" in stopped.value.message
    assert [c.step for c in CheckpointManager(tmp_path / "ckpt", max_to_keep=STEPS).checkpoints()] == [2, 3]
