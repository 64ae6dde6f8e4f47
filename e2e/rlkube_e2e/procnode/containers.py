"""One container of a pod: run its command (through the launcher), restart it per policy.

A runner is a thread that lives as long as its container may still run. It
starts the launcher itself, so the launcher's "die with parent" (which the
kernel ties to the forking thread) holds exactly while someone waits for it.
Restarts follow the kubelet's pattern with a shorter back-off (1 s doubling to
30 s, reset after a minute of running) so tests see them within seconds.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from rlkube_e2e.procnode import launcher, logs
from rlkube_e2e.procnode.env import ConfigError
from rlkube_e2e.procnode.mounts import Mount
from rlkube_e2e.procnode.status import ContainerRecord, now, running, terminated, waiting

BACKOFF_START = 1.0
BACKOFF_MAX = 30.0
BACKOFF_RESET_AFTER = 60.0
CONFIG_RETRY = 2.0
COPY_DRAIN_TIMEOUT = 10.0
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
# The kubelet's limits: a message of at most 4096 bytes; from the log, the last 80 lines or 2048 bytes.
TERMINATION_MESSAGE_BYTES = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
# The launcher needs no environment of its own (it runs with -I -S); the container's is in its spec.
LAUNCHER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


@dataclass(frozen=True)
class Launch:
    """What one run of a container needs, resolved just before it starts (as the kubelet does)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    mounts: list[Mount]
    # The container's terminationMessagePath and terminationMessagePolicy.
    termination_path: str = DEFAULT_TERMINATION_PATH
    termination_policy: str = "File"


@dataclass(frozen=True)
class ContainerFiles:
    """Where a container's run-time files live: spec, result, and the empty mount points of its root."""

    directory: Path

    def create(self) -> None:
        for path in (self.root, self.stash):
            path.mkdir(parents=True, exist_ok=True)

    @property
    def root(self) -> Path:
        return self.directory / "root"

    @property
    def stash(self) -> Path:
        return self.directory / "stash"

    @property
    def spec(self) -> Path:
        return self.directory / "spec.json"

    @property
    def result(self) -> Path:
        return self.directory / "result.json"

    @property
    def termination_log(self) -> Path:
        """Bind-mounted at the container's terminationMessagePath, as the kubelet does."""
        return self.directory / "termination-log"

    def run_log(self, run: int) -> Path:
        """The CRI-format log of run `run` (0 = the first; the kubelet's <container>/<n>.log)."""
        return self.directory / "logs" / f"{run}.log"


def should_restart(policy: str, exit_code: int, *, init: bool) -> bool:
    if init:
        return exit_code != 0 and policy != "Never"
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


