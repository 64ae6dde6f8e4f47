"""Run untrusted Python code in its own process with hard limits.

The child is `sandbox_exec.py`, a wrapper that confines itself and then execs the interpreter on
the code: kernel-enforced rlimits (CPU time, address space, process count, file size), a
network namespace of its own, and Landlock (read and execute only the interpreter's
installation, read and write only a fresh scratch directory; no TCP, no signals or abstract
UNIX sockets outside). Here: a wall-clock kill of the whole process group and an output cap.
Where the kernel or the pod's seccomp profile refuses the namespace or Landlock (restricted PSS
with RuntimeDefault may), `require_no_network` / `require_filesystem_isolation` make the run
refuse with a clear error rather than run unconfined.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from rlkube_trainer.rollout.agent.sandbox_exec import NO_LANDLOCK, NO_NETWORK

_WRAPPER = Path(__file__).with_name("sandbox_exec.py")


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 512 * 1024 * 1024
    max_processes: int = 32
    max_output_bytes: int = 16 * 1024
    max_file_bytes: int = 16 * 1024 * 1024
    require_no_network: bool = True
    require_filesystem_isolation: bool = True


@dataclass(frozen=True)
class SandboxResult:
    ok: bool
    stdout: str
    stderr: str
    error: str | None


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``code`` with ``limits`` in a fresh scratch dir; never raises for the code's faults."""
    with tempfile.TemporaryDirectory(prefix="rlkube-sandbox-") as scratch:
        script = Path(scratch) / "main.py"
        script.write_text(code)
        # No preexec_fn: tools call this from threads, where forking Python code is unsafe;
        # the wrapper sets everything up in its own process before exec.
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_WRAPPER), json.dumps(asdict(limits)), scratch, str(script)],
            cwd=scratch,
            env={"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
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
        if proc.returncode == NO_NETWORK:
            return SandboxResult(False, stdout, stderr, "sandbox unavailable: no network namespace")
        if proc.returncode == NO_LANDLOCK:
            return SandboxResult(False, stdout, stderr, "sandbox unavailable: no Landlock to confine the filesystem")
        if proc.returncode < 0:
            sig = signal.Signals(-proc.returncode).name
            return SandboxResult(False, stdout, stderr, f"killed by {sig} (resource limit)")
        if proc.returncode != 0:
            last = stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            return SandboxResult(False, stdout, stderr, last[0])
        return SandboxResult(True, stdout, stderr, None)
