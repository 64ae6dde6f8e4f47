"""Elastic rollout capacity on real nodes: the tiny CPU job (its rollout a
separate pod of one vLLM engine) from the trainer image, with the operator as its own process,
trained asynchronously as such jobs are meant to run (`separate_async`, partial rollouts: each
weight push goes into the generation in flight; rollout correction on by default).
While it trains, `spec.roles.rollout.replicas` is patched 1 -> 2 -> 1. The rollout StatefulSet
follows, the new engine joins the weight-sync group (and so generates), the removed one leaves
it, the operator tells each change with a RolloutScaled Event, and the job succeeds with no gang
restart: the driver and actor pods keep their UIDs and every step is in metrics.jsonl once.
Then, still mid-job, the driver's node's kubelet and then its containerd are SIGKILLed (as an
OOM kill or a crash would): each daemon's supervisor starts it again, the node renews its Lease
and is Ready, and the job's pods keep running (same pods, same containers, none restarted) and
training goes on (docs/reliability.md, "A node's kubelet or containerd killed mid-job")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rlkube_api.config import SeparateAsyncConfig
from rlkube_api.names import LABEL_JOB
from rlkube_e2e import tinyjob
from rlkube_e2e.node.node import find_node_binaries
from rlkube_e2e.testing import Kubectl, wait_for
from tests.e2e.real_node_kit import PodLogs, kill_daemon, wait_renewed_and_ready

if TYPE_CHECKING:
    from tests.e2e.real_node_kit import RealCluster
    from tests.operator.cluster_kit import OperatorProcess

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.slow]

STEPS = 200
TIMEOUT = 600.0
# A quiet machine trains the tiny job at about 3 steps a second, faster than a new rollout pod
# starts (a minute or more): while the pace file exists, the job's reward function sleeps this
# long per sample (256 a step), so the scaling happens while it trains; removed afterwards.
PACE_S_PER_SAMPLE = 0.008
PACED_REWARD = f"""
import os
import time

_PACE = "{tinyjob.MOUNT}/pace"


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if os.path.exists(_PACE):
        time.sleep({PACE_S_PER_SAMPLE})
    return _score(data_source, solution_str, ground_truth, extra_info)
