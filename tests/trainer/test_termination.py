"""SIGTERM while training (termination.py), in this process with the CLI's own handler: the
step in progress finishes and is saved, the exit is 128 + 15, and a resumed run continues at
the next step with the losses of an unbroken run; no step is trained twice. A SIGTERM during a
save lets that save finish and adds none; a kill in the middle of a save (here an error after
the ranks wrote) leaves the previous checkpoint the latest."""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.checkpoint.manager import CheckpointManager
from rlkube_trainer.loop.driver import run_in_process
from rlkube_trainer.loop.saves import GroupState
from rlkube_trainer.loop.termination import TERMINATION, Terminated, Termination
from rlkube_trainer.pod import cli
from rlkube_trainer.tiny.task import init
from rlkube_trainer.workers.rank import Rank

STEPS = 4
# The phases of a step on the actor's rank a SIGTERM can land in.
PHASES = ("generate", "compute_log_prob", "update_actor")
COMPARED = ("actor/pg_loss", "actor/grad_norm", "critic/score/mean")


@pytest.fixture
def sigterm_handler() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, cli._exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def config_in(workdir: Path, checkpoints: Path) -> Any:
    raw = yaml.safe_load(init(workdir, "grpo", steps=STEPS).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 4
    raw["actor"].update(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=8)
    raw["trainer"].update(save_freq=100, logger=["console"], test_freq=-1)
    raw["checkpoint"] = {**raw.get("checkpoint", {}), "dir": str(checkpoints)}
    return parse_trainer_config(raw)


def on(
    monkeypatch: pytest.MonkeyPatch, cls: type, method: str, when: Callable[[], bool], act: Callable[[], None]
) -> None:
    """`act` at the start of `cls.method` whenever `when()` says so."""
    original = getattr(cls, method)

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        if when():
            act()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, patched)


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class RecordedReports:
    """A progress reporter that keeps what it is given (the driver's pod annotation, in a pod)."""

    def __init__(self) -> None:
        self.reports: list[Mapping[str, Any]] = []

    @property
    def last(self) -> Mapping[str, Any]:
        return self.reports[-1]

    def report(self, progress: Mapping[str, Any], *, force: bool = False) -> None:
        self.reports.append(progress)

    def flush(self) -> None:
        pass


def rows(history: list[dict[str, float]]) -> dict[int, dict[str, float]]:
    return {int(row["step"]): row for row in history}


