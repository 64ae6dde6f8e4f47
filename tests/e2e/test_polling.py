"""Polling until a deadline (rlkube_e2e.polling): a look that times out is "not yet", the
deadline's error names what was awaited and the last error seen. No cluster: real commands
that outlive their timeout, a fake clock where time matters."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlkube_e2e.node import image_store
from rlkube_e2e.polling import WaitTimedOut, poll_until
from rlkube_e2e.testing import wait_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(5)"]


def test_a_command_past_its_timeout_is_not_yet_and_the_wait_goes_on() -> None:
    looks: list[int] = []

    def probe() -> bool:
        looks.append(1)
        if len(looks) < 3:  # the first two looks hang past their timeout, as on a busy machine
            subprocess.run(SLEEPER, timeout=0.05, check=False)
        return True

    assert poll_until(probe, "the command to answer", timeout=30, interval=0.01) is True
    assert len(looks) == 3


def test_at_the_deadline_the_error_names_what_was_awaited_and_the_last_error() -> None:
    with pytest.raises(WaitTimedOut) as raised:
        poll_until(lambda: subprocess.run(SLEEPER, timeout=0.05, check=False), "containerd to serve", timeout=0.3)
    message = str(raised.value)
    assert "waiting for containerd to serve" in message
    # subprocess counts the timeout down from its start: about 0.05 s, not exactly.
    assert re.search(r"did not finish within 0\.0\d* s\)$", message), message
    assert isinstance(raised.value.last_error, subprocess.TimeoutExpired)


def test_a_refused_connection_is_not_yet_and_other_errors_end_the_wait() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def refused() -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(WaitTimedOut, match=r"after 10 s waiting for the API \(last error: ConnectionRefusedError"):
        poll_until(refused, "the API", timeout=10, interval=1, clock=clock, sleep=sleep)
    assert now[0] == 10

    def broken() -> None:
        raise ValueError("a bug, not slowness")

    with pytest.raises(ValueError, match="a bug"):
        poll_until(broken, "anything", timeout=10, clock=clock, sleep=sleep)


def test_the_tests_wait_for_reports_a_timed_out_command_as_an_assertion() -> None:
    with pytest.raises(AssertionError, match=r"waiting for kubectl get \(last error: `.*` did not finish"):
        wait_for(lambda: subprocess.run(SLEEPER, timeout=0.05, check=False), "kubectl get", timeout=0.3)


def test_the_image_store_wait_survives_a_ctr_that_times_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`ctr version` hanging past its 10 s timeout once (a busy 2-core machine) no longer ends
    the store's build with a traceback: the next look finds containerd serving."""
    calls: list[list[str]] = []
    real_run = subprocess.run

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        calls.append(command)
        if len(calls) == 1:
            raise subprocess.TimeoutExpired(command, 10)
        return real_run(["true"], capture_output=True, check=False)

    monkeypatch.setattr(subprocess, "run", run)  # the module image_store calls it through
    handle = subprocess.Popen(SLEEPER)
    try:
        image_store._wait_serving(["ctr"], handle, tmp_path, timeout=30)
    finally:
        handle.kill()
        handle.wait()
    assert len(calls) == 2
