"""Gang scheduling plugins against the real API server: the PodGroups the operator
creates (Volcano, scheduler-plugins coscheduling) and the pod fields and labels
each scheduler reads, and what happens when a PodGroup CRD is missing.

Minimal PodGroup CRDs (tests/operator/crds) stand in for the real ones; no gang
scheduler runs, so pods naming one stay Pending: only the objects are checked."""

from __future__ import annotations

import pytest

from rlkube_api.names import LABEL_JOB
from rlkube_api.rljob import API_VERSION, KIND
from rlkube_e2e.testing import Kubectl, wait_for
from tests.operator.cluster_kit import (
    TINY_PODS,
    TINY_ROLES,
    Jobs,
    condition,
    install_podgroup_crds,
    is_true,
    roles_of,
    tiny_job,
    uninstall_podgroup_crds,
)

pytestmark = pytest.mark.cluster

JOB = "gang"
VOLCANO = ("scheduling.volcano.sh", "v1beta1")
COSCHEDULING = ("scheduling.x-k8s.io", "v1alpha1")


def test_a_missing_podgroup_crd_shows_as_create_failed(jobs: Jobs, kubectl: Kubectl) -> None:
    uninstall_podgroup_crds(kubectl)
    jobs.create(tiny_job(JOB, jobs.namespace, {"spec.runPolicy.gang": {"scheduler": "volcano", "queue": "research"}}))

    job = jobs.wait(JOB, lambda j: condition(j, "Created") is not None, "condition Created")
    created = condition(job, "Created")
    assert created is not None
    assert (created["status"], created["reason"]) == ("False", "CreateFailed")
    assert f"PodGroup/{JOB}" in created["message"]
    assert job["status"]["state"] not in ("Running", "Failed")
    event = jobs.wait_event(JOB, "CreateFailed")
    assert event["type"] == "Warning"
    assert "PodGroup" in event["message"]
    # All or nothing: no StatefulSet (so no pod) while a child is refused; the others are in.
    assert jobs.statefulsets(JOB) == {}
    assert f"ConfigMap/{JOB}-config" in jobs.children(JOB)

    # Once the CRD is there, the next pass creates the PodGroup and the condition clears.
    install_podgroup_crds(kubectl)
    # A refused child is applied again within status.gang_rules.APPLY_RETRY_SECONDS (15 s); touching the job is quicker.
    jobs.patch(JOB, {"metadata": {"annotations": {"test.rlkube.dev/poke": "1"}}})
    job = jobs.wait(JOB, lambda j: is_true(j, "Created"), "condition Created=True", timeout=30)
    assert condition(job, "Created")["reason"] == "ChildrenCreated"  # type: ignore[index]
    assert [pg["metadata"]["name"] for pg in jobs.podgroups(*VOLCANO)] == [JOB]
    assert len(jobs.statefulsets(JOB)) == len(TINY_ROLES)


@pytest.mark.usefixtures("podgroup_crds")
def test_volcano_gets_a_podgroup_and_pods_that_name_it(jobs: Jobs) -> None:
    created = jobs.create(
        tiny_job(JOB, jobs.namespace, {"spec.runPolicy.gang": {"scheduler": "volcano", "queue": "research"}})
    )

    groups = wait_for(lambda: jobs.podgroups(*VOLCANO) or None, "a Volcano PodGroup")
    assert len(groups) == 1
    group = groups[0]
    assert group["metadata"]["name"] == JOB
    assert group["metadata"]["labels"][LABEL_JOB] == JOB
    [owner] = group["metadata"]["ownerReferences"]
    assert (owner["apiVersion"], owner["kind"], owner["uid"], owner["controller"]) == (
        API_VERSION,
        KIND,
        created["metadata"]["uid"],
        True,
    )
    spec = group["spec"]
    assert spec["minMember"] == TINY_PODS
    assert spec["minTaskMember"] == TINY_ROLES
    assert spec["queue"] == "research"

    pods = wait_for(lambda: p if len(p := jobs.pods(JOB)) == TINY_PODS else None, f"{TINY_PODS} pods")
    assert roles_of(pods) == TINY_ROLES
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "volcano"
        annotations = pod["metadata"]["annotations"]
        assert annotations["scheduling.k8s.io/group-name"] == JOB
        assert annotations["volcano.sh/task-spec"] == pod["metadata"]["labels"]["rlkube.dev/role"]
        assert pod["status"]["phase"] == "Pending"  # no Volcano scheduler here
    job = jobs.wait(JOB, lambda j: is_true(j, "Created"), "condition Created=True")
    assert job["status"]["state"] == "Created"


