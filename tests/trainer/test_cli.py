"""`rlkube-trainer`: `run` refuses a bad config before starting anything, naming the file and
key; a pod's command ends on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from rlkube_api.exit_codes import ExitCode
from rlkube_api.names import Env
from rlkube_trainer.tiny.task import init


def test_wrong_key_and_value_are_named(tmp_path: Path) -> None:
    config = init(tmp_path, "grpo", steps=2)
    raw = yaml.safe_load(config.read_text())
    raw["actor"]["clip_ratio_c"] = 0.5
    raw["rollout"]["temprature"] = 1.0
    config.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, "-m", "rlkube_trainer.pod.cli", "run", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == ExitCode.CONFIG
    assert str(config) in result.stderr
    assert "actor.clip_ratio_c: Input should be greater than 1" in result.stderr
    assert "rollout.temprature: Extra inputs are not permitted" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_pods_trainer_exits_on_sigterm_as_a_kubelet_expects(tmp_path: Path) -> None:
    """A role pod's trainer (here waiting for a Ray head that never comes) ends at once on
    SIGTERM with 128 + 15, through its own handler: as a container's first process it would
    otherwise ignore the signal and hold the pod until the end of its grace period."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # `ray`, as in the image
    env = {**os.environ, "PATH": path, Env.RAY_ADDRESS: "127.0.0.1:1", Env.PET_NODE_RANK: "0"}
    env.pop(Env.CONFIG, None)
    command = [sys.executable, "-m", "rlkube_trainer.pod.cli", "node", "--role", "actor", "--gpus", "0"]
    process = subprocess.Popen([*command, "--health-port", str(port)], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while True:  # its health server answers once it is waiting for the head
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, f"exited early with {process.returncode}"
                assert time.monotonic() < deadline, "the health server never answered"
                time.sleep(0.2)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 128 + signal.SIGTERM  # the handler's code, not -15 (unhandled)
        assert time.monotonic() - sent < 10
    finally:
        process.kill()
