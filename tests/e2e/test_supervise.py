"""A node's daemons are restarted when they die (rlkube_e2e.node.supervise), with a back-off
that grows while they keep dying young; never once the node is stopping or the supervisor is
asked to stop. Short real processes, no cluster."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rlkube_e2e.node.supervise import Backoff, Supervisor

QUICK = Backoff(first=0.01, most=0.04, reset_after=5.0)


def test_the_back_off_doubles_while_the_daemon_dies_young_and_resets_after_a_healthy_run() -> None:
    backoff = Backoff(first=1.0, most=10.0, reset_after=30.0)
    delays = [backoff.next(None, 0.5)]
    for _ in range(5):
        delays.append(backoff.next(delays[-1], 0.5))
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.next(10.0, 31.0) == 1.0


def test_a_daemon_that_exits_is_started_again_until_the_node_stops(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    command = [sys.executable, "-c", f"open({str(runs)!r}, 'a').write('x'); raise SystemExit(3)"]
    lines: list[str] = []
    # The node "stops" once the daemon has run three times.
    supervisor = Supervisor("kubelet", command, lambda: runs.read_text().count("x") < 3, QUICK, lines.append)
    assert supervisor.run() == 3
    assert runs.read_text() == "xxx"  # the first run and two restarts
    assert lines[0].startswith("kubelet exited with code 3 after ")
    assert lines[0].endswith("restart 1 in 0.01 s")
    assert lines[1].endswith("restart 2 in 0.02 s")
    assert lines[-1] == "kubelet exited with code 3; the node is stopping, not restarting it"


def test_a_killed_daemon_comes_back_and_a_stop_is_passed_on_without_a_restart(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); time.sleep(60)"
    lines: list[str] = []
    supervisor = Supervisor("containerd", [sys.executable, "-c", script], lambda: True, QUICK, lines.append)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(supervisor.run()))
    thread.start()

    def started() -> list[int]:
        return [int(line) for line in pids.read_text().split()] if pids.exists() else []

    deadline = time.monotonic() + 10
    while len(started()) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    subprocess.run(["kill", "-KILL", str(started()[0])], check=True)
    while len(started()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(started()) == 2, lines
    assert lines[0].startswith("containerd killed by SIGKILL after ")
    supervisor.stop(signal.SIGTERM)
    thread.join(10)
    assert codes == [-signal.SIGTERM]
    assert len(started()) == 2  # not restarted after the stop