@pytest.mark.usefixtures("podgroup_crds")
def test_coscheduling_gets_a_podgroup_and_labelled_pods(jobs: Jobs) -> None:
    gang = {"scheduler": "coscheduling", "scheduleTimeoutSeconds": 120}
    jobs.create(tiny_job(JOB, jobs.namespace, {"spec.runPolicy.gang": gang}))

    groups = wait_for(lambda: jobs.podgroups(*COSCHEDULING) or None, "a scheduler-plugins PodGroup")
    assert [g["metadata"]["name"] for g in groups] == [JOB]
    assert groups[0]["spec"]["minMember"] == TINY_PODS
    assert groups[0]["spec"]["scheduleTimeoutSeconds"] == 120
    assert groups[0]["metadata"]["ownerReferences"][0]["name"] == JOB
    assert not jobs.podgroups(*VOLCANO)

    pods = wait_for(lambda: p if len(p := jobs.pods(JOB)) == TINY_PODS else None, f"{TINY_PODS} pods")
    for pod in pods:
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == JOB
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    jobs.wait(JOB, lambda j: is_true(j, "Created"), "condition Created=True")


@pytest.mark.usefixtures("podgroup_crds")
def test_kueue_labels_the_pods_only_and_suspend_stays_the_users(jobs: Jobs) -> None:
    # Kueue admits the pods (test_kueue_cluster runs it); spec.suspend is a plain user field.
    gang = {"scheduler": "kueue", "queue": "team-a"}
    jobs.create(tiny_job(JOB, jobs.namespace, {"spec.runPolicy.gang": gang, "spec.suspend": True}))
    job = jobs.wait_state(JOB, "Suspended")
    assert is_true(job, "Suspended") and is_true(job, "Created")
    assert not job["status"].get("startTime")
    sets = jobs.statefulsets(JOB)
    assert len(sets) == len(TINY_ROLES) and all(s["spec"]["replicas"] == 0 for s in sets.values())
    assert not jobs.pods(JOB, include_deleting=True)

    jobs.patch(JOB, {"spec": {"suspend": False}})
    # No Kueue watches this namespace: the pods run, each labelled as a member of the gang's group.
    pods = jobs.wait_pods(JOB, TINY_PODS)
    for pod in pods:
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == f"{JOB}-attempt-0"
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == str(TINY_PODS)
        assert pod["spec"]["schedulerName"] == "default-scheduler"
    for key, child in jobs.children(JOB).items():
        assert not any(k.startswith("kueue.x-k8s.io/") for k in child["metadata"]["labels"]), key
    assert not jobs.podgroups(*VOLCANO) and not jobs.podgroups(*COSCHEDULING)
    job = jobs.wait_running(JOB)
    assert not is_true(job, "Suspended")


@pytest.mark.usefixtures("podgroup_crds")
def test_pods_no_scheduler_picks_up_end_in_a_condition(jobs: Jobs) -> None:
    gang = {"scheduler": "volcano", "queue": "research"}
    jobs.create(tiny_job(JOB, jobs.namespace, {"spec.runPolicy.gang": gang, "spec.runPolicy.pendingTimeoutSeconds": 2}))
    jobs.wait(JOB, lambda j: is_true(j, "Created"), "condition Created=True")

    job = jobs.wait(JOB, lambda j: is_true(j, "Unschedulable"), "condition Unschedulable", timeout=10)
    assert "volcano" in condition(job, "Unschedulable")["message"]  # type: ignore[index]
