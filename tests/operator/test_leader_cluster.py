"""Two replicas, one active: two real operator processes (`python -m rlkube_operator
--leader-elect`) against the local control plane. The one holding the Lease runs the job;
killed (SIGKILL, no chance to hand the Lease back) while a pod fails, the other takes the
Lease over and restarts the gang: once, with the same children, and with the status the
first one wrote kept. The take-over time is printed (docs/benchmarks.md), never asserted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rlkube_e2e.testing import wait_for
from tests.operator.cluster_kit import TINY_PODS, Jobs, attempt, condition, tiny_job

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from rlkube_e2e.testing import ClusterInfo, Kubectl

pytestmark = pytest.mark.cluster

JOB = "failover"
LEASE = "rlkube-operator-leader"
# Well within the kubelet's default terminationGracePeriodSeconds (30).
STOP_SECONDS = 15


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica:
    """One operator process, as the chart runs it (leader election on, one namespace)."""

    def __init__(self, identity: str, namespace: str, kubeconfig: Path, logs: Path) -> None:
        self.identity = identity
        self.log_path = logs / f"{identity}.log"
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        args = ["-n", namespace, "--leader-elect", "--lease-namespace", namespace, "--identity", identity]
        args += ["--metrics-port", "0", "--health-port", str(_free_port())]
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rlkube_operator", *args], env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def log(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def replicas(
    cluster: ClusterInfo, rljob_crd: None, namespace: str, tmp_path: Path, no_session_operator: None
) -> Iterator[list[Replica]]:
    started = [Replica(name, namespace, cluster.kubeconfig, tmp_path) for name in ("replica-a", "replica-b")]
    try:
        yield started
    finally:
        for replica in started:
            replica.stop()
        for replica in started:
            print(f"--- {replica.identity}\n{replica.log()[-3000:]}")


def lease_holder(kube: ApiClient, namespace: str) -> str | None:
    from kubernetes.client import CoordinationV1Api  # noqa: PLC0415
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    try:
        lease = CoordinationV1Api(kube).read_namespaced_lease(LEASE, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return lease.spec.holder_identity if lease.spec else None


def lease_transitions(kube: ApiClient, namespace: str) -> int:
    from kubernetes.client import CoordinationV1Api  # noqa: PLC0415

    lease = CoordinationV1Api(kube).read_namespaced_lease(LEASE, namespace)
    return int(lease.spec.lease_transitions or 0) if lease.spec else 0


def test_killing_the_active_replica_hands_the_running_job_to_the_other(
    kube: ApiClient, kubectl: Kubectl, namespace: str, replicas: list[Replica]
) -> None:
    jobs = Jobs(kube, kubectl, namespace)
    holder = wait_for(lambda: lease_holder(kube, namespace), "a replica to take the Lease", timeout=120)
    active = next(r for r in replicas if r.identity == holder)
    standby = next(r for r in replicas if r is not active)

    jobs.create(tiny_job(JOB, namespace))
    before = jobs.wait_running(JOB, timeout=60)
    jobs.wait_pods(JOB, TINY_PODS)
    children = jobs.child_uids(JOB)
    assert lease_holder(kube, namespace) == active.identity
    assert "holding Lease" not in standby.log()  # the standby never held it, so never reconciled

    active.kill()
    killed = time.monotonic()
    jobs.fail_pod(f"{JOB}-actor-0")  # while nobody is active: the StatefulSet replaces it unwatched
    wait_for(lambda: lease_holder(kube, namespace) == standby.identity, "the standby to take the Lease", 60)
    took_over = time.monotonic() - killed
    jobs.wait(JOB, lambda j: (j.get("status") or {}).get("restartCount") == 1, "the gang restart", timeout=60)
    acted = time.monotonic() - killed
    print(f"take-over: Lease after {took_over:.1f} s, gang restart in the status after {acted:.1f} s")

    after = jobs.wait_running(JOB, restarts=1, timeout=60)
    pods = jobs.wait_pods(JOB, TINY_PODS, at_attempt=1, timeout=60)
    # No child duplicated or recreated: the same objects, one StatefulSet per role.
    assert jobs.child_uids(JOB) == children
    assert len(jobs.statefulsets(JOB)) == len(children_of_kind(children, "StatefulSet"))
    assert all(attempt(p) == 1 for p in pods)
    # No status lost: what the first replica wrote is where the second went on from.
    assert after["status"]["restartCount"] == 1
    assert after["status"]["startTime"] == before["status"]["startTime"]
    created_before, created_after = condition(before, "Created"), condition(after, "Created")
    assert created_before is not None and created_after is not None
    assert created_after["lastTransitionTime"] == created_before["lastTransitionTime"]
    assert [e["reason"] for e in jobs.events(JOB)].count("PodFailed") == 1


def children_of_kind(children: dict[str, str], kind: str) -> list[str]:
    return [key for key in children if key.startswith(f"{kind}/")]


def test_a_stopped_replica_exits_at_once_and_hands_the_lease_back(
    kube: ApiClient, namespace: str, replicas: list[Replica]
) -> None:
    """SIGTERM (a rollout, a drain) ends the process well within the kubelet's 30 s grace and
    frees the Lease, so the standby takes over at its next look (every second) instead of
    waiting for it to expire, and the Lease counts the change of holder."""
    wait_for(lambda: lease_holder(kube, namespace) is not None, "a replica to take the Lease", timeout=120)
    holder = next(r for r in replicas if r.identity == lease_holder(kube, namespace))
    standby = next(r for r in replicas if r is not holder)
    transitions = lease_transitions(kube, namespace)
    began = time.monotonic()
    holder.process.terminate()
    holder.process.wait(STOP_SECONDS)
    assert "released Lease" in holder.log()
    released = time.monotonic()
    # The Lease's duration is 10 s: taking it sooner shows the hand-back was used, not expiry.
    wait_for(lambda: lease_holder(kube, namespace) == standby.identity, "the standby to take the Lease", timeout=6)
    print(f"stopped in {released - began:.1f} s, taken over {time.monotonic() - released:.1f} s after")
    assert lease_transitions(kube, namespace) == transitions + 1
