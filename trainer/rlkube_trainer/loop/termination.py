"""SIGTERM while training: a request to stop at the next safe point with a checkpoint, not an
exit on the spot.

The kubelet sends SIGTERM when a pod is deleted (a gang restart, a suspend, preemption, a node
drain) and SIGKILL after the pod's grace period. A step's phases are collectives over every
rank, so one is never cut short: the loop finishes the step in progress, writes a checkpoint
of it (unless it has just written one) and exits with 128 + 15. A SIGTERM during a save lets
the save finish; a SIGKILL in the middle of one leaves only a staging dir, never resumed from
(checkpoint/manager.py), so the previous checkpoint stays the latest.

Only while the loop runs (`armed`) is SIGTERM taken as a request; before it (waiting for pods,
loading models) there is nothing to save and the process exits at once.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator


class Terminated(SystemExit):
    """The loop stopped on SIGTERM after saving; exits 128 + the signal, saying where it stopped.
    A SystemExit: no handler of the trainer's takes it for an error, and `finally` blocks run."""

    def __init__(self, signum: int, step: int, checkpoint: str | None) -> None:
        super().__init__(128 + signum)
        saved = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint"
        self.message = f"stopped by {signal.Signals(signum).name} at step {step} ({saved}): the pod was deleted, preempted or drained"


class Termination:
    """The SIGTERM a running loop takes as a request; one per process (`TERMINATION`)."""

    def __init__(self) -> None:
        self.armed = False
        self.signum: int | None = None
        self.worth_waiting: Callable[[], bool] = lambda: True

    def take(self, signum: int) -> bool:
        """The signal handler's question: True when the loop will stop at its next safe point."""
        if not self.armed or not self.worth_waiting():
            return False
        self.signum = signum
        return True

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @contextlib.contextmanager
    def arm(self, worth_waiting: Callable[[], bool] = lambda: True) -> Iterator[Termination]:
        """Takes SIGTERM as a request while the block runs and `worth_waiting()` says so at the
        signal (a role pod: while the driver it serves is there to save)."""
        self.armed, self.signum, self.worth_waiting = True, None, worth_waiting
        try:
            yield self
        finally:
            self.armed = False


TERMINATION = Termination()
