"""Faults on the local cluster, with the operator as its own process (as a cluster runs it):

- the operator SIGKILLed at random points (seeded) while it reconciles 20 new jobs, and
  pods failing while it is down: it converges, every job Running at the restart count its
  failures call for, no child duplicated or recreated, no status lost;
- the API server restarted under a running job: the operator reconnects and carries on
  (it sees a pod fail afterwards, and a job created afterwards);
- a node deleted under a running job: its pods go, the gang restarts on the node left.

`make test` kills the operator RLKUBE_FAULT_KILLS=3 times; `make faults` 10 times, with
the counts in docs/reliability.md. RLKUBE_FAULT_SEED picks the kill points.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rlkube_api.names import ANNOTATION_ATTEMPT
from rlkube_e2e.pools import MANAGED_BY_LABEL, POOL_LABEL, NodePool
from rlkube_e2e.testing import wait_for
from tests.operator.cluster_kit import (
    TINY_PODS,
    Jobs,
    Obj,
    OperatorProcess,
    attempt,
    condition,
    is_true,
    ready,
    tiny_job,
)

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from rlkube_e2e.testing import ClusterInfo, Kubectl

pytestmark = pytest.mark.cluster

KILLS = int(os.environ.get("RLKUBE_FAULT_KILLS", "3"))
SEED = int(os.environ.get("RLKUBE_FAULT_SEED", "18"))
JOBS = 20
# Children every job has (StatefulSets are checked apart): kinds the operator always makes.
ROLE_SETS = 3  # controller, actor, rollout


# The faults of the session's shared control plane (the API server restarted, a Node deleted)
# run only in `make faults`.
SHARED_CLUSTER_FAULTS = "RLKUBE_FAULT_CLUSTER"


@pytest.fixture
def operator_process(
    cluster: ClusterInfo, rljob_crd: None, namespace: str, tmp_path: Path, no_session_operator: None
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(namespace, cluster.kubeconfig, tmp_path / "operator.log")
    process.start()
    process.wait_started()
    try:
        yield process
    finally:
        process.stop()
        print(f"--- operator log (last 3000 characters)\n{process.log()[-3000:]}")


def _settled(job: Obj, restarts: int) -> bool:
    status = job.get("status") or {}
    return status.get("state") == "Running" and is_true(job, "Running") and status.get("restartCount", 0) == restarts


def _gang_ready(jobs: Jobs, name: str, restarts: int) -> list[Obj] | None:
    """The job's pods when exactly its gang is there: TINY_PODS, all Ready, of the attempt."""
    pods = jobs.pods(name, include_deleting=True)
    good = [p for p in pods if ready(p) and attempt(p) == restarts and not p["metadata"].get("deletionTimestamp")]
    return pods if len(good) == len(pods) == TINY_PODS else None


def _reconcile_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "reconcile of" in line and "failed" in line]


