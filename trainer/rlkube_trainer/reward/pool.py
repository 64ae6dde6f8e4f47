"""A pool of worker processes calling a reward function, one row at a time, results in row order.

A reward function is user code that may be slow (a verifier running tests), hang or crash the
interpreter. Each worker imports the function once, when it starts, then serves calls over its
own pipes; the driver sends it the next row when it answers. Because the driver knows which row
each worker holds, a call that runs past reward.timeoutSeconds or a process that dies is pinned
to its row: the worker is killed (or found dead) and replaced, and the row gets a CallFailed.

A worker is a fresh interpreter running this module (`python -m rlkube_trainer.reward.pool`),
not a fork: the driver runs threads (Ray, the asynchronous schedule's generation thread) that a
fork would copy mid-operation, and multiprocessing's spawn would import the driver's own main
module (torch and all) in every worker. A worker imports this package's torch-free modules and
the user's file, nothing else. Its stdout and stderr are the driver's: a function's prints go to
the driver's log.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from rlkube_trainer.reward.function import Call, CallFailed, FunctionSource, RewardFunctionError

# How long a worker asked to stop may take before it is killed.
_STOP_GRACE_SECONDS = 2.0
# How often the driver looks at its workers' processes even when no pipe speaks: a worker whose
# function started processes of its own that hold its pipe open does not close the pipe by dying.
_LIVENESS_SECONDS = 1.0
_READY, _LOAD_FAILED = "ready", "load failed"


def _serve(requests: Connection, answers: Connection) -> None:
    """A worker process: imports the function once, then calls it on each row it is sent."""
    source: FunctionSource = requests.recv()
    try:
        function = source.load()
    except Exception as err:
        why = str(err) if isinstance(err, RewardFunctionError) else f"{type(err).__name__}: {err}"
        answers.send((_LOAD_FAILED, why))
        return
    answers.send((_READY, None))
    while True:
        try:
            message = requests.recv()
        except EOFError:  # the driver is gone
            return
        if message is None:
            return
        index, call = message
        try:
            result = function(**call)
        except Exception as err:
            answers.send((index, CallFailed(f"raised {type(err).__name__}: {err}")))
            continue
        try:
            answers.send((index, result))  # pickled whole before anything is written
        except Exception as err:
            answers.send((index, CallFailed(f"returned a {type(result).__name__} that cannot be pickled: {err}")))


class _Worker:
    def __init__(self, source: FunctionSource) -> None:
        to_worker, requests = os.pipe()[::-1]
        answers_read, answers = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(requests), str(answers)],
            pass_fds=(requests, answers),
            stdin=subprocess.DEVNULL,
        )
        os.close(requests)
        os.close(answers)
        self.requests = Connection(to_worker, readable=False)
        self.answers = Connection(answers_read, writable=False)
        self.requests.send(source)
        self.ready = False
        self.row: int | None = None
        self.deadline = math.inf

    def send(self, row: int, call: Call, timeout: float | None) -> None:
        self.row = row
        self.deadline = math.inf if timeout is None else time.monotonic() + timeout
        self.requests.send((row, call))

    def done(self) -> None:
        self.row, self.deadline = None, math.inf

    def alive(self) -> bool:
        return self.process.poll() is None

    def ask_to_stop(self) -> None:
        with contextlib.suppress(OSError):  # already gone
            self.requests.send(None)

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        try:
            self.process.wait(_STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.requests.close()
        self.answers.close()


class RewardPool:
    """`num_workers` processes calling the function of `source`; started at the first call and
    kept across steps. `timeout_seconds` bounds each call (None: no bound). One batch at a time:
    the driver scores from one thread at a time (the schedule quiesces before validation)."""

    def __init__(self, source: FunctionSource, num_workers: int, timeout_seconds: float | None = None) -> None:
        if num_workers < 1:
            raise ValueError(f"a reward pool needs at least one worker, not {num_workers}")
        self.source = source
        self.num_workers = num_workers
        self.timeout_seconds = timeout_seconds
        self.workers: list[_Worker] = []
        atexit.register(self.close)

    def __call__(self, calls: Sequence[Call], stop_on_failure: bool) -> list[Any]:
        """Each call's result or CallFailed, in row order. With stop_on_failure the first
        failure ends the batch: the rows still running are abandoned (their workers replaced)
        and the rows not reached are None."""
        if not self.workers:
            self.workers = [_Worker(self.source) for _ in range(self.num_workers)]
        results: list[Any] = [None] * len(calls)
        sent = finished = 0
        while finished < len(calls):
            for worker in self.workers:
                if worker.ready and worker.row is None and sent < len(calls):
                    worker.send(sent, calls[sent], self.timeout_seconds)
                    sent += 1
            waiting = [w for w in self.workers if w.row is not None or not w.ready]
            deadline = min((w.deadline for w in waiting), default=math.inf)
            wait_for = None if deadline == math.inf else max(0.0, deadline - time.monotonic())
            wait(
                [w.answers for w in waiting],
                _LIVENESS_SECONDS if wait_for is None else min(wait_for, _LIVENESS_SECONDS),
            )
            for i, worker in enumerate(self.workers):
                row, result, replace = self._outcome(worker)
                if replace:
                    self.workers[i] = _Worker(self.source)
                if row is None:
                    continue
                results[row], finished = result, finished + 1
                if isinstance(result, CallFailed) and stop_on_failure:
                    self.close()
                    return results
        return results

    def _outcome(self, worker: _Worker) -> tuple[int | None, Any, bool]:
        """The row a worker finished now and its result, if any, and whether the worker was
        stopped and needs replacing."""
        gone = False
        if worker.answers.poll():
            try:
                tag, value = worker.answers.recv()
            except (EOFError, OSError):  # its end of the pipe closed: the process is exiting
                tag, value, gone = None, None, True
            if tag == _READY:
                worker.ready = True
                return None, None, False
            if tag == _LOAD_FAILED:
                self.close()
                raise RewardFunctionError(f"a reward worker process could not load the function: {value}")
            if isinstance(tag, int):
                worker.done()
                return tag, value, False
        if gone or not worker.alive():
            worker.stop()
            code = worker.process.returncode
            if worker.row is None:
                self.close()
                raise RewardFunctionError(f"a reward worker process exited with code {code} while loading the function")
            return worker.row, CallFailed(f"crashed its worker process (exit code {code})"), True
        if worker.row is not None and time.monotonic() >= worker.deadline:
            row = worker.row
            worker.stop(kill=True)
            return row, CallFailed(f"timed out after {self.timeout_seconds:g} s (reward.timeoutSeconds)"), True
        return None, None, False

    def close(self) -> None:
        """Stops the workers; a later call starts new ones."""
        workers, self.workers = self.workers, []
        for worker in workers:
            if worker.row is None:
                worker.ask_to_stop()
        for worker in workers:
            worker.stop(kill=worker.row is not None)


if __name__ == "__main__":
    # Ctrl-C reaches the whole process group; the driver stops its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The pipes' ends this worker was given; not passed on to processes the function may start.
    for fd in map(int, sys.argv[1:3]):
        os.set_inheritable(fd, False)
    _serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
