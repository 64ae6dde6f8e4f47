"""Faults on the local cluster, with the operator as its own process (as a cluster runs it):

- the operator SIGKILLed at random points (seeded) while it reconciles 20 new jobs, and
  pods failing while it is down: it converges, every job Running at the restart count its
  failures call for, no child duplicated or recreated, no status lost;
- the API server restarted under a running job: the operator reconnects and carries on
  (it sees a pod fail afterwards, and a job created afterwards);
- a node deleted under a running job: its pods go, the gang restarts on the node left.

The last two break a control plane, so they get one of their own (`own_control_plane`,
shared by both, up once for the module), never the session's that every other test uses.

`make test` kills the operator RLKUBE_FAULT_KILLS=3 times; `make faults` 10 times, with
the counts in docs/reliability.md. RLKUBE_FAULT_SEED picks the kill points.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rlkube_api.names import ANNOTATION_ATTEMPT
from rlkube_e2e import processes
from rlkube_e2e.cluster import LocalCluster
from rlkube_e2e.pools import MANAGED_BY_LABEL, POOL_LABEL, NodePool
from rlkube_e2e.state import ClusterState
from rlkube_e2e.testing import Kubectl, local_cluster, namespace_for_test, wait_for
from tests.operator.cluster_kit import (
    TINY_PODS,
    Jobs,
    Obj,
    OperatorProcess,
    attempt,
    condition,
    install_rljob_crd,
    is_true,
    ready,
    tiny_job,
)

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from rlkube_e2e.testing import ClusterInfo

pytestmark = pytest.mark.cluster

KILLS = int(os.environ.get("RLKUBE_FAULT_KILLS", "3"))
SEED = int(os.environ.get("RLKUBE_FAULT_SEED", "18"))
JOBS = 20
# Children every job has (StatefulSets are checked apart): kinds the operator always makes.
ROLE_SETS = 3  # controller, actor, rollout

# One node for the jobs of the API-server test; the node-deletion test makes its own.
OWN_POOLS = Path(__file__).with_name("fault-pools.yaml")
# Bounds for a loaded 2-core machine; each wait ends as soon as its condition holds.
SLOW = 180.0


@contextlib.contextmanager
def _operator_running(namespace: str, kubeconfig: Path, log: Path) -> Iterator[OperatorProcess]:
    process = OperatorProcess(namespace, kubeconfig, log)
    process.start()
    process.wait_started(timeout=SLOW)
    try:
        yield process
    finally:
        process.stop()
        print(f"--- operator log (last 3000 characters)\n{process.log()[-3000:]}")


@pytest.fixture
def operator_process(
    cluster: ClusterInfo, rljob_crd: None, namespace: str, tmp_path: Path, no_session_operator: None
) -> Iterator[OperatorProcess]:
    with _operator_running(namespace, cluster.kubeconfig, tmp_path / "operator.log") as process:
        yield process


@dataclass(frozen=True)
class ControlPlane:
    """A control plane of these tests' own: etcd, kube-apiserver, controller-manager,
    scheduler and kwok on ports and in a state dir of their own, with the RLJob CRD. The
    session's shared one is never restarted or loses a node under the other tests."""

    local: LocalCluster
    kube: ApiClient
    kubectl: Kubectl
    started_in: float


@pytest.fixture(scope="module")
def own_control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    from kubernetes import config  # noqa: PLC0415

    state_dir = tmp_path_factory.mktemp("faults-cluster")
    failed_before = request.session.testsfailed
    started = time.monotonic()
    with local_cluster(state_dir, OWN_POOLS, keep_state=False) as info:
        assert info.local is not None
        kubectl = Kubectl(info.kubeconfig)
        install_rljob_crd(kubectl)
        kube = config.new_client_from_config(config_file=str(info.kubeconfig))
        plane = ControlPlane(info.local, kube, kubectl, time.monotonic() - started)
        print(f"faults: own control plane up in {plane.started_in:.1f} s")
        try:
            yield plane
        finally:
            kube.close()
            # Read now: the API-server restart changed a process id.
            state = ClusterState.load(info.local.layout.state_file)
            if request.session.testsfailed > failed_before:
                # The state dir goes with the control plane; its logs are worth keeping.
                shutil.copytree(info.local.logs_dir, tmp_path_factory.mktemp("faults-cluster-logs"), dirs_exist_ok=True)
    # Torn down whole: no process left (their ports went with them), no file.
    assert state is not None
    left = [r.name for r in state.processes if processes.is_running(r.pid, r.binary)]
    assert not left, f"processes of the faults' control plane still running: {left}"
    assert not state_dir.exists(), f"{state_dir} left behind: {sorted(p.name for p in state_dir.iterdir())}"