def test_operator_killed_at_random_points_converges(
    kube: ApiClient, kubectl: Kubectl, namespace: str, operator_process: OperatorProcess
) -> None:
    rng = random.Random(SEED)
    jobs = Jobs(kube, kubectl, namespace)
    names = [f"k{i:02d}" for i in range(JOBS)]
    for name in names:
        jobs.create(tiny_job(name, namespace))
    expected = dict.fromkeys(names, 0)
    # What the status first said, per job: kept across every kill.
    first: dict[str, tuple[str, str]] = {}
    children: dict[str, dict[str, str]] = {}
    failed_up = failed_down = 0
    kill_points: list[float] = []
    running_at_kills: list[int] = []

    def remember(name: str, job: Obj) -> None:
        status = job.get("status") or {}
        created = condition(job, "Created")
        if name not in first and status.get("startTime") and created is not None:
            first[name] = (status["startTime"], created["lastTransitionTime"])

    def a_running_gang() -> tuple[str, list[Obj]] | None:
        for name in rng.sample(names, len(names)):
            job = jobs.get(name)
            remember(name, job)
            pods = _gang_ready(jobs, name, expected[name]) if _settled(job, expected[name]) else None
            if pods is not None:
                return name, pods
        return None

    def fail_one(found: tuple[str, list[Obj]]) -> None:
        name, pods = found
        jobs.fail_pod(rng.choice(pods)["metadata"]["name"])
        expected[name] += 1

    for kill in range(KILLS):
        operator_process.wait_started()
        late = kill >= KILLS // 2
        if late:
            # The later half hits an operator with running gangs, inside a restart it handles.
            wait_for(
                lambda: sum(_settled(jobs.get(n), expected[n]) for n in names) >= JOBS // 2,
                "half the jobs Running",
                timeout=180,
                interval=1,
            )
        # The first half: anywhere in the first passes over the 20 new jobs.
        delay = rng.uniform(0.0, 3.0 if late else 8.0)
        time.sleep(delay)
        if late and (found := a_running_gang()) is not None:
            fail_one(found)
            failed_up += 1
            pause = rng.uniform(0.0, 1.5)  # from the failure to the kill: somewhere in its restart
            time.sleep(pause)
            delay += pause
        kill_points.append(round(delay, 2))
        operator_process.kill()
        running_at_kills.append(sum(_settled(jobs.get(n), expected[n]) for n in names))
        # While nobody watches, half the time: a pod of a running gang fails (its StatefulSet replaces it).
        if rng.random() < 0.5 and (found := a_running_gang()) is not None:
            fail_one(found)
            failed_down += 1
        for name in names:
            children.setdefault(name, {}).update(jobs.child_uids(name))
        operator_process.start()

    def converged() -> bool:
        return all(_settled(jobs.get(n), expected[n]) and _gang_ready(jobs, n, expected[n]) for n in names)

    try:
        wait_for(converged, f"all {JOBS} jobs Running at their restart counts {expected}", timeout=240, interval=1)
    except AssertionError:
        states = {n: (jobs.get(n).get("status") or {}) for n in names}
        lagging = {n: s for n, s in states.items() if not _settled(jobs.get(n), expected[n])}
        raise AssertionError(f"kill points {kill_points}; not converged: {json.dumps(lagging)[:4000]}") from None

    for name in names:
        job = jobs.get(name)
        status = job["status"]
        # No status lost: the restart count says every failure once, the first times stay.
        assert status["restartCount"] == expected[name], name
        assert status["observedGeneration"] == job["metadata"]["generation"]
        if name in first:
            created = condition(job, "Created")
            assert created is not None
            assert (status["startTime"], created["lastTransitionTime"]) == first[name], name
        # No child duplicated or recreated: one StatefulSet per role, each child made once.
        now = jobs.child_uids(name)
        assert len([k for k in now if k.startswith("StatefulSet/")]) == ROLE_SETS
        assert {k: now[k] for k in children[name]} == children[name], f"{name}: a child was recreated"
        for obj in jobs.children(name).values():
            owners = [o for o in obj["metadata"].get("ownerReferences") or [] if o.get("controller")]
            assert [o["uid"] for o in owners] == [job["metadata"]["uid"]], obj["metadata"]["name"]
        assert len(jobs.pods(name, include_deleting=True)) == TINY_PODS
    assert len({tuple(sorted(jobs.child_uids(n))) for n in names}) == JOBS  # every job its own children
    errors = _reconcile_errors(operator_process.log())
    print(
        f"faults: {KILLS} operator kills (SIGKILL after {kill_points} s), {failed_up} pods failed just before a kill,"
        f" {failed_down} while it was down,"
        f" jobs Running at each kill {running_at_kills},"
        f" {JOBS} jobs converged, restarts {sum(expected.values())}, reconcile errors {len(errors)}"
    )
    assert not errors, errors[:5]


def test_a_restart_begun_by_a_killed_operator_is_taken_up(
    kube: ApiClient, kubectl: Kubectl, namespace: str, operator_process: OperatorProcess
) -> None:
    """The kill point no random one is likely to hit: after a pass applied a restart's new
    templates and deleted the old gang, before its status write. Made by hand, as that pass
    would leave it; the next operator finishes that restart instead of re-applying the old
    templates and waiting for a gang that never comes."""
    jobs = Jobs(kube, kubectl, namespace)
    jobs.create(tiny_job("lost-write", namespace))
    jobs.wait_running("lost-write", timeout=60)
    old = jobs.wait_pods("lost-write", TINY_PODS)
    operator_process.kill()
    for name in jobs.statefulsets("lost-write"):
        patch = {"spec": {"template": {"metadata": {"annotations": {ANNOTATION_ATTEMPT: "1"}}}}}
        kubectl("-n", namespace, "patch", "statefulset", name, "--type=merge", "-p", json.dumps(patch))
    for pod in old:
        kubectl("-n", namespace, "delete", "pod", pod["metadata"]["name"], "--wait=false")
    jobs.wait_pods("lost-write", TINY_PODS, at_attempt=1, timeout=60)  # the new gang, unwatched
    assert jobs.get("lost-write")["status"]["restartCount"] == 0
    operator_process.start()
    job = jobs.wait_running("lost-write", restarts=1, timeout=60)
    assert condition(job, "Restarting") is not None
    pods = jobs.wait_pods("lost-write", TINY_PODS, at_attempt=1, timeout=30)
    assert {p["metadata"]["uid"] for p in pods}.isdisjoint(p["metadata"]["uid"] for p in old)
    assert "RestartTakenUp" in [e["reason"] for e in jobs.events("lost-write")]


