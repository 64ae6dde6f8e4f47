"""Kueue admits a gang whole or not at all: the real Kueue controller (v0.17, built from its Go
module by `e2e/toolchain.sh kueue`) runs on this machine against the session's cluster, and
the operator runs the tiny job with `gang.scheduler: kueue`.

Kueue is scoped to the namespaces these tests label (e2e/rlkube_e2e/kueue.py): the rest of the
shared cluster never meets its webhooks. Each test gets its own ClusterQueue, sized for it, and
a LocalQueue in its namespace."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlkube_e2e.kueue import KueueController
from rlkube_e2e.testing import Kubectl, wait_for
from tests.operator.cluster_kit import TINY_PODS, Jobs, Obj, condition, tiny_job

pytestmark = pytest.mark.cluster

KUEUE_API = "kueue.x-k8s.io/v1beta2"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
FLAVOR = "rlkube-test-default"
LOCAL_QUEUE = "team"
# Every pod of the tiny job asks for one CPU: the gang needs TINY_PODS.
ONE_CPU = {"cpu": "1"}
KUEUE_JOB = {
    "spec.runPolicy.gang": {"scheduler": "kueue", "queue": LOCAL_QUEUE},
    "spec.controller.resources": {"cpu": "1", "memory": "1Gi"},
    "spec.roles.actor.resources": ONE_CPU,
    "spec.roles.rollout.resources": ONE_CPU,
    # Short, to show that a queue's wait is no pending failure.
    "spec.runPolicy.pendingTimeoutSeconds": 3,
}

QueueFactory = Callable[[int], str]


def apply(kubectl: Kubectl, obj: Obj) -> None:
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(obj))


def delete(kubectl: Kubectl, kind: str, name: str, namespace: str | None = None) -> None:
    """Deleted while Kueue runs (it removes its own finalizers), waiting until it is gone."""
    where = ["-n", namespace] if namespace else []
    kubectl("delete", kind, name, *where, "--ignore-not-found", "--timeout=30s", timeout=45)


@pytest.fixture(scope="module")
def kueue(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Kueue, for this module, managing the namespaces labelled with the label it yields."""
    label = {"rlkube.dev/kueue-test": uuid.uuid4().hex[:12]}
    controller = KueueController(kubectl, Path(tmp_path_factory.mktemp("kueue")), label)
    controller.start()
    try:
        apply(kubectl, {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}})
        yield label
        delete(kubectl, "resourceflavors.kueue.x-k8s.io", FLAVOR)
    finally:
        controller.stop()
    # Nothing of Kueue's is left in the way of the session's other tests.
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        names = kubectl("get", kind, "-o", "name").stdout.split()
        assert not [n for n in names if controller.name in n], names