@pytest.fixture
def own_namespace(own_control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    from kubernetes.client import CoreV1Api  # noqa: PLC0415

    with namespace_for_test(CoreV1Api(own_control_plane.kube), request.node.name, {}) as name:
        yield name


@pytest.fixture
def own_operator(own_control_plane: ControlPlane, own_namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator as its own process, on the faults' own control plane (the session's
    in-process operator watches the session's cluster only: nothing to pause)."""
    kubeconfig = own_control_plane.local.kubeconfig
    with _operator_running(own_namespace, kubeconfig, tmp_path / "operator.log") as process:
        yield process


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
    own_control_plane: ControlPlane, own_namespace: str, own_operator: OperatorProcess
) -> None:
    namespace = own_namespace
    jobs = Jobs(own_control_plane.kube, own_control_plane.kubectl, namespace)
    jobs.create(tiny_job("before", namespace))
    jobs.wait_running("before", timeout=SLOW)
    jobs.wait_pods("before", TINY_PODS, timeout=SLOW)

    unreachable = own_control_plane.local.restart_apiserver(down_seconds=5.0, timeout=SLOW)
    assert own_operator.running, own_operator.log()[-3000:]
    settled = _runs_a_pod(own_control_plane, namespace)
    # Its watches came back: a pod failure and a new job, both after the restart, are acted on.
    jobs.fail_pod("before-actor-0")
    try:
        job = jobs.wait_running("before", restarts=1, timeout=SLOW)
    except AssertionError as error:
        raise AssertionError(f"{str(error)[:3000]}\n{_story(jobs, 'before')}") from None
    jobs.wait_pods("before", TINY_PODS, at_attempt=1, timeout=SLOW)
    jobs.create(tiny_job("after", namespace))
    jobs.wait_running("after", timeout=SLOW)
    # What stays: the restart counted once, its Event written after the restart.
    assert job["status"]["restartCount"] == 1
    failures = [e["message"] for e in jobs.events("before") if e.get("reason") == "PodFailed"]
    assert len(failures) == 1 and "before-actor-0" in failures[0], failures
    assert own_operator.running
    assert own_operator.starts == 1  # the same process throughout
    print(
        f"faults: API server unreachable for {unreachable:.1f} s, a new pod Ready {settled:.1f} s later;"
        " the operator carried on"
    )


def _runs_a_pod(plane: ControlPlane, namespace: str) -> float:
    """Until the control plane schedules and runs a pod again. Its scheduler and kwok
    re-list everything after an API server restart; a gang restart begun meanwhile twice
    left the new gang unready for minutes, and the next test's pods too, with the scheduler
    logging its cache "corrupted": a kube-scheduler matter, not the operator's, which is
    what this test is about."""
    from kubernetes.client import CoreV1Api  # noqa: PLC0415

    started = time.monotonic()
    core = CoreV1Api(plane.kube)
    pod = {"metadata": {"name": "probe"}, "spec": {"containers": [{"name": "c", "image": "probe"}]}}
    core.create_namespaced_pod(namespace, pod)
    wait_for(
        lambda: ready(plane.kube.sanitize_for_serialization(core.read_namespaced_pod("probe", namespace))),  # type: ignore[no-untyped-call]
        "a pod made after the API server restart to be Ready",
        timeout=SLOW,
    )
    core.delete_namespaced_pod("probe", namespace, grace_period_seconds=0)
    return time.monotonic() - started


def _story(jobs: Jobs, name: str) -> str:
    """What a user would look at when a wait fails: the job's Events and its pods."""
    events = sorted(jobs.events(name), key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    lines = [f"  {e.get('lastTimestamp')} {e['reason']} x{e.get('count', 1)}: {e['message']}" for e in events]
    for pod in jobs.pods(name, include_deleting=True):
        meta, status = pod["metadata"], pod.get("status") or {}
        conditions = ",".join(f"{c['type']}={c['status']}" for c in status.get("conditions") or [])
        deleting = " deleting" if meta.get("deletionTimestamp") else ""
        lines.append(
            f"  pod {meta['name']} uid {meta['uid'][:8]} attempt {attempt(pod)} on {pod['spec'].get('nodeName')}:"
            f" {status.get('phase')}{deleting} [{conditions}]"
        )
    return "\n".join(lines)


def _fault_nodes(pool: str, count: int) -> list[Obj]:
    """kwok Nodes of a pool of their own (not managed by the cluster's pools file)."""
    nodes = NodePool(pool, count, {"cpu": "32", "memory": "128Gi", "pods": "110"}, {}).node_manifests(pool_index=40)
    for node in nodes:
        node["status"]["allocatable"] = node["status"]["capacity"]
        node["metadata"]["labels"].pop(MANAGED_BY_LABEL)
    return nodes


def test_a_node_deleted_under_a_running_job_restarts_the_gang_elsewhere(
    own_control_plane: ControlPlane, own_namespace: str, own_operator: OperatorProcess
) -> None:
    from kubernetes.client import CoreV1Api  # noqa: PLC0415

    kube, kubectl, namespace = own_control_plane.kube, own_control_plane.kubectl, own_namespace
    core = CoreV1Api(kube)
    pool = f"fault-{namespace[-6:]}"
    nodes = _fault_nodes(pool, 2)
    for node in nodes:
        kubectl("create", "-f", "-", input=json.dumps(node))
    try:
        selector: dict[str, Any] = {"nodeSelector": {POOL_LABEL: pool}}
        # One counted restart to spare, for the pod garbage collector's race (below); the
        # node's own loss must be a disruption, not counted against the limit.
        overrides: dict[str, Any] = {"spec.controller.pool": selector, "spec.runPolicy.backoffLimit": 1}
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
            timeout=SLOW,
        )
        jobs.create(tiny_job("node-lost", namespace, overrides))
        jobs.wait_running("node-lost", timeout=SLOW)
        pods = jobs.wait_pods("node-lost", TINY_PODS, timeout=SLOW)
        victim = next(p for p in pods if p["metadata"]["name"] == "node-lost-actor-0")["spec"]["nodeName"]
        lost = sorted(p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] == victim)
        # The node goes, as a scaled-down or failed cloud node does: the pod garbage
        # collector deletes its pods, the StatefulSets replace them, the gang restarts.
        started = time.monotonic()
        core.delete_node(victim)

        # The pod garbage collector waits 40 s before it deletes a lost node's pods. It marks
        # them failed and deletes them by name, from its cache: a StatefulSet's successor of
        # the same name, made at once, can go the same way (and a kwok node then reports it
        # as plainly deleted), which restarts the gang once more, counted.
        def running_again(job: Obj) -> bool:
            status = job.get("status") or {}
            running = status.get("state") == "Running" and is_true(job, "Running")
            return running and status.get("restartCount", 0) in (1, 2)

        try:
            job = jobs.wait(
                "node-lost",
                running_again,
                "state Running after 1 restart (2 after the garbage collector's race)",
                SLOW + 60,
            )
        except AssertionError as error:
            raise AssertionError(f"{str(error)[:3000]}\n{_story(jobs, 'node-lost')}") from None
        restarts = job["status"]["restartCount"]
        pods = jobs.wait_pods("node-lost", TINY_PODS, at_attempt=restarts, timeout=SLOW)
        events = [(e["reason"], e["message"]) for e in jobs.events("node-lost")]
        print(
            f"faults: node {victim} deleted under pods {lost}; gang Running again after"
            f" {time.monotonic() - started:.1f} s; Events {events}; restarts {job['status'].get('restartCount')},"
            f" uncounted {job['status'].get('uncountedRestarts')}"
        )
        assert {p["spec"]["nodeName"] for p in pods} == {n["metadata"]["name"] for n in nodes} - {victim}
        # What stays: one restart, not counted, its Event naming a pod lost with the node;
        # at most one more, counted, for a successor the garbage collector took by its name.
        disrupted = [m for r, m in events if r == "PodDisrupted"]
        assert len(disrupted) == 1 and any(name in disrupted[0] for name in lost), (events, job["status"])
        assert "its node lost" in disrupted[0]
        assert job["status"].get("uncountedRestarts") == 1, job["status"]
        if restarts == 2:
            [taken] = [m for r, m in events if r == "PodFailed"]
            assert "deleted while the job ran" in taken and any(f"pod {name} " in taken for name in lost), events
    finally:
        kubectl("delete", "rljobs", "--all", "-n", namespace, "--wait=false")
        for node in nodes:
            kubectl("delete", "node", node["metadata"]["name"], "--ignore-not-found", "--wait=false")
