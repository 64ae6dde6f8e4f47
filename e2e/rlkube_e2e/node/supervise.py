"""Keeps one of a node's daemons running, as systemd does on a real node (`Restart=always`).

`python -m rlkube_e2e.node.supervise --name kubelet --holder PID -- COMMAND...` runs COMMAND
and starts it again whenever it exits, after a short back-off that doubles while it keeps
dying young (1 s up to 10 s; a run of 30 s or more resets it), each exit and restart logged
to stdout (the daemon's own log). It runs inside the node's namespaces beside the daemon, so
a node's stop, which kills every process there, ends it too; it never restarts a daemon once
the node's holder process is gone (the node is being stopped). SIGTERM or SIGINT is passed
on to the daemon, and the supervisor exits with it instead of restarting it.

Only the standard library: it starts for every daemon of every node.
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Backoff:
    """How long to wait before a restart: `first`, doubled per quick death up to `most`;
    a run of `reset_after` seconds or more counts as healthy and starts over at `first`."""

    first: float = 1.0
    most: float = 10.0
    reset_after: float = 30.0

    def next(self, previous: float | None, ran_for: float) -> float:
        if previous is None or ran_for >= self.reset_after:
            return self.first
        return min(self.most, previous * 2)


def holder_alive(pid: int) -> bool:
    """Whether the node's holder (`sleep infinity`) still runs: the node has not been stopped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class Supervisor:
    def __init__(
        self,
        name: str,
        command: list[str],
        node_alive: Callable[[], bool],
        backoff: Backoff = Backoff(),
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.name, self.command, self.node_alive, self.backoff = name, command, node_alive, backoff
        self._log = log or _log
        self._stopping = False
        self._child: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def stop(self, signum: int, _frame: FrameType | None = None) -> None:
        """From a signal handler: pass the signal on, and do not restart."""
        self._stopping = True
        if self._child is not None and self._child.poll() is None:
            self._child.send_signal(signum)

    def run(self) -> int:
        """Runs the daemon until it is asked to stop or the node goes; returns its last code."""
        delay: float | None = None
        while True:
            started = time.monotonic()
            self._child = subprocess.Popen(self.command, preexec_fn=_die_with_parent)  # noqa: PLW1509 - prctl only
            if self._stopping:  # the signal came between the start and the line above
                self._child.terminate()
            code = self._wait(self._child)
            ran_for = time.monotonic() - started
            if self._stopping:
                return code
            if not self.node_alive():
                self._log(f"{self.name} {exit_text(code)}; the node is stopping, not restarting it")
                return code
            delay = self.backoff.next(delay, ran_for)
            self.restarts += 1
            self._log(f"{self.name} {exit_text(code)} after {ran_for:.1f} s; restart {self.restarts} in {delay:g} s")
            deadline = time.monotonic() + delay
            while not self._stopping and time.monotonic() < deadline:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            if self._stopping or not self.node_alive():
                return code

    @staticmethod
    def _wait(child: subprocess.Popen[bytes]) -> int:
        while True:
            try:
                return child.wait()
            except InterruptedError:  # a signal arrived while waiting; Python retries, to be sure
                continue


def _die_with_parent() -> None:
    # A daemon never outlives its supervisor, so nothing of the node runs unsupervised.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _log(message: str) -> None:
    print(f"==> {time.strftime('%Y-%m-%d %H:%M:%S')} supervise: {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="the daemon's name, for the log")
    parser.add_argument("--holder", type=int, required=True, help="the node's holder pid")
    parser.add_argument("command", nargs="+", help="the daemon's command line (after --)")
    args = parser.parse_args(argv)
    supervisor = Supervisor(args.name, args.command, lambda: holder_alive(args.holder))
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    code = supervisor.run()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