@pytest.mark.trainer
def test_sigterm_saves_the_step_in_progress_and_the_run_resumes_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigterm_handler: None
) -> None:
    unbroken = rows(run_in_process(config_in(tmp_path / "task", tmp_path / "unbroken"), progress=False).history)
    config = config_in(tmp_path / "task", tmp_path / "ckpt")
    checkpoints = CheckpointManager(tmp_path / "ckpt", max_to_keep=3)
    updates: list[int] = []
    on(monkeypatch, Rank, "update_actor", lambda: True, lambda: updates.append(1))

    # 1. SIGTERM in a random phase of step 2: step 2 finishes, is saved, the run exits 143.
    phase = random.choice(PHASES)
    calls = {name: 0 for name in PHASES}

    def second_step(name: str) -> Callable[[], bool]:
        def when() -> bool:
            calls[name] += 1
            return calls[name] == 2  # each phase runs once per step on the one rank

        return when

    on(monkeypatch, Rank, phase, second_step(phase), sigterm)
    reports = RecordedReports()
    with pytest.raises(Terminated) as stopped:
        run_in_process(config, progress=False, reporter=reports)
    assert stopped.value.code == 128 + signal.SIGTERM, phase
    assert "at step 2" in stopped.value.message, (phase, stopped.value.message)
    assert checkpoints.latest() is not None and checkpoints.latest().step == 2, phase  # type: ignore[union-attr]
    # The last progress report (the status's) names the save on SIGTERM, not a periodic one.
    assert (reports.last["step"], reports.last.get("lastCheckpointStep")) == (2, 2), reports.last
    assert len(updates) == 2, phase
    assert not TERMINATION.armed and TERMINATION.requested  # disarmed after the loop
    monkeypatch.undo()
    on(monkeypatch, Rank, "update_actor", lambda: True, lambda: updates.append(1))

    # 2. Resumed at step 3; SIGTERM during step 3's save (save_freq 1): that save finishes,
    # no second one, the exit is 143.
    every_step = config.model_copy(update={"trainer": config.trainer.model_copy(update={"save_freq": 1})})
    saves: list[int] = []
    on(monkeypatch, GroupState, "save", lambda: not saves.append(1), sigterm)
    with pytest.raises(Terminated) as stopped:
        run_in_process(every_step, progress=False)
    assert "at step 3" in stopped.value.message
    assert (len(saves), len(updates)) == (1, 3)
    assert [c.step for c in checkpoints.checkpoints()] == [2, 3]
    monkeypatch.undo()
    on(monkeypatch, Rank, "update_actor", lambda: True, lambda: updates.append(1))

    # 3. Resumed at step 4; killed in the middle of its save (the ranks wrote, the step's row
    # is logged, the driver did not commit): step 3 stays the latest, step 4's files only in a
    # staging dir.
    class Killed(BaseException):
        pass

    def commit_then_die(self: CheckpointManager, *args: Any, **kwargs: Any) -> Any:
        raise Killed

    monkeypatch.setattr(CheckpointManager, "commit", commit_then_die)
    history: list[dict[str, float]] = []
    with pytest.raises(Killed):
        try:
            run_in_process(config, progress=False)
        finally:
            history = [row for row in map(_row, (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines())]
    assert checkpoints.latest().step == 3  # type: ignore[union-attr]
    assert (tmp_path / "ckpt" / ".tmp-step_000004" / "actor" / "rank_0.pt").is_file()
    assert len(updates) == STEPS  # no step trained twice
    resumed = rows(history)
    assert sorted(resumed) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in COMPARED:
            assert resumed[step][key] == pytest.approx(unbroken[step][key], rel=1e-4, abs=1e-6), (phase, step, key)


def _row(line: str) -> dict[str, float]:
    import json  # noqa: PLC0415

    return dict(json.loads(line))


def test_sigterm_is_a_request_only_while_armed_and_worth_waiting() -> None:
    termination = Termination()
    assert not termination.take(signal.SIGTERM)  # before the loop: exit at once
    with termination.arm(worth_waiting=lambda: False):  # a role pod whose driver is gone
        assert not termination.take(signal.SIGTERM)
    with termination.arm():
        assert termination.take(signal.SIGTERM) and termination.requested
    assert not termination.armed


def test_the_cli_handler_exits_unless_the_loop_takes_the_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TERMINATION, "armed", False)
    with pytest.raises(SystemExit) as exited:
        cli._exit_on_sigterm(signal.SIGTERM, None)
    assert exited.value.code == 128 + signal.SIGTERM
    with TERMINATION.arm():
        cli._exit_on_sigterm(signal.SIGTERM, None)  # returns: the loop stops at its next safe point
        assert TERMINATION.requested


def test_a_role_pod_told_to_stop_ends_once_its_head_has_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node's `ray start --block` (here a sleep) is stopped as soon as the head stops
    answering after a SIGTERM, not after Ray's 60 s GCS reconnect timeout."""
    import socket  # noqa: PLC0415
    import time  # noqa: PLC0415

    from rlkube_api.names import Env  # noqa: PLC0415
    from rlkube_trainer.pod import ray_node  # noqa: PLC0415

    listener = socket.create_server(("127.0.0.1", 0))
    monkeypatch.setenv(Env.RAY_ADDRESS, f"127.0.0.1:{listener.getsockname()[1]}")
    with TERMINATION.arm(ray_node.head_reachable):
        assert TERMINATION.take(signal.SIGTERM)  # the head answers: the pod stays for its driver
        started = time.monotonic()
        listener.close()  # the driver saved and ended
        code = ray_node._serve(["sleep", "60"])
    assert code == 128 + signal.SIGTERM
    assert time.monotonic() - started < 10


def test_a_node_not_told_to_stop_serves_until_its_command_ends() -> None:
    from rlkube_trainer.pod import ray_node  # noqa: PLC0415

    with TERMINATION.arm():  # armed, with no signal taken
        assert ray_node._serve(["sh", "-c", "sleep 1.5; exit 3"]) == 3
