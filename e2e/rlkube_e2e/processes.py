"""Start and stop component processes, and tell whether a recorded pid is still ours.

Processes are recorded by pid in the state file so that `down` in another shell can
stop them. A pid alone could have been reused by an unrelated process after a
reboot, so a pid counts as ours only while /proc says it runs the same binary.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rlkube_e2e.components import Component, process_env

_PR_SET_PDEATHSIG = 1


def spawn(component: Component, log_path: Path, cwd: Path, *, die_with_parent: bool) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    preexec: Callable[[], None] | None = _die_with_parent if die_with_parent else None
    with log_path.open("ab") as log:
        log.write(f"\n==> {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(component.argv)}\n".encode())
        log.flush()
        # A new session keeps a Ctrl-C in the shell that ran `up` from reaching the
        # cluster, which is meant to outlive that command.
        return subprocess.Popen(
            component.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=process_env(component),
            start_new_session=True,
            preexec_fn=preexec,  # noqa: PLW1509 - only prctl, which is async-signal-safe
        )


def _die_with_parent() -> None:
    """Make the kernel kill this child when the test session that started it dies.

    A crashed or killed pytest then leaves no control plane behind. SIGKILL, not
    SIGTERM: an apiserver still starting up ignores SIGTERM once etcd is gone, and
    a test cluster's state is thrown away anyway.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def is_running(pid: int, binary: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The state follows the parenthesised command name; Z is a zombie.
            if stat.read().rpartition(")")[2].split()[0] == "Z":
                return False
        exe = os.readlink(f"/proc/{pid}/exe")
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
        return False
    # A binary rebuilt while the cluster ran shows as "<path> (deleted)".
    return exe.removesuffix(" (deleted)") == str(Path(binary).resolve())


def stop(pid: int, binary: str, handle: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`; only if the pid still runs `binary`."""
    if not is_running(pid, binary):
        _reap(handle)
        return
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(handle)
        if not is_running(pid, binary):
            return
        time.sleep(0.05)
    _signal(pid, signal.SIGKILL)
    if handle is not None:
        handle.wait(timeout=5)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _reap(handle: subprocess.Popen[bytes] | None) -> None:
    # Children of this process stay zombies until waited for.
    if handle is not None:
        handle.poll()


def log_error(path: Path) -> str:
    """The line of a component log most likely to say why it stopped, for one-line errors.

    klog marks errors with E/F and a date (E1129 ...), etcd and kwok log JSON with
    a level; without such a line the last line is the best guess.
    """
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("==> ")]
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            return line[:400]
    return lines[-1][:400] if lines else ""


_ERROR_LINE = re.compile(r'^[EF]\d{4} |"level":"(error|fatal|panic)"|\b(Error|error|fatal):')
