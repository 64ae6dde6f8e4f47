"""An S3-compatible server for the object-storage checkpoint tests, on loopback or where a
local cluster's pods reach this machine.

gofakes3 (a Go module, built by `e2e/toolchain.sh s3` into the cache, keyed by version) with
its bbolt backend: every bucket and object in one database file that outlives the process,
so a test can kill the server in the middle of a save and start it again on the same port
and the same data. docs/reliability.md says why this server and not another.

One object, started and stopped as one: `stop()` leaves no process behind, `start()` after
it brings back the same server (port, data).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from rlkube_e2e.binaries import cache_dir
from rlkube_e2e.errors import ClusterError
from rlkube_e2e.polling import WaitTimedOut, poll_until

GOFAKES3_VERSION = os.environ.get("GOFAKES3_VERSION", "1.2.0")
# Any key pair: gofakes3 does not check signatures (docs/reliability.md); the clients still sign.
ACCESS_KEY = "rlkube-test"
SECRET_KEY = "rlkube-test-secret"


def find_gofakes3() -> Path:
    path = cache_dir() / f"gofakes3-v{GOFAKES3_VERSION}" / "bin" / "gofakes3"
    if not os.access(path, os.X_OK):
        raise ClusterError(f"gofakes3 not found (expected {path}); run `bash e2e/toolchain.sh s3` to build it")
    return path


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class S3Server:
    """gofakes3 on `host` (loopback, or the address a local cluster's pods reach this machine
    at), its state in `data_dir/s3.db`, with `bucket` created."""

    def __init__(self, data_dir: Path, bucket: str = "checkpoints", host: str = "127.0.0.1") -> None:
        self.data_dir = data_dir
        self.bucket = bucket
        self.host = host
        self.port = _free_port(host)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client_env(self) -> dict[str, str]:
        """What a checkpoint writer needs in its environment (a Secret's keys in a cluster)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"}

    def start(self, timeout: float = 30.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            str(find_gofakes3()),
            "-backend",
            "bolt",
            "-bolt.db",
            str(self.data_dir / "s3.db"),
            "-host",
            f"{self.host}:{self.port}",
            "-initialbucket",
            self.bucket,
            "-quiet",
        ]
        log = open(self.data_dir / "server.log", "ab")  # noqa: SIM115  (the process keeps it)
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        process = self.process

        def answers() -> bool:
            if process.poll() is not None:
                raise ClusterError(
                    f"gofakes3 exited with {process.returncode}: {(self.data_dir / 'server.log').read_text()[-2000:]}"
                )
            # It answers, even if it refuses an unsigned request: up.
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(f"{self.endpoint}/{self.bucket}", timeout=1).close()
            return True

        try:
            poll_until(answers, f"gofakes3 to answer on {self.endpoint}", timeout=timeout, interval=0.1)
        except WaitTimedOut as error:
            raise ClusterError(str(error)) from None

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL: a crash) and wait; the data stays in data_dir."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self, kill: bool = True) -> None:
        self.stop(kill=kill)
        self.start()