"""
SYNC_STEP = SeparateAsyncConfig().parameter_sync_step
STAYING = ("controller-0", "actor-0", "actor-1", "rollout-0")
# What a row says about the pipeline, shown for a step that fell behind it.
LAG_KEYS = (
    "step",
    "training/batch_index",
    "training/rollout_weight_version",
    "training/off_policy/trajectory_staleness_worst/max",
    "training/off_policy/trajectory_spans/max",
    "timing_s/wait_rollout",
    "timing_s/update_weights",
    "timing_s/gen",
)
# The driver's line for each weight-sync group it forms (elastic_rollout.py `_reform`).
GROUP = re.compile(r"weight-sync group (\d+): the actor's ranks and rollout ranks \[([\d, ]*)\]")


def _groups(log: str) -> list[list[int]]:
    return [[int(r) for r in ranks.split(",") if r.strip()] for _, ranks in GROUP.findall(log)]


def _uid(kubectl: Kubectl, namespace: str, pod: str) -> str:
    return kubectl("-n", namespace, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}", check=False).stdout


def _scale(kubectl: Kubectl, namespace: str, name: str, replicas: int) -> None:
    patch = f'{{"spec":{{"roles":{{"rollout":{{"replicas":{replicas}}}}}}}}}'
    kubectl("-n", namespace, "patch", "rljob", name, "--type=merge", "-p", patch)


def _containers(kubectl: Kubectl, namespace: str, name: str) -> dict[str, tuple[str, list[tuple[str, int]]]]:
    """Each of the job's pods by name: its UID, and each container's ID and restart count."""
    pods = json.loads(kubectl("-n", namespace, "get", "pods", "-l", f"{LABEL_JOB}={name}", "-o", "json").stdout)
    return {
        pod["metadata"]["name"]: (
            pod["metadata"]["uid"],
            [(status["containerID"], status["restartCount"]) for status in pod["status"]["containerStatuses"]],
        )
        for pod in pods["items"]
    }


def _kill_node_daemons_mid_job(real: RealCluster, kubectl: Kubectl, namespace: str, job: tinyjob.TinyJob) -> None:
    """SIGKILL the kubelet, then containerd, of the node running the driver while the job trains.
    Containers outlive both, as on any node: each runs under its own containerd shim, which the
    restarted containerd finds again, and the restarted kubelet adopts the running pods. So no
    pod, container or step is lost, and the gang does not restart."""
    name = job.name
    node_name = kubectl("-n", namespace, "get", "pod", f"{name}-controller-0", "-o", "jsonpath={.spec.nodeName}").stdout
    [node] = [node for node in real.nodes if node.name == node_name]
    binaries = find_node_binaries()
    for binary in (binaries.kubelet, binaries.containerd):
        before = _containers(kubectl, namespace, name)
        steps = len(job.metrics())
        _, killed_at = kill_daemon(node, binary)
        wait_renewed_and_ready(real.cluster.api(), node.name, killed_at)

        def trained_on(steps: int = steps) -> bool:  # steps keep coming after the kill
            return len(job.metrics()) >= steps + 2

        wait_for(trained_on, f"2 steps after {binary.name}'s kill", 120, interval=0.5)
        after = _containers(kubectl, namespace, name)
        assert after == before, f"{binary.name} killed: pods or containers changed: before {before}, after {after}"


def _apply_paced(kubectl: Kubectl, namespace: str, job: tinyjob.TinyJob) -> None:
    """The job with the example's reward function behind the pace file (tinyjob.apply's steps)."""
    config_map = tinyjob.reward_config_map(job, namespace)
    ((key, source),) = config_map["data"].items()
    config_map["data"][key] = source.replace("def compute_score(", "def _score(", 1) + PACED_REWARD
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(config_map))
    kubectl("-n", namespace, "apply", "--server-side", "-f", "-", input=json.dumps(job.manifest))


def test_rollout_replicas_scale_while_the_job_trains(
    real_cluster: RealCluster,
    watching_operator: OperatorProcess,
    real_kubectl: Kubectl,
    real_namespace: str,
    tmp_path: Path,
) -> None:
    kubectl, namespace = real_kubectl, real_namespace
    job = tinyjob.prepare(tmp_path / "work", name="tiny-elastic", steps=STEPS, save_freq=STEPS, pool="real")
    tinyjob.from_image(job, real_cluster.images["trainer-cpu"].ref)
    spec = job.manifest["spec"]
    spec.setdefault("trainer", {}).update({"testFreq": -1, "v1": {"trainerMode": "separate_async"}})
    spec["asyncTraining"] = {"partialRollout": True}
    name = job.name
    with PodLogs(real_cluster.cluster.kubeconfig, namespace, f"{name}-controller-0") as driver_log:
        pace = job.host_path(f"{tinyjob.MOUNT}/pace")
        pace.write_text("on\n")
        _apply_paced(kubectl, namespace, job)
        try:
            tinyjob.wait_state(kubectl, namespace, name, ("Running",), TIMEOUT)
            wait_for(lambda: len(job.metrics()) >= 1, "step 1", timeout=TIMEOUT, interval=0.5)
            uids = {pod: _uid(kubectl, namespace, f"{name}-{pod}") for pod in STAYING}

            _scale(kubectl, namespace, name, 2)
            # The new engine is set up, then joins at the next weight push: a group of both ranks.
            wait_for(lambda: [0, 1] in _groups(driver_log.text()), "a weight-sync group with rollout rank 1", TIMEOUT)
            joined_at = len(job.metrics())
            wait_for(lambda: len(job.metrics()) >= joined_at + 2, "2 steps with two engines", TIMEOUT, interval=0.5)

            _scale(kubectl, namespace, name, 1)
            wait_for(lambda: not _uid(kubectl, namespace, f"{name}-rollout-1"), "rollout-1 removed", TIMEOUT)
            # The group is formed again without the removed rank at the next push.
            wait_for(
                lambda: _groups(driver_log.text())[-1] == [0], "a weight-sync group of rollout rank 0 alone", TIMEOUT
            )
            # No gang restart: the pods there before the scaling are the same pods.
            after = {pod: _uid(kubectl, namespace, f"{name}-{pod}") for pod in STAYING}
            assert after == uids, f"pods replaced while scaling: before {uids}, after {after}"
            _kill_node_daemons_mid_job(real_cluster, kubectl, namespace, job)
            assert len(job.metrics()) < STEPS, "the job ended before the scaling was checked: pace it more"
            pace.unlink()
            final = tinyjob.wait_state(kubectl, namespace, name, ("Succeeded", "Failed"), TIMEOUT)
        except (TimeoutError, AssertionError) as error:
            events = kubectl("-n", namespace, "get", "events", "--sort-by=.lastTimestamp", check=False).stdout
            raise AssertionError(
                f"{error}\nstatus {tinyjob.status(kubectl, namespace, name)}\nevents:\n{events[-3000:]}"
                f"\ndriver log:\n{driver_log.text()[-4000:]}\noperator log:\n{watching_operator.log()[-3000:]}"
            ) from error
        finally:
            # The whole driver log, for a failure found after it (a restart shows only in the status).
            (tmp_path / "driver.log").write_text(driver_log.text())
    assert final["state"] == "Succeeded", final
    assert final.get("restartCount", 0) == 0, final
    assert final["progress"]["step"] == STEPS
    rows = job.metrics()
    assert [int(row["step"]) for row in rows] == list(range(1, STEPS + 1))
    # Off-policy within the bound (the default max_off_policy_threshold, 8: a trajectory's oldest
    # token at most 7 versions behind), corrected with the engines' own log-probs.
    assert max(row["training/off_policy/trajectory_staleness_worst/max"] for row in rows) <= 7
    # The pipeline the schedule promises with verl's default parameter_sync_step (4), which the
    # job keeps: the engine holds weights at most 3 updates older than the actor's when a batch
    # trains (the actor at step - 1), and no sample began more than 4 updates before it trains,
    # whichever engines came and went (a push due mid-generation goes into it).
    late = [
        {key: row.get(key) for key in LAG_KEYS}
        for row in rows
        if row["step"] - 1 - row["training/rollout_weight_version"] > SYNC_STEP - 1
        or row["training/off_policy/trajectory_staleness_worst/max"] > SYNC_STEP
    ]
    assert not late, late
    pushes = [row["step"] for row in rows if row["timing_s/update_weights"] > 0]
    assert len(pushes) >= STEPS // SYNC_STEP - 1, pushes
    assert all("rollout_corr/rollout_is_mean" in row for row in rows), sorted(rows[-1])
    assert "resumed from" not in driver_log.text()
    events = kubectl("-n", namespace, "get", "events", "--field-selector", f"involvedObject.name={name}").stdout
    scaled = [line for line in events.splitlines() if "RolloutScaled" in line]
    assert any("1 -> 2" in line for line in scaled) and any("2 -> 1" in line for line in scaled), events
    assert "PodFailed" not in events, events
