"""`make demo`: the local control plane with a real node, the operator installed by its Helm
chart, and the tiny CPU RLJob trained by pods that run the project's own images.

Builds the images if needed (base, operator, trainer-cpu; cached by their inputs' hash),
starts the local cluster in `.cluster/` (etcd, kube-apiserver, controller-manager, scheduler,
CoreDNS, and a real node: kubelet, containerd, runc, CNI, kube-proxy; no simulated GPU pool,
so no kwok) with the images imported, `helm install`s the chart with the operator image,
writes the tiny task's model and data (the init step), applies `examples/tiny-cpu.yaml`
(pinned to the real node, from the trainer image, its work folder behind a
PersistentVolumeClaim) with its reward ConfigMap, and shows progress until the job settles;
then prints the status, the checkpoint and the reward-curve PNG. Both namespaces enforce the
restricted Pod Security Standard, as a careful cluster would. The cluster, its node and the
operator stay up afterwards (`e2e/cluster down`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rlkube_e2e import release, tinyjob
from rlkube_e2e.cluster import DEFAULT_STATE_DIR, NO_POOLS_FILE, LocalCluster
from rlkube_e2e.errors import ClusterError
from rlkube_e2e.polling import SLOW, WaitTimedOut, describe, poll_until
from rlkube_e2e.state import ClusterState
from rlkube_e2e.testing import Kubectl, wait_established

NAMESPACE = "rlkube-demo"
OPERATOR_NAMESPACE = "rlkube-system"
WORKDIR = Path("/var/tmp/rlkube-demo")
POOL = "real"
# An imported trainer image takes about 11 GB in the node's containerd, beside the images'
# own build store; below this the import fails half-way with a less clear error.
MIN_FREE_BYTES = 16 * 1024**3


def _step(message: str) -> None:
    print(f"==> {message}", flush=True)


def run(state_dir: Path, workdir: Path, timeout: float) -> int:
    from rlkube_e2e.images import ImageError, ensure_image  # noqa: PLC0415

    if os.geteuid() != 0:
        print("error: the demo's real node needs root (network and mount namespaces, cgroups)", file=sys.stderr)
        return 1
    state_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(state_dir).free
    if free < MIN_FREE_BYTES:
        print(
            f"error: {state_dir} has {free / 1024**3:.1f} GB free; the demo's node needs about "
            f"{MIN_FREE_BYTES / 1024**3:.0f} GB for the trainer image",
            file=sys.stderr,
        )
        return 1
    cluster = LocalCluster(state_dir, NO_POOLS_FILE, real_nodes=1, node_pool=POOL, log=print)
    running = cluster.status()
    if running is not None and running.healthy and not running.real_nodes:
        print(
            f"error: a cluster without real nodes runs in {state_dir}; stop it first (`e2e/cluster down`)",
            file=sys.stderr,
        )
        return 1
    _step("images: base, operator, trainer-cpu (built here when their inputs changed)")
    try:
        base_image, operator_image, trainer_image = (ensure_image(n) for n in ("base", "operator", "trainer-cpu"))
    except ImageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    # The tests' node images too (base is the trainer's first layer): one image store serves both.
    cluster.node_images = (base_image.path, operator_image.path, trainer_image.path)
    _step(f"local control plane and a real node ({state_dir})")
    if not cluster.up():
        # A node of an earlier demo: it gets the current images (an import of a present one is quick).
        state = ClusterState.load(cluster.layout.state_file)
        assert state is not None
        for index, node_name in enumerate(state.real_nodes):
            cluster.real_node(state, index, node_name).import_images(cluster.node_images)
    kubectl = Kubectl(cluster.kubeconfig)
    _step("RLJob CRD")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tinyjob.CRD))
    wait_established(kubectl, "rljobs.rlkube.dev")
    for namespace in (OPERATOR_NAMESPACE, NAMESPACE):
        kubectl("create", "namespace", namespace, check=False)
        kubectl("label", "--overwrite", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    installed = release.helm(cluster.kubeconfig, "list", "-q", "-n", OPERATOR_NAMESPACE).stdout.split()
    for old in installed:
        release.uninstall(cluster.kubeconfig, OPERATOR_NAMESPACE, old)
    _step(f"helm install charts/rlkube (operator image {operator_image.ref})")
    name = release.install(cluster.kubeconfig, OPERATOR_NAMESPACE, [NAMESPACE], operator_image.ref, POOL)
    wait_rolled_out(kubectl, OPERATOR_NAMESPACE, f"deployment/{name}", timeout=300)
    _step(f"init step: tiny model and data in {workdir}/tiny")
    job = tinyjob.prepare(workdir, pool=POOL)
    tinyjob.from_image(job, trainer_image.ref)
    kubectl("-n", NAMESPACE, "delete", "rljob", job.name, "--ignore-not-found", "--wait=true")
    shutil.rmtree(job.checkpoints, ignore_errors=True)  # a fresh run, not a resume of the last demo
    job.checkpoints.parent.mkdir(parents=True, exist_ok=True)
    os.chown(job.checkpoints.parent, tinyjob.TRAINER_UID, tinyjob.TRAINER_UID)
    tinyjob.claim_workdir(kubectl, NAMESPACE, job)
    _step("kubectl apply -f examples/tiny-cpu.yaml (pods from the trainer image on the real node, restricted)")
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
    print(f"pod logs:    KUBECONFIG={cluster.kubeconfig} kubectl -n {NAMESPACE} logs {job.name}-controller-0")
    print("The cluster, its node and the operator stay up; stop them with `e2e/cluster down`.")
    return 0 if final.get("state") == "Succeeded" else 1


def wait_rolled_out(kubectl: Kubectl, namespace: str, deployment: str, timeout: float) -> None:
    """`kubectl rollout status` in short looks: one that times out or fails (an API server
    too busy to answer) is "not yet" until `timeout`."""

    def rolled_out() -> bool:
        result = kubectl("-n", namespace, "rollout", "status", deployment, "--timeout=20s", check=False, timeout=40)
        if result.returncode != 0:
            raise RolloutNotYet(result.stderr.strip() or result.stdout.strip())
        return True

    try:
        poll_until(
            rolled_out, f"{deployment} to roll out", timeout=timeout, interval=2.0, transient=(*SLOW, RolloutNotYet)
        )
    except WaitTimedOut as error:
        raise ClusterError(f"{error}; see `kubectl -n {namespace} describe {deployment}`") from None


class RolloutNotYet(Exception):
    """`kubectl rollout status` returned before the rollout finished."""


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
    except subprocess.TimeoutExpired as error:
        # A one-shot command (an apply, a helm install) that a very busy machine did not finish.
        print(f"error: {describe(error)}; the machine may be overloaded, run `make demo` again", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
