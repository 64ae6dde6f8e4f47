"""Poll until a deadline: the one wait loop of the local cluster, its nodes and their tests.

On a busy machine any single look can be slow: a `ctr version` past its own timeout, a
connection refused while a server restarts, an API call that times out. Such a failure
means "not yet", never "give up": the loop looks again until its own deadline, and only then
says what it waited for and the last error it saw. Errors that are not about slowness (a
process that exited, a refusal the caller raises itself) end the wait at once.
"""

from __future__ import annotations

import http.client
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Failures of one look that mean "not yet": a command past its timeout, a refused, reset or
# timed-out connection (OSError covers socket.timeout, ssl errors and urllib's URLError),
# an HTTP response cut short.
SLOW = (subprocess.TimeoutExpired, OSError, http.client.HTTPException)


class WaitTimedOut(Exception):
    """The deadline passed; the message names what was awaited and the last error seen."""

    def __init__(self, what: str, waited: float, last_error: BaseException | None) -> None:
        self.what, self.waited, self.last_error = what, waited, last_error
        suffix = f" (last error: {describe(last_error)})" if last_error is not None else ""
        super().__init__(f"timed out after {round(waited, 1):g} s waiting for {what}{suffix}")


def describe(error: BaseException) -> str:
    """One line for an error: its type when its text says little (a TimeoutExpired's does)."""
    if isinstance(error, subprocess.TimeoutExpired):
        command = error.cmd if isinstance(error.cmd, str) else " ".join(str(part) for part in error.cmd)
        return f"`{command}` did not finish within {error.timeout:.2g} s"
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


def poll_until(
    probe: Callable[[], T | None],
    what: str,
    *,
    timeout: float | None = None,
    deadline: float | None = None,
    interval: float = 0.2,
    transient: tuple[type[BaseException], ...] = SLOW,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `probe` until it returns something other than None or False, and return that.

    A `transient` error from `probe` counts as "not yet" (the last one is remembered); any
    other error propagates at once. Give `timeout` (seconds from now) or `deadline` (a
    `clock()` value, for several waits sharing one budget). At the deadline WaitTimedOut
    names `what` and the last transient error; callers turn it into their own error type.
    """
    if (timeout is None) == (deadline is None):
        raise ValueError("give exactly one of timeout and deadline")
    started = clock()
    end = deadline if deadline is not None else started + (timeout or 0.0)
    last_error: BaseException | None = None
    while True:
        try:
            result = probe()
        except transient as error:
            last_error = error
        else:
            if result is not None and result is not False:
                return result
        if clock() >= end:
            raise WaitTimedOut(what, clock() - started, last_error)
        sleep(max(0.0, min(interval, end - clock())))
