"""`make demo`: the local control plane with a process node, the operator, and the tiny CPU
RLJob trained for real.

Starts (or reuses) the local cluster in `.cluster/` (kube-apiserver, controller-manager,
scheduler, etcd; the simulated GPU pools), starts a node that runs pods as local processes,
installs the CRD, runs the operator, writes the tiny task's model and data (the init step),
applies `examples/tiny-cpu.yaml` (pinned to the process node) with its reward ConfigMap, and
shows progress until the job settles; then prints the status, the checkpoint and the
reward-curve PNG.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rlkube_e2e import tinyjob
from rlkube_e2e.cluster import DEFAULT_STATE_DIR, LocalCluster
from rlkube_e2e.errors import ClusterError
from rlkube_e2e.testing import Kubectl, wait_established

NAMESPACE = "rlkube-demo"
WORKDIR = Path("/var/tmp/rlkube-demo")


def _step(message: str) -> None:
    print(f"==> {message}", flush=True)


def _start_operator(kubeconfig: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    command = [sys.executable, "-m", "rlkube_operator", "--metrics-port", "18090", "--health-port", "18080"]
    return subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def run(state_dir: Path, workdir: Path, timeout: float) -> int:
    from rlkube_e2e.procnode.node import ProcessNode  # noqa: PLC0415  (Linux-only; after the checks below)

    reason = ProcessNode.unavailable()
    if reason:
        print(f"error: the demo runs pods as local processes, which needs {reason}", file=sys.stderr)
        return 1
    cluster = LocalCluster(state_dir)
    _step(f"local control plane ({state_dir})")
    cluster.up()
    kubectl = Kubectl(cluster.kubeconfig)
    _step("process node proc-0 (runs pods as local processes)")
    node = ProcessNode(cluster.kubeconfig, "proc-0", None, state_dir / "procnode" / "proc-0")
    node.start()
    operator = None
    try:
        _step("RLJob CRD")
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tinyjob.CRD))
        wait_established(kubectl, "rljobs.rlkube.dev")
        log = state_dir / "logs" / "operator.log"
        _step(f"operator (log: {log})")
        operator = _start_operator(cluster.kubeconfig, log)
        _step(f"init step: tiny model and data in {workdir}/tiny")
        job = tinyjob.prepare(workdir)
        kubectl("create", "namespace", NAMESPACE, check=False)
        kubectl("-n", NAMESPACE, "delete", "rljob", job.name, "--ignore-not-found", "--wait=true")
        shutil.rmtree(job.checkpoints, ignore_errors=True)  # a fresh run, not a resume of the last demo
        _step("kubectl apply -f examples/tiny-cpu.yaml (pods pinned to the process node)")
        tinyjob.apply(kubectl, NAMESPACE, job)
        print(
            f"  watch the driver meanwhile: KUBECONFIG={cluster.kubeconfig} "
            f"kubectl -n {NAMESPACE} logs -f {job.name}-controller-0",
            flush=True,
        )
        final = tinyjob.wait_state(kubectl, NAMESPACE, job.name, ("Succeeded", "Failed"), timeout, show=True)
        _step("status")
        print(kubectl("-n", NAMESPACE, "get", "rljob", job.name, "-o", "wide").stdout)
        print(kubectl("-n", NAMESPACE, "get", "events", "--field-selector", "involvedObject.kind=RLJob").stdout)
        progress = final.get("progress", {})
        step = progress.get("lastCheckpointStep")
        print(f"state:       {final.get('state')}  (restarts: {final.get('restartCount', 0)})")
        print(f"checkpoint:  {job.checkpoints / f'step_{step:06d}' if step else 'none'}")
        print(f"metrics:     {job.checkpoints / 'metrics.jsonl'}")
        validation = [
            f"step {int(row['step'])}: {value:.3f}"
            for row in job.metrics()
            for key, value in row.items()
            if key.startswith("val-core/") and "/mean@" in key
        ]
        print(f"validation:  {', '.join(validation) or 'none'}  (greedy, held-out prompts)")
        print(f"curves:      {job.checkpoints / 'curves.png'}")
        # `kubectl logs` ends with the demo (the node runs the pods); the files stay.
        print(f"pod logs:    {node.log_path(NAMESPACE, job.name + '-controller-0')}")
        print(f"The cluster stays up: KUBECONFIG={cluster.kubeconfig}; stop it with `e2e/cluster down`.")
        return 0 if final.get("state") == "Succeeded" else 1
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=30)
        # Pods run as processes of this program: they stop with it.
        node.stop(delete_node=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    parser.add_argument(
        "--workdir", type=Path, default=WORKDIR, help="the example's hostPath (model, data, checkpoints)"
    )
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    try:
        return run(args.state_dir, args.workdir, args.timeout)
    except (ClusterError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