def test_the_operator_reconnects_after_the_api_server_restarts(
    cluster: ClusterInfo, kube: ApiClient, kubectl: Kubectl, namespace: str, operator_process: OperatorProcess
) -> None:
    if cluster.local is None:
        pytest.skip("restarts the session's own control plane (RLKUBE_KUBECONFIG points elsewhere)")
    if os.environ.get(SHARED_CLUSTER_FAULTS) != "1":
        # The restart is of the session's shared API server: on CI's 2 cores it took long
        # enough once that the tests after it failed too. `make faults` runs it.
        pytest.skip(f"restarts the session's shared API server: run by `make faults` ({SHARED_CLUSTER_FAULTS}=1)")
    jobs = Jobs(kube, kubectl, namespace)
    jobs.create(tiny_job("before", namespace))
    jobs.wait_running("before", timeout=60)
    jobs.wait_pods("before", TINY_PODS)

    unreachable = cluster.local.restart_apiserver(down_seconds=5.0)
    assert operator_process.running, operator_process.log()[-3000:]
    # Its watches came back: a pod failure and a new job, both after the restart, are acted on.
    jobs.fail_pod("before-actor-0")
    jobs.wait_running("before", restarts=1, timeout=120)
    jobs.wait_pods("before", TINY_PODS, at_attempt=1, timeout=60)
    jobs.create(tiny_job("after", namespace))
    jobs.wait_running("after", timeout=120)
    assert operator_process.running
    print(f"faults: API server unreachable for {unreachable:.1f} s; the operator carried on")


def _fault_nodes(pool: str, count: int) -> list[Obj]:
    """kwok Nodes of a pool of their own (not managed by the cluster's pools file)."""
    nodes = NodePool(pool, count, {"cpu": "32", "memory": "128Gi", "pods": "110"}, {}).node_manifests(pool_index=40)
    for node in nodes:
        node["status"]["allocatable"] = node["status"]["capacity"]
        node["metadata"]["labels"].pop(MANAGED_BY_LABEL)
    return nodes


def test_a_node_deleted_under_a_running_job_restarts_the_gang_elsewhere(
    kube: ApiClient, kubectl: Kubectl, namespace: str, operator_process: OperatorProcess
) -> None:
    if os.environ.get(SHARED_CLUSTER_FAULTS) != "1":
        # Deletes a Node of the session's shared cluster; it failed in a CI run on 2 cores
        # (it passed alone). `make faults` runs it.
        pytest.skip(f"deletes a node of the session's shared cluster: run by `make faults` ({SHARED_CLUSTER_FAULTS}=1)")
    from kubernetes.client import CoreV1Api  # noqa: PLC0415

    core = CoreV1Api(kube)
    pool = f"fault-{namespace[-6:]}"
    nodes = _fault_nodes(pool, 2)
    for node in nodes:
        kubectl("create", "-f", "-", input=json.dumps(node))
    try:
        selector: dict[str, Any] = {"nodeSelector": {POOL_LABEL: pool}}
        overrides = {"spec.controller.pool": selector}
        overrides |= {f"spec.roles.{role}.pool": selector for role in ("actor", "rollout")}
        jobs = Jobs(kube, kubectl, namespace)
        wait_for(
            lambda: all(
                any(
                    c.type == "Ready" and c.status == "True"
                    for c in core.read_node(n["metadata"]["name"]).status.conditions or []
                )
                for n in nodes
            ),
            "the fault pool's nodes to be Ready",
            timeout=60,
        )
        jobs.create(tiny_job("node-lost", namespace, overrides))
        jobs.wait_running("node-lost", timeout=60)
        pods = jobs.wait_pods("node-lost", TINY_PODS)
        victim = next(p for p in pods if p["metadata"]["name"] == "node-lost-actor-0")["spec"]["nodeName"]
        lost = sorted(p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] == victim)
        # The node goes, as a scaled-down or failed cloud node does: the pod garbage
        # collector deletes its pods, the StatefulSets replace them, the gang restarts.
        started = time.monotonic()
        core.delete_node(victim)
        job = jobs.wait_running("node-lost", restarts=1, timeout=180)
        pods = jobs.wait_pods("node-lost", TINY_PODS, at_attempt=1, timeout=60)
        print(
            f"faults: node {victim} deleted under pods {lost}; gang Running again after {time.monotonic() - started:.1f} s"
        )
        assert {p["spec"]["nodeName"] for p in pods} == {n["metadata"]["name"] for n in nodes} - {victim}
        failures = [e["message"] for e in jobs.events("node-lost") if e.get("reason") == "PodFailed"]
        assert len(failures) == 1 and any(name in failures[0] for name in lost), failures
        assert job["status"]["restartCount"] == 1
    finally:
        kubectl("delete", "rljobs", "--all", "-n", namespace, "--wait=false")
        for node in nodes:
            kubectl("delete", "node", node["metadata"]["name"], "--ignore-not-found", "--wait=false")
