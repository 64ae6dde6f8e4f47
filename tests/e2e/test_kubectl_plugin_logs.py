"""`kubectl rlkube logs` and `curves` on the package's real nodes: pods named as
the operator names a job's pods print the driver's step lines, and the plugin (run by
the real kubectl, which finds kubectl-rlkube on PATH) shows the driver's and a role
rank's log and draws the curves from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rlkube_e2e.pools import POOL_LABEL
from rlkube_e2e.testing import Kubectl, wait_for

if TYPE_CHECKING:
    from tests.e2e.real_node_kit import RealCluster

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

DRIVER = """
import time
for step in range(1, 6):
    print(f"2026-12-01 10:00:0{step},000 INFO rlkube.trainer: step {step} critic/score/mean={step / 10} "
          f"actor/ppo_kl=0.001 response_length/mean=2", flush=True)
print("RESULT done", flush=True)
time.sleep(3600)
"""


def _pod(name: str, program: str, image: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {POOL_LABEL: "real"},
            "containers": [
                {"name": "trainer", "image": image, "imagePullPolicy": "Never", "command": ["python3", "-c", program]}
            ],
        },
    }


def _plugin(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECTL": str(bin_dir / "kubectl"),
    }
    command = [str(bin_dir / "kubectl"), "rlkube", f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_logs_and_curves_of_a_running_job(
    real_cluster: RealCluster, real_kubectl: Kubectl, real_namespace: str, tmp_path: Path
) -> None:
    kubectl, namespace, kubeconfig = real_kubectl, real_namespace, real_cluster.cluster.kubeconfig
    image = real_cluster.images["base"].ref
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_pod("demo-controller-0", DRIVER, image)))
    kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(
            _pod("demo-actor-1", "print('actor rank 1', flush=True)\nimport time; time.sleep(3600)", image)
        ),
    )

    def driver_log() -> str | None:
        result = _plugin(kubeconfig, "-n", namespace, "logs", "demo")
        return result.stdout if "RESULT done" in result.stdout else None

    log = wait_for(driver_log, "the driver's step lines through kubectl rlkube logs", 120)
    assert "step 5 critic/score/mean=0.5" in log
    rank = wait_for(
        lambda: (
            "actor rank 1"
            in _plugin(kubeconfig, "-n", namespace, "logs", "demo", "--role", "actor", "--rank", "1").stdout
        ),
        "the actor rank 1 log",
        120,
    )
    assert rank

    png = tmp_path / "curves.png"
    result = _plugin(kubeconfig, "-n", namespace, "curves", "demo", "-o", str(png))
    assert result.returncode == 0, result.stderr
    assert "5 steps, 1 to 5" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