@pytest.fixture
def queues(kueue: dict[str, str], jobs: Jobs, kubectl: Kubectl) -> Iterator[QueueFactory]:
    """queues(cpus): a ClusterQueue with `cpus` CPUs (and memory to spare) for the test's
    namespace, and the LocalQueue `team` in it; all removed afterwards, the jobs first."""
    namespace = jobs.namespace
    kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in kueue.items()))
    cluster_queue = f"rlkube-test-{namespace}"[:63]

    def make(cpus: int) -> str:
        quotas = [{"name": "cpu", "nominalQuota": str(cpus)}, {"name": "memory", "nominalQuota": "64Gi"}]
        spec = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [
                {"coveredResources": ["cpu", "memory"], "flavors": [{"name": FLAVOR, "resources": quotas}]}
            ],
        }
        apply(
            kubectl,
            {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": cluster_queue}, "spec": spec},
        )
        local = {
            "apiVersion": KUEUE_API,
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
        }
        apply(kubectl, {**local, "spec": {"clusterQueue": cluster_queue}})
        return LOCAL_QUEUE

    yield make
    jobs.delete_all()
    wait_no_pods_left(kubectl, namespace)
    # Workloads carry Kueue's finalizer: gone while Kueue runs, they cannot hold the namespace's
    # deletion after it stops.
    wait_for(lambda: not workloads(kubectl, namespace), f"no Workloads left in {namespace}", timeout=60, interval=1)
    delete(kubectl, "localqueues.kueue.x-k8s.io", LOCAL_QUEUE, namespace)
    delete(kubectl, "clusterqueues.kueue.x-k8s.io", cluster_queue)


def wait_gang(jobs: Jobs, name: str) -> list[Obj]:
    """Every pod of the job's gang, once the StatefulSets have made them all."""

    def probe() -> list[Obj] | None:
        pods = jobs.pods(name)
        return pods if len(pods) == TINY_PODS else None

    return wait_for(probe, f"{TINY_PODS} pods of job {name}", timeout=60)


def end_deleted_pods(kubectl: Kubectl, namespace: str) -> None:
    """What a kubelet does to a pod being deleted once its containers stop: the terminal phase
    (Failed). kwok's pod-delete stage only deletes, so a pod Kueue admitted would stay Running
    with Kueue's finalizer forever; Failed, its group (unretriable) is finished, and Kueue
    releases the quota and the finalizers."""
    listing = json.loads(kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    for pod in listing:
        if pod["metadata"].get("deletionTimestamp") and pod["status"].get("phase") not in ("Failed", "Succeeded"):
            patch = json.dumps({"status": {"phase": "Failed"}})
            name = pod["metadata"]["name"]
            kubectl(
                "patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch, check=False
            )


def wait_no_pods_left(kubectl: Kubectl, namespace: str) -> None:
    def gone() -> bool:
        end_deleted_pods(kubectl, namespace)
        return not json.loads(kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]

    wait_for(gone, f"no pods left in {namespace}", timeout=60, interval=1)


def gated(pod: Obj) -> bool:
    return any(g.get("name") == ADMISSION_GATE for g in pod["spec"].get("schedulingGates") or [])


def workloads(kubectl: Kubectl, namespace: str) -> list[Obj]:
    listing = kubectl("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json")
    items: list[Obj] = json.loads(listing.stdout)["items"]
    return items


def admitted(workload: Obj) -> bool:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Admitted" and c.get("status") == "True" for c in conditions)


def test_a_queue_with_room_for_half_the_gang_admits_none_of_it(
    queues: QueueFactory, jobs: Jobs, kubectl: Kubectl
) -> None:
    queues(TINY_PODS // 2)
    jobs.create(tiny_job("half", jobs.namespace, KUEUE_JOB))
    pods = wait_gang(jobs, "half")

    # Kueue sees one group of the whole gang (one Workload), not a workload per pod or per role.
    (workload,) = wait_for(lambda: workloads(kubectl, jobs.namespace) or None, "the gang's Workload")
    assert workload["metadata"]["name"] == "half-attempt-0"
    assert sum(ps["count"] for ps in workload["spec"]["podSets"]) == TINY_PODS

    # Held, all of them, well past pendingTimeoutSeconds (3 s).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        pods = jobs.pods("half")
        assert len(pods) == TINY_PODS
        assert all(gated(p) for p in pods), [p["metadata"]["name"] for p in pods if not gated(p)]
        assert not any(p["spec"].get("nodeName") for p in pods)
        assert (jobs.get("half").get("status") or {}).get("state") != "Failed"
        time.sleep(1)
    assert not any(admitted(w) for w in workloads(kubectl, jobs.namespace))

    job = jobs.get("half")
    assert job["status"]["state"] == "Created"
    running = condition(job, "Running")
    assert running is not None
    assert running["reason"] == "AwaitingAdmission"
    assert running["message"].startswith(f"waiting for Kueue admission in queue {LOCAL_QUEUE}:")
    assert condition(job, "Failed") is None


def test_a_queue_with_room_for_the_gang_admits_it_whole_and_frees_it_after(
    queues: QueueFactory, jobs: Jobs, kubectl: Kubectl
) -> None:
    queues(TINY_PODS)
    jobs.create(tiny_job("first", jobs.namespace, KUEUE_JOB))
    jobs.wait_running("first", timeout=90)
    pods = jobs.pods("first")
    assert len(pods) == TINY_PODS
    assert not any(gated(p) for p in pods)
    assert all(p["spec"].get("nodeName") for p in pods)

    # The queue is full: a second gang waits, whole...
    jobs.create(tiny_job("second", jobs.namespace, KUEUE_JOB))
    wait_gang(jobs, "second")
    time.sleep(3)
    second = jobs.pods("second")
    assert all(gated(p) for p in second)
    # ...until the first is deleted and its quota released.
    jobs.delete("first")
    wait_for(lambda: not jobs.exists("first"), "job first to be gone")

    def first_gone() -> bool:
        end_deleted_pods(kubectl, jobs.namespace)
        return not jobs.pods("first", include_deleting=True)

    wait_for(first_gone, "the first gang's pods to be gone", timeout=60, interval=1)
    jobs.wait_running("second", timeout=90)


def test_a_restarted_gang_is_a_new_group_admitted_once_the_old_one_ended(
    queues: QueueFactory, jobs: Jobs, kubectl: Kubectl
) -> None:
    """Room for exactly one gang: the restarted gang (attempt 1, a new group) can only be
    admitted once the old gang's pods have ended and its quota is released."""
    queues(TINY_PODS)
    jobs.create(tiny_job("restart", jobs.namespace, KUEUE_JOB))
    jobs.wait_running("restart", timeout=90)
    jobs.fail_pod("restart-actor-1")

    def restarted() -> bool:
        end_deleted_pods(kubectl, jobs.namespace)  # the kubelet's part for the old gang's pods
        status = jobs.get("restart").get("status") or {}
        return status.get("restartCount") == 1 and status.get("state") == "Running"

    wait_for(restarted, "the restarted gang to run", timeout=90, interval=1)
    pods = jobs.wait_pods("restart", TINY_PODS, at_attempt=1)
    groups = {p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for p in pods}
    assert groups == {"restart-attempt-1"}
    assert {w["metadata"]["name"]: admitted(w) for w in workloads(kubectl, jobs.namespace)}.get("restart-attempt-1")
