"""Run untrusted Python code in its own process with hard limits.

Limits are kernel-enforced rlimits set in the child before exec (CPU time,
address space, process count, file size), plus a wall-clock kill of the whole
process group and an output cap. The network is removed by unsharing a network
namespace: as root directly, as non-root through a user namespace. Where the
kernel or the pod's seccomp profile forbids both (restricted PSS with
RuntimeDefault may), ``require_no_network`` makes the run refuse rather than
silently run with network access.

Not done yet: the filesystem view is only the scratch dir as cwd; reading
absolute paths such as /etc/passwd is NOT blocked (needs a mount namespace or
Landlock).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 512 * 1024 * 1024
    max_processes: int = 32
    max_output_bytes: int = 16 * 1024
    max_file_bytes: int = 16 * 1024 * 1024
    require_no_network: bool = True


@dataclass(frozen=True)
class SandboxResult:
    ok: bool
    stdout: str
    stderr: str
    error: str | None


def _drop_network() -> bool:
    # os.unshare exists only from Python 3.12; the trainer image runs 3.11.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) == 0:
        return True
    return bool(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0)


def _child_setup(limits: SandboxLimits) -> None:
    if not _drop_network() and limits.require_no_network:
        os.write(2, b"rlkube-sandbox: cannot unshare the network namespace\n")
        os._exit(97)
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
    # RLIMIT_NPROC counts every process of the uid; root ignores it, so the
    # fork-bomb guard for root is the process-group kill on wall timeout.
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``code`` with ``limits`` in a fresh scratch dir; never raises for the code's faults."""
    with tempfile.TemporaryDirectory(prefix="rlkube-sandbox-") as scratch:
        script = Path(scratch) / "main.py"
        script.write_text(code)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(script)],
            cwd=scratch,
            env={"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            # Limits and the namespace must be set between fork and exec. preexec_fn is
            # unsafe in a threaded process: before the multi-turn rollout calls this from
            # its tool threads, the setup moves into a small wrapper executable.
            preexec_fn=lambda: _child_setup(limits),  # noqa: PLW1509
        )
        timed_out = False
        try:
            out, err = proc.communicate(timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        cap = limits.max_output_bytes
        stdout = out[:cap].decode(errors="replace")
        stderr = err[:cap].decode(errors="replace")
        if timed_out:
            return SandboxResult(False, stdout, stderr, f"timed out after {limits.wall_seconds}s")
        if proc.returncode == 97:
            return SandboxResult(False, stdout, stderr, "sandbox unavailable: no network namespace")
        if proc.returncode < 0:
            sig = signal.Signals(-proc.returncode).name
            return SandboxResult(False, stdout, stderr, f"killed by {sig} (resource limit)")
        if proc.returncode != 0:
            last = stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            return SandboxResult(False, stdout, stderr, last[0])
        return SandboxResult(True, stdout, stderr, None)
