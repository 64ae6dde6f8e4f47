"""`make demo`: the local control plane, the operator, and the tiny CPU RLJob.

Starts (or reuses) the local cluster in `.cluster/`, installs the CRD, runs the
operator, applies `examples/tiny-cpu.yaml` with its reward ConfigMap, and shows
the job's state until it settles, then prints its status and Events.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from rlkube_e2e.cluster import DEFAULT_STATE_DIR, REPO_ROOT, LocalCluster
from rlkube_e2e.errors import ClusterError
from rlkube_e2e.testing import Kubectl

NAMESPACE = "rlkube-demo"
EXAMPLE = REPO_ROOT / "examples" / "tiny-cpu.yaml"
REWARD = REPO_ROOT / "examples" / "rewards" / "tiny_task.py"
CRD = REPO_ROOT / "crds" / "rljob.yaml"


def _step(message: str) -> None:
    print(f"==> {message}", flush=True)


def _start_operator(kubeconfig: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    command = [sys.executable, "-m", "rlkube_operator", "--metrics-port", "0", "--health-port", "18080"]
    return subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def run(state_dir: Path, timeout: float) -> int:
    cluster = LocalCluster(state_dir)
    _step(f"local control plane ({state_dir})")
    cluster.up()
    kubectl = Kubectl(cluster.kubeconfig)
    _step("RLJob CRD")
    kubectl("apply", "--server-side", "-f", str(CRD))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/rljobs.rlkube.dev")
    log = state_dir / "logs" / "operator.log"
    _step(f"operator (log: {log})")
    operator = _start_operator(cluster.kubeconfig, log)
    try:
        kubectl("create", "namespace", NAMESPACE, check=False)
        manifest = kubectl(
            "-n",
            NAMESPACE,
            "create",
            "configmap",
            "tiny-reward",
            f"--from-file=reward.py={REWARD}",
            "--dry-run=client",
            "-o",
            "yaml",
        ).stdout
        kubectl("-n", NAMESPACE, "apply", "-f", "-", input=manifest)
        _step(f"kubectl apply -f {EXAMPLE.relative_to(REPO_ROOT)}")
        kubectl("-n", NAMESPACE, "apply", "-f", str(EXAMPLE))
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = kubectl("-n", NAMESPACE, "get", "rljob", "tiny-cpu", "-o", "jsonpath={.status.state}").stdout
            print(kubectl("-n", NAMESPACE, "get", "rljob", "tiny-cpu", "--no-headers").stdout.rstrip(), flush=True)
            if state in ("Running", "Succeeded", "Failed"):
                break
            time.sleep(2)
        _step("status")
        print(kubectl("-n", NAMESPACE, "get", "rljob", "tiny-cpu", "-o", "jsonpath={.status}").stdout)
        print(kubectl("-n", NAMESPACE, "get", "pods", "-o", "wide").stdout)
        print(kubectl("-n", NAMESPACE, "get", "events", "--field-selector", "involvedObject.kind=RLJob").stdout)
        print(f"The cluster stays up: KUBECONFIG={cluster.kubeconfig}; stop it with `e2e/cluster down`.")
        return 0 if state in ("Running", "Succeeded") else 1
    finally:
        operator.terminate()
        operator.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    try:
        return run(args.state_dir, args.timeout)
    except ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
