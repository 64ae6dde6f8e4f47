"""A real node lost for longer than the job's pods tolerate: the tiny CPU job (tests/e2e/
test_tiny_job.py) from the trainer image on the package's real nodes, with the operator as its
own process. Its pods tolerate `node.kubernetes.io/unreachable` and `not-ready` (NoExecute)
for TOLERATION_S, as gang jobs set it (the default 300 s keeps a gang waiting 5 minutes for a
dead node). Once a checkpoint exists, every process of the driver's node is frozen (kubelet,
containerd, kube-proxy, their supervisors, the shims and the pods' own processes): the node
stays in the cluster, silent, as a powered-off one does. The node lifecycle controller marks
it unreachable after its grace period (the controller-manager's default), the taint eviction
controller evicts the job's pods there after TOLERATION_S, and the pods stay Terminating (no
kubelet confirms). The operator restarts the gang, deletes the lost pods without their node
once their grace period has passed (a LostPodDeleted Event naming the node), and the new gang
runs on the other node: it resumes from the last checkpoint saved before the stop, nothing
lost beyond it, and the job succeeds with every step in metrics.jsonl once. Then the node
comes back as from a reboot (its pods' processes gone, its daemons resumed) and is Ready for
the package's later tests (docs/reliability.md, "A node lost")."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rlkube_api.names import ANNOTATION_ATTEMPT
from rlkube_e2e import tinyjob
from rlkube_e2e.testing import Kubectl, wait_for
from tests.e2e.real_node_kit import PodLogs, wait_renewed_and_ready

if TYPE_CHECKING:
    from rlkube_e2e.node.node import RealNode
    from tests.e2e.real_node_kit import RealCluster
    from tests.operator.cluster_kit import OperatorProcess

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.slow]

SAVE_FREQ = 5
# Enough steps that the job still trains when the node is stopped right after step
# SAVE_FREQ + 1 (a quiet machine trains ~3 steps a second), few enough for a short resume.
STEPS = 30
TOLERATION_S = 10
# The pods' grace period: the lost ones are deleted without their node once it has passed.
# The old gang cannot save on SIGTERM (its driver is frozen), so a short one loses nothing.
GRACE_S = 5
TIMEOUT = 900.0
TOLERATIONS = [
    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": TOLERATION_S}
    for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
]
ROLE_PODS = ("controller-0", "actor-0", "actor-1", "rollout-0")
RESUMED = re.compile(r"resumed from \S+ \(step (\d+)\)")


def _latest_checkpoint(job: tinyjob.TinyJob) -> int:
    latest = job.checkpoints / "latest"
    return int(latest.read_text().strip().rsplit("_", 1)[-1]) if latest.exists() else 0


def _steps(job: tinyjob.TinyJob) -> list[int]:
    return [int(row["step"]) for row in job.metrics()]


def _placed(kubectl: Kubectl, namespace: str, attempt: int) -> dict[str, str]:
    """The node of each scheduled pod of the gang of `attempt`, by pod name."""
    items = json.loads(kubectl("-n", namespace, "get", "pods", "-o", "json").stdout)["items"]
    return {
        pod["metadata"]["name"]: pod["spec"]["nodeName"]
        for pod in items
        if (pod["metadata"].get("annotations") or {}).get(ANNOTATION_ATTEMPT) == str(attempt)
        and pod["spec"].get("nodeName")
    }


def _node_processes(node: RealNode) -> tuple[set[int], set[int]]:
    """The node's daemons (every process in its mount namespace: the holder, containerd, the
    kubelet, kube-proxy, their supervisors, the shims) and its pods' processes (in its cgroups,
    each container in a mount namespace of its own)."""
    daemons = node._namespace_pids()
    return daemons, node._cgroup_pids() - daemons


def _signal(pids: set[int], number: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, number)


@contextlib.contextmanager
def stopped(node: RealNode) -> Iterator[None]:
    """Every process of `node` frozen (SIGSTOP; swept until no new one appears, so a process
    forked meanwhile is caught); afterwards the node comes back as from a reboot: its pods'
    processes killed while still frozen (none of them writes again), then its daemons resumed."""
    frozen: set[int] = set()
    while True:
        daemons, pods = _node_processes(node)
        new = (daemons | pods) - frozen
        if not new:
            break
        _signal(new, signal.SIGSTOP)
        frozen |= new
    try:
        yield
    finally:
        _, pods = _node_processes(node)
        _signal(pods, signal.SIGKILL)
        _signal(frozen, signal.SIGCONT)


def test_a_node_silent_past_the_pods_toleration_loses_them_and_the_gang_resumes_on_the_other_node(
    real_cluster: RealCluster,
    watching_operator: OperatorProcess,
    real_kubectl: Kubectl,
    real_namespace: str,
    tmp_path: Path,
) -> None:
    kubectl, namespace = real_kubectl, real_namespace
    job = tinyjob.prepare(tmp_path / "work", name="tiny-node-loss", steps=STEPS, save_freq=SAVE_FREQ, pool="real")
    tinyjob.from_image(job, real_cluster.images["trainer-cpu"].ref)
    spec = job.manifest["spec"]
    spec["trainer"]["testFreq"] = -1
    spec["runPolicy"].update(terminationGracePeriodSeconds=GRACE_S, backoffLimit=2)
    for pool in [spec["controller"]["pool"], *(role["pool"] for role in spec["roles"].values())]:
        pool["tolerations"] = TOLERATIONS
    name = job.name

    def _new_gang_placed() -> dict[str, str] | None:
        found = _placed(kubectl, namespace, 1)
        return found if len(found) == len(ROLE_PODS) else None

    with PodLogs(real_cluster.cluster.kubeconfig, namespace, f"{name}-controller-0") as driver_log:
        tinyjob.apply(kubectl, namespace, job)
        try:
            tinyjob.wait_state(kubectl, namespace, name, ("Running",), TIMEOUT)
            wait_for(lambda: _latest_checkpoint(job) >= SAVE_FREQ, f"checkpoint {SAVE_FREQ}", TIMEOUT, interval=0.2)
            where = kubectl("-n", namespace, "get", "pod", f"{name}-controller-0", "-o", "jsonpath={.spec.nodeName}")
            [node] = [node for node in real_cluster.nodes if node.name == where.stdout]
            [other] = [other for other in real_cluster.nodes if other is not node]
            with stopped(node):
                stopped_at = time.monotonic()
                time.sleep(1)  # a write under way when its process stopped has landed
                trained, saved = max(_steps(job)), _latest_checkpoint(job)
                assert trained < STEPS, f"the job ended before its node was stopped: {trained} steps"
                wait_for(
                    lambda: tinyjob.status(kubectl, namespace, name).get("restartCount", 0) >= 1,
                    "the gang restart",
                    TIMEOUT,
                )
                restarted_after = time.monotonic() - stopped_at
                # The new gang's pods, the lost ones' replacements included, all placed.
                placed = wait_for(_new_gang_placed, "the new gang's pods scheduled", TIMEOUT)
                final = tinyjob.wait_state(kubectl, namespace, name, ("Succeeded", "Failed"), TIMEOUT)
                done_after = time.monotonic() - stopped_at
            back = datetime.datetime.now(datetime.UTC)
            wait_renewed_and_ready(real_cluster.cluster.api(), node.name, back, timeout=120)
        except (TimeoutError, AssertionError) as error:
            events = kubectl("-n", namespace, "get", "events", "--sort-by=.lastTimestamp", check=False).stdout
            raise AssertionError(
                f"{error}\nstatus {tinyjob.status(kubectl, namespace, name)}\nevents:\n{events[-4000:]}"
                f"\ndriver log:\n{driver_log.text()[-3000:]}\noperator log:\n{watching_operator.log()[-3000:]}"
            ) from error
        resumed = [int(step) for step in RESUMED.findall(driver_log.text())]
    assert final["state"] == "Succeeded", final
    assert final["restartCount"] == 1, final
    # Nothing lost beyond the last save: the new gang resumed from the checkpoint there was
    # when the node stopped, and trained every later step once.
    assert saved >= SAVE_FREQ and trained - saved <= SAVE_FREQ, (trained, saved)
    assert resumed == [saved], (resumed, saved, driver_log.errors)
    assert _steps(job) == list(range(1, STEPS + 1))
    # The new gang ran on the other node; the old one's pods there were deleted without it.
    assert set(placed.values()) == {other.name}, placed
    events = json.loads(kubectl("-n", namespace, "get", "events", "-o", "json").stdout)["items"]
    lost = [event["message"] for event in events if event["reason"] == "LostPodDeleted"]
    assert lost and all(f"from node {node.name}," in message for message in lost), events
    assert f"{name}-controller-0" in "\n".join(lost), lost
    print(
        f"node loss: {node.name} stopped at step {trained} (checkpoint {saved}); gang restarted "
        f"{restarted_after:.0f} s later, job done {done_after:.0f} s after the stop, resumed from {resumed}"
    )
