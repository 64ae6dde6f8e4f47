"""view_pod(): a pod dict, as the API server returns it, reduced to the facts the
status function decides on."""

from __future__ import annotations

from typing import Any

import pytest

from rlkube_api.names import ANNOTATION_ATTEMPT, ANNOTATION_PROGRESS
from rlkube_operator.observed import PodView, as_lost, pods_to_judge, slim_pod, view_pod
from tests.operator.helpers import T0, Obj, at, pod

JOB = "tiny-cpu"
UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."

# pod dict, the PodView fields it must give (others: whatever), failed, succeeded
VIEWS = [
    pytest.param(
        pod(JOB, "actor", 1, attempt=2),
        {"name": "tiny-cpu-actor-1", "role": "actor", "attempt": 2, "phase": "Running", "ready": True, "created": T0},
        False,
        False,
        id="running-ready",
    ),
    pytest.param(
        pod(JOB, "actor", ready=False),
        {"ready": False, "unschedulable_message": None, "waiting_reason": None, "terminated": None},
        False,
        False,
        id="running-not-ready",
    ),
    pytest.param(
        pod(JOB, "rollout", unschedulable=UNSCHEDULABLE),
        {"phase": "Pending", "ready": False, "unschedulable_message": UNSCHEDULABLE, "terminated": None},
        False,
        False,
        id="pending-unschedulable",
    ),
    pytest.param(
        pod(JOB, "actor", phase="Pending", ready=False, waiting=("ImagePullBackOff", 'Back-off pulling image "x"')),
        {"phase": "Pending", "waiting_reason": "ImagePullBackOff", "waiting_message": 'Back-off pulling image "x"'},
        False,
        False,
        id="image-pull-backoff",
    ),
    pytest.param(
        pod(JOB, "actor", phase="Failed", ready=False, terminated=(1, "Error")),
        {"phase": "Failed", "terminated": (1, "Error")},
        True,
        False,
        id="terminated-error",
    ),
    pytest.param(
        pod(JOB, "actor", ready=False, terminated=(2, "Error")),
        {"phase": "Running", "terminated": (2, "Error")},
        True,
        False,
        id="container-exited-pod-still-running",
    ),
    pytest.param(
        pod(JOB, "actor", last_terminated=(137, "OOMKilled"), restarts=1),
        {"phase": "Running", "terminated": (137, "OOMKilled"), "restarts": 1, "waiting_reason": None},
        True,
        False,
        id="restarted-after-oom",
    ),
    pytest.param(
        pod(
            JOB,
            "actor",
            ready=False,
            waiting=("CrashLoopBackOff", "back-off 10s restarting failed container"),
            last_terminated=(1, "Error"),
            restarts=3,
        ),
        {"waiting_reason": "CrashLoopBackOff", "terminated": (1, "Error"), "restarts": 3},
        True,
        False,
        id="crash-loop",
    ),
    pytest.param(
        pod(JOB, "controller", phase="Succeeded", ready=False, terminated=(0, "Completed")),
        {"role": "controller", "phase": "Succeeded", "terminated": (0, "Completed")},
        False,
        True,
        id="driver-completed",
    ),
    pytest.param(
        pod(JOB, "controller", last_terminated=(0, "Completed"), restarts=1),
        {"role": "controller", "phase": "Running", "terminated": (0, "Completed")},
        False,
        True,
        id="driver-completed-then-restarted",
    ),
    pytest.param(
        pod(JOB, "actor", deleting=True),
        {"deleting": True, "ready": True},
        False,
        False,
        id="deleting",
    ),
]


@pytest.mark.parametrize(("obj", "expected", "failed", "succeeded"), VIEWS)
def test_view_pod(obj: Obj, expected: dict[str, Any], failed: bool, succeeded: bool) -> None:
    view = view_pod(obj)
    assert {k: getattr(view, k) for k in expected} == expected
    assert view.failed is failed
    assert view.succeeded is succeeded


def test_the_state_wins_over_the_last_state() -> None:
    obj = pod(JOB, "actor", terminated=(1, "Error"), last_terminated=(137, "OOMKilled"), restarts=1)
    assert view_pod(obj).terminated == (1, "Error")


@pytest.mark.parametrize(
    ("view", "reason"),
    [
        (view_pod(pod(JOB, "actor", terminated=(137, "OOMKilled"))), "OOMKilled (exit code 137)"),
        (view_pod(pod(JOB, "actor", terminated=(1, ""))), "Error (exit code 1)"),
        (view_pod(pod(JOB, "actor", phase="Failed", ready=False)), "pod failed"),
    ],
    ids=["oom", "no-reason", "no-container-state"],
)
def test_failure_reason(view: PodView, reason: str) -> None:
    assert view.failed
    assert view.failure_reason() == reason


def test_unschedulable_without_a_message() -> None:
    obj = pod(JOB, "actor", unschedulable="")
    assert view_pod(obj).unschedulable_message == "no node fits"


