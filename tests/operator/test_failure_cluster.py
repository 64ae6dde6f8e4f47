"""Jobs that cannot run, against the real API server with the operator in-process (kwok
pods): a child the API server refuses starts no pod and fails the job naming the RLJob
field; the trainer's configuration exit code fails the job at once with its message; a
disrupted pod restarts the gang without counting against backoffLimit."""

from __future__ import annotations

import copy
import json
import time

import pytest

from rlkube_api.exit_codes import ExitCode
from tests.operator.cluster_kit import TINY_PODS, Jobs, condition, tiny_job

pytestmark = pytest.mark.cluster

JOB = "tiny"
# A source the RLJob passes through as written (rlkube_api/volumes.py checks five others): an nfs
# volume without its server. Admission accepts it; the API server refuses the StatefulSet.
BAD_VOLUME = [{"name": "work", "mountPath": "/rlkube", "source": {"nfs": {"path": "/exports"}}}]


def test_a_refused_child_starts_no_pod_and_fails_naming_the_field(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace, {"spec.volumes": BAD_VOLUME}))
    job = jobs.wait_state(JOB, "Failed")
    failed = condition(job, "Failed")
    assert failed is not None and failed["reason"] == "InvalidChild"
    assert "from RLJob field spec.volumes[0] (work)" in failed["message"]
    assert "nfs.server" in failed["message"]
    # All or nothing: no StatefulSet was created, so no pod of the job exists, let alone runs.
    time.sleep(2)
    assert jobs.statefulsets(JOB) == {}
    assert jobs.pods(JOB, include_deleting=True) == []
    assert jobs.wait_event(JOB, "InvalidChild")["type"] == "Warning"
    # The spec fixed (a new generation): the job starts again.
    fixed = copy.deepcopy(BAD_VOLUME)
    fixed[0]["source"] = {"emptyDir": {}}
    jobs.patch(JOB, {"spec": {"volumes": fixed}})
    jobs.wait_running(JOB)
    assert condition(jobs.get(JOB), "Failed")["reason"] == "SpecChanged"  # type: ignore[index]


def test_the_trainers_config_error_fails_the_job_at_once(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)
    message = "exit code 78: model.path (RLJob spec.model.path) '/models/x': does not exist"
    _crash(jobs, f"{JOB}-controller-0", int(ExitCode.CONFIG), message)
    job = jobs.wait_state(JOB, "Failed")
    failed = condition(job, "Failed")
    assert failed is not None and failed["reason"] == "TrainerConfigError"
    assert message in failed["message"]
    assert job["status"].get("restartCount", 0) == 0
    assert message in jobs.wait_event(JOB, "TrainerConfigError")["message"]
    jobs.wait_no_pods(JOB)


def test_a_disrupted_pod_restarts_the_gang_without_counting(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace, {"spec.runPolicy.backoffLimit": 0}))
    jobs.wait_running(JOB)
    pods = jobs.wait_pods(JOB, TINY_PODS)
    victim = next(p["metadata"]["name"] for p in pods if p["metadata"]["name"].endswith("-actor-1"))
    pod = jobs.pod(victim)
    conditions = [
        *pod["status"]["conditions"],
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "preempted"},
    ]
    jobs.kubectl(
        "patch", "pod", victim, "-n", jobs.namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"conditions": conditions, "phase": "Failed"}}),
    )  # fmt: skip
    job = jobs.wait_running(JOB, restarts=1)
    assert job["status"]["uncountedRestarts"] == 1
    # The Restarting condition is transient (Resumed once the gang is back): its Event stays.
    assert "not counted against backoffLimit" in jobs.wait_event(JOB, "PodDisrupted")["message"]


def _crash(jobs: Jobs, pod_name: str, exit_code: int, message: str) -> None:
    """The container exits with `message` as its termination message; the kubelet restarts it."""
    pod = jobs.pod(pod_name)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    statuses = copy.deepcopy(pod["status"]["containerStatuses"])
    statuses[0]["restartCount"] = 1
    statuses[0]["lastState"] = {
        "terminated": {
            "exitCode": exit_code, "reason": "Error", "message": message, "startedAt": now, "finishedAt": now,
        }
    }  # fmt: skip
    jobs.kubectl(
        "patch", "pod", pod_name, "-n", jobs.namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"containerStatuses": statuses}}),
    )  # fmt: skip
