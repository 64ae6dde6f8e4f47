"""A rank's own error reaches the driver whole: over a real (local) Ray, each kind of call a
rank fails in raises RankLost naming the call, the error's type and message and the end of
the rank's traceback, and the exit record says it within the size the job's status keeps."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from rlkube_api.exit_codes import TERMINATION_MESSAGE_LIMIT, ExitCode
from rlkube_api.placement import Role
from rlkube_trainer.checkpoint.volume import StorageFull
from rlkube_trainer.cluster.rank_group import RankLost
from rlkube_trainer.cluster.ray_group import TRACEBACK_LINES, RayRankGroup
from rlkube_trainer.pod.failures import exit_code_of, failure_message

ray = pytest.importorskip("ray")

# The most of a termination message the operator puts into a condition (observed.MESSAGE_TAIL).
STATUS_TAIL = 1024

# (the rank's method the driver calls, what fails in it, the error's type, its message)
CASES = [
    ("generate", "vllm", "RuntimeError", "EngineDeadError: the engine core died (CUDA error: illegal memory access)"),
    ("generate", "tool", "RuntimeError", "tool python_sandbox: the sandbox answered HTTP 500"),
    ("update_actor", "", "FloatingPointError", "loss is nan at micro batch 3"),
    ("score", "", "KeyError", "'ground_truth'"),
    ("save", "", "StorageFull", "no space left on the volume mounted at /ckpt writing /ckpt/.tmp-step_000040/a.pt"),
    ("finish_save", "", "StorageFull", "disk quota exceeded on the volume mounted at /ckpt writing /ckpt/b.pt"),
]


def _raise(kind: str, message: str, depth: int) -> None:
    """Fails `depth` frames down: more frames than the traceback's end that is kept."""
    if depth:
        _raise(kind, message, depth - 1)
        return
    errors: dict[str, type[Exception]] = {
        "RuntimeError": RuntimeError,
        "FloatingPointError": FloatingPointError,
        "KeyError": KeyError,
    }
    if kind == "StorageFull":
        raise StorageFull(message, "/ckpt", message.rsplit(" ", 1)[-1])
    raise errors[kind](message.strip("'"))


class FailingRank:
    """The calls of workers/rank.Rank the driver makes, each failing with the case's error."""

    def _fail(self, method: str, what: str) -> None:
        _, _, kind, message = next(c for c in CASES if c[:2] == (method, what))
        _raise(kind, message, 30)

    def generate(self, what: str) -> None:
        self._fail("generate", what)

    def update_actor(self, what: str) -> None:
        self._fail("update_actor", what)

    def score(self, what: str) -> None:
        self._fail("score", what)

    def save(self, what: str) -> None:
        self._fail("save", what)

    def finish_save(self, what: str) -> None:
        self._fail("finish_save", what)

    def die(self) -> None:
        os._exit(3)

    def huge(self) -> None:
        raise RuntimeError("x" * 20_000 + " the end of a very long message")


@pytest.fixture(scope="module")
def rank() -> Iterator[Any]:
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    # The actor's class travels by value: the Ray worker does not import the tests.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield ray.remote(FailingRank).options(num_cpus=0).remote()
    finally:
        ray.shutdown()


def _lost(rank: Any, method: str, *args: Any) -> RankLost:
    group = RayRankGroup(Role.ACTOR, [rank], timeout=60.0)
    with pytest.raises(RankLost) as caught:
        group.call(0, method, *args)
    return caught.value


@pytest.mark.parametrize(("method", "what", "kind", "message"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_ranks_error_reaches_the_exit_record_with_its_type_message_and_traceback(
    rank: Any, method: str, what: str, kind: str, message: str
) -> None:
    lost = _lost(rank, method, what)
    said = str(lost)
    assert said.startswith(f"role actor rank 0 failed: {method}() raised {kind}: {message}\n")
    # The end of the rank's traceback (its last lines: its frames, then the error once more).
    assert re.search(r", in _raise\n\s+raise (StorageFull|errors\[kind\])\(", said)
    assert len(said.splitlines()) <= 1 + TRACEBACK_LINES
    assert said.endswith(message)
    code = exit_code_of(lost)
    assert code is (ExitCode.STORAGE_FULL if kind == "StorageFull" else ExitCode.RANK_LOST)
    record = f"exit code {int(code)} ({code.name}): {failure_message(lost, code)}"
    assert len(record.encode()) <= TERMINATION_MESSAGE_LIMIT
    assert message in record[-STATUS_TAIL:]


def test_a_huge_error_is_cut_in_the_middle_keeping_both_ends(rank: Any) -> None:
    said = str(_lost(rank, "huge"))
    assert len(said.encode()) < TERMINATION_MESSAGE_LIMIT
    assert said.startswith("role actor rank 0 failed: huge() raised RuntimeError: xxx")
    assert said.endswith("the end of a very long message")


def test_a_rank_whose_process_died_is_a_lost_rank_with_rays_words(rank: Any) -> None:
    dying = ray.remote(FailingRank).options(num_cpus=0).remote()
    lost = _lost(dying, "die")
    assert str(lost).startswith("role actor rank 0 failed: die(): ")
    assert "died" in str(lost)
    assert exit_code_of(lost) is ExitCode.RANK_LOST