def test_pod_scheduled_false_for_another_reason_is_not_unschedulable() -> None:
    obj = pod(JOB, "actor", unschedulable="waiting")
    obj["status"]["conditions"][0]["reason"] = "SchedulingGated"
    assert view_pod(obj).unschedulable_message is None


@pytest.mark.parametrize(
    ("annotation", "progress"),
    [
        ({"step": 12, "totalSteps": 30, "rewardMean": 0.25}, {"step": 12, "totalSteps": 30, "rewardMean": 0.25}),
        ('{"step": 3', {}),  # bad JSON is ignored
        ("[1, 2]", {}),  # JSON, but not an object
        (None, {}),  # no annotation
    ],
    ids=["json", "bad-json", "not-an-object", "absent"],
)
def test_progress_annotation(annotation: dict[str, Any] | str | None, progress: dict[str, Any]) -> None:
    obj = pod(JOB, "controller", progress=annotation)
    assert (ANNOTATION_PROGRESS in obj["metadata"]["annotations"]) is (annotation is not None)
    assert view_pod(obj).progress == progress


def test_bare_pod_has_safe_defaults() -> None:
    """A pod just created: no status, no annotations, no labels."""
    view = view_pod({"metadata": {"name": "p", "creationTimestamp": "2025-03-01T12:00:10Z"}})
    assert view == PodView(
        name="p",
        uid="",
        role="",
        attempt=0,
        phase="Pending",
        created=at(10),
        unschedulable_message="no scheduler has picked the pod up (schedulerName default-scheduler)",
    )
    assert not view.failed
    assert not view.succeeded


def test_attempt_annotation_is_read() -> None:
    obj = pod(JOB, "actor")
    obj["metadata"]["annotations"][ANNOTATION_ATTEMPT] = "7"
    assert view_pod(obj).attempt == 7


@pytest.mark.parametrize(("obj", "expected", "failed", "succeeded"), VIEWS)
def test_the_slim_pod_the_index_keeps_gives_the_same_view(
    obj: Obj, expected: dict[str, Any], failed: bool, succeeded: bool
) -> None:
    assert view_pod(slim_pod(obj)) == view_pod(obj)


def test_the_slim_pod_drops_what_the_operator_never_reads() -> None:
    full = pod(JOB, "actor", 1, attempt=1, progress={"step": 3})
    full["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    full["metadata"]["labels"]["controller-revision-hash"] = "abc"
    full["metadata"]["annotations"]["other"] = "x" * 1000
    full["spec"] = {"nodeName": "n1", "containers": [{"name": "trainer", "env": [{"name": "A", "value": "1"}]}]}
    slim = slim_pod(full)
    assert "managedFields" not in slim["metadata"] and "containers" not in slim["spec"]
    assert slim["metadata"]["annotations"] == {
        ANNOTATION_ATTEMPT: "1",
        ANNOTATION_PROGRESS: full["metadata"]["annotations"][ANNOTATION_PROGRESS],
    }
    assert slim["spec"] == {"nodeName": "n1"}
    # What reconcile reads besides view_pod: name, uid, the attempt, deletion.
    assert (slim["metadata"]["name"], slim["metadata"]["uid"]) == (full["metadata"]["name"], full["metadata"]["uid"])
    assert view_pod(slim) == view_pod(full)


def test_the_pods_a_pass_judges() -> None:
    """Kept pods join the index's: a failed one only once the index has lost it (the index's
    copy is newer), a lost one in place of the index's copy (still running, being deleted)."""
    running, deleting = pod(JOB, "actor", 0), pod(JOB, "actor", 1, deleting=True)
    failed = pod(JOB, "rollout", 0, phase="Failed", ready=False, terminated=(1, "Error"))
    gone = pod(JOB, "controller", 0, phase="Failed", ready=False, terminated=(2, "Error"))
    lost = as_lost(deleting, "deleted")
    uid = lambda p: p["metadata"]["uid"]  # noqa: E731
    kept = {uid(failed): failed, uid(gone): gone, uid(deleting): lost}
    judged = pods_to_judge([running, deleting, failed], kept)
    assert sorted(map(uid, judged)) == sorted(map(uid, [running, deleting, failed, gone]))
    assert [p for p in judged if uid(p) == uid(deleting)] == [lost]
    assert view_pod(lost).failed and not view_pod(deleting).failed
    assert pods_to_judge([running], {}) == [running]


def test_a_gated_pods_gates_are_seen_and_kept_in_the_slim_pod() -> None:
    """Kueue's admission gate decides the job's status (status.awaiting_admission): the
    operator's index must keep it."""
    obj = pod(JOB, "actor", phase="Pending", ready=False)
    obj["spec"] = {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}
    assert view_pod(obj).scheduling_gates == ("kueue.x-k8s.io/admission",)
    assert view_pod(slim_pod(obj)) == view_pod(obj)