class ContainerRunner:
    def __init__(
        self,
        record: ContainerRecord,
        *,
        pod: str,
        policy: str,
        init: bool,
        prepare: Callable[[], Launch],
        files: ContainerFiles,
        sandbox_pid: int,
        python: str,
        log_path: Path,
        notify: Callable[[], None],
        log: logging.Logger,
    ) -> None:
        self.record = record
        # namespace/name, for log lines: several pods run at once.
        self.what = f"{pod}:{record.name}"
        self.policy = policy
        self.init = init
        self._prepare = prepare
        self._files = files
        self._sandbox_pid = sandbox_pid
        self._python = python
        self._log_path = log_path
        self._notify = notify
        self._log = log
        self._stopping = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"container-{self.what}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def finished(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def name(self) -> str:
        return self.record.name

    def log_of(self, *, previous: bool) -> tuple[Path, Callable[[], bool]] | None:
        """The log file of the current run (or the one before, with `previous`) and whether that
        run still runs; None if there is no such run."""
        run = self.record.restart_count - (1 if previous else 0)
        path = self._files.run_log(run)
        if run < 0 or not path.exists():
            return None
        return path, lambda: self.record.restart_count == run and self._process is not None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """No more restarts; send `sig` to the running process (the launcher forwards it to the command)."""
        self._stopping.set()
        with self._lock:
            process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(sig)

    def _run(self) -> None:
        backoff = BACKOFF_START
        try:
            while not self._stopping.is_set():
                try:
                    launch = self._prepare()
                except ConfigError as error:
                    self._log.warning("container %s: %s", self.what, error)
                    self._set(waiting("CreateContainerConfigError", str(error)))
                    self._stopping.wait(CONFIG_RETRY)
                    continue
                started = time.monotonic()
                exit_code = self._run_once(launch)
                if self._stopping.is_set() or not should_restart(self.policy, exit_code, init=self.init):
                    break
                if time.monotonic() - started > BACKOFF_RESET_AFTER:
                    backoff = BACKOFF_START
                message = f"back-off {backoff:.0f}s restarting failed container={self.record.name}"
                self.record.last_state = self.record.state
                self._set(waiting("CrashLoopBackOff", message))
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                self.record.restart_count += 1
        except Exception:
            self._log.exception("container %s: runner failed", self.what)
        finally:
            self.record.done = True
            self._notify()

    def _run_once(self, launch: Launch) -> int:
        files = self._files
        files.create()
        files.termination_log.write_bytes(b"")
        files.termination_log.chmod(0o666)  # whichever user the container runs as writes it
        launch = Launch(
            launch.argv,
            launch.env,
            launch.cwd,
            [*launch.mounts, Mount(str(files.termination_log), launch.termination_path)],
            launch.termination_path,
            launch.termination_policy,
        )
        spec = {
            "parent": os.getpid(),
            "sandbox": self._sandbox_pid,
            "root": str(files.root),
            "stash": str(files.stash),
            "result": str(files.result),
            "mounts": [asdict(mount) for mount in launch.mounts],
            "argv": launch.argv,
            "env": launch.env,
            "cwd": launch.cwd,
        }
        # The spec holds the container's environment, Secret values included: owner only.
        fd = os.open(files.spec, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(spec, handle, indent=1)
        files.result.unlink(missing_ok=True)
        started_at = now()
        run_log = files.run_log(self.record.restart_count)
        run_log.parent.mkdir(parents=True, exist_ok=True)
        header = f"==> {started_at} container {self.record.name} run {self.record.restart_count}: {launch.argv}\n"
        with self._log_path.open("ab") as log:
            log.write(header.encode())
        # One pipe for stdout and stderr, copied into the pod's log and the run's own log.
        source, sink = os.pipe()
        try:
            with self._lock:
                if self._stopping.is_set():
                    os.close(source)
                    return 137
                self._process = subprocess.Popen(
                    launcher.command(self._python, "container", files.spec),
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                    env=LAUNCHER_ENV,
                    start_new_session=True,
                )
        except BaseException:
            os.close(source)
            raise
        finally:
            os.close(sink)
        copier = threading.Thread(
            target=logs.copy_output, args=(source, self._log_path, run_log), name=f"logs-{self.what}", daemon=True
        )
        copier.start()
        process = self._process
        self.record.container_id = f"procnode://{process.pid}"
        self._log.info("container %s: started %s (launcher pid %d)", self.what, launch.argv, process.pid)
        self._set(running(started_at))
        returncode = process.wait()
        # The PID namespace ends with the launcher, so every writer of the pipe is gone soon.
        copier.join(COPY_DRAIN_TIMEOUT)
        with self._lock:
            self._process = None
        exit_code = 128 - returncode if returncode < 0 else returncode
        reason, message = "", ""
        error = _start_error(files.result)
        if error:
            reason, message = "StartError", error
        else:
            message = termination_message(files.termination_log, run_log, exit_code, launch.termination_policy)
        self._log.info("container %s: exited with %d %s", self.what, exit_code, message)
        # Reported by the caller, together with what follows (done, or back-off).
        self.record.state = terminated(exit_code, started_at, now(), reason, message)
        return exit_code

    def _set(self, state: dict[str, object]) -> None:
        self.record.state = state
        self._notify()


def termination_message(file: Path, run_log: Path, exit_code: int, policy: str) -> str:
    """What the container wrote to its termination message file; with FallbackToLogsOnError and
    nothing written by a failed container, its log's last lines (as the kubelet)."""
    try:
        written = file.read_bytes()[:TERMINATION_MESSAGE_BYTES]
    except OSError:
        written = b""
    if written or policy != "FallbackToLogsOnError" or exit_code == 0:
        return written.decode(errors="replace")
    try:
        with run_log.open("rb") as handle:
            entries = [e for e in map(logs.parse, handle.readlines()) if e is not None]
    except OSError:
        return ""
    tail = b"".join(e.text for e in entries[-FALLBACK_LOG_LINES:])
    return tail[-FALLBACK_LOG_BYTES:].decode(errors="replace")


def _start_error(result: Path) -> str:
    try:
        text = result.read_text()
    except FileNotFoundError:
        return ""
    if not text.strip():
        return ""
    try:
        return str(json.loads(text).get("error", ""))
    except ValueError:
        return text.strip()
