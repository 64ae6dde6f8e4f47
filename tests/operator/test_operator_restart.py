"""A pod that fails while the operator is down keeps its exit code: the operator's finalizer
(`rlkube.dev/pod-tracking`, on every role pod through its StatefulSet's template) holds it,
Terminating with its status intact, until the operator is back and has recorded it. The
failure policy then classifies the real exit code and the Event names it; the job converges
within seconds of the operator's start. Uses the session's in-process operator."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from rlkube_api.exit_codes import ExitCode
from rlkube_api.names import FINALIZER_POD_TRACKING
from rlkube_e2e.testing import wait_for
from tests.operator.cluster_kit import TINY_PODS, InProcessOperator, Jobs, attempt, condition, tiny_job

pytestmark = pytest.mark.cluster

JOB = "held"
# From the operator's start (kopf ready) to the gang restart in the status. Measured 0.3-0.6 s
# on this machine (2 cores shared with other sessions); the slack is for a loaded CI runner.
CONVERGE_SECONDS = 10.0


@pytest.fixture
def restartable(operator: InProcessOperator) -> Iterator[InProcessOperator]:
    """The session's operator; running again after the test whatever happens."""
    yield operator
    if not operator.running:
        operator.start()


def held_failed(jobs: Jobs, pod: str) -> dict[str, Any] | None:
    """The pod, once its StatefulSet has deleted it for failing and the finalizer holds it."""
    found = next((p for p in jobs.pods(JOB, include_deleting=True) if p["metadata"]["name"] == pod), None)
    if found is None or not found["metadata"].get("deletionTimestamp"):
        return None
    return found if found["status"].get("phase") == "Failed" else None


@pytest.mark.parametrize(
    ("exit_code", "outcome"),
    [(42, "restart"), (int(ExitCode.CONFIG), "failed")],
    ids=["counted", "trainer-config-error"],
)
def test_a_pod_failed_while_the_operator_is_down_keeps_its_exit_code(
    jobs: Jobs, restartable: InProcessOperator, exit_code: int, outcome: str
) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    pods = jobs.wait_pods(JOB, TINY_PODS)
    assert all(FINALIZER_POD_TRACKING in p["metadata"].get("finalizers", []) for p in pods)

    restartable.stop()
    jobs.fail_pod(f"{JOB}-actor-1", exit_code, f"bye with {exit_code}")
    victim = wait_for(lambda: held_failed(jobs, f"{JOB}-actor-1"), "the failed pod deleted and held", timeout=30)
    time.sleep(1)  # time for its StatefulSet to replace it, were the pod not held
    assert len(jobs.pods(JOB, include_deleting=True)) == TINY_PODS  # not replaced: the name is still taken
    terminated = victim["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == exit_code

    restartable.start()
    started = time.monotonic()
    if outcome == "restart":
        job = jobs.wait(JOB, lambda j: j["status"].get("restartCount") == 1, "restartCount 1", CONVERGE_SECONDS)
        took = time.monotonic() - started
        event = jobs.wait_event(JOB, "PodFailed")
        jobs.wait_running(JOB, restarts=1)
        assert all(attempt(p) == 1 for p in jobs.wait_pods(JOB, TINY_PODS, at_attempt=1))
    else:
        job = jobs.wait_state(JOB, "Failed", CONVERGE_SECONDS)
        took = time.monotonic() - started
        event = jobs.wait_event(JOB, "TrainerConfigError")
        failed = condition(job, "Failed")
        assert failed is not None and f"exit code {exit_code}" in failed["message"]
        assert job["status"].get("restartCount", 0) == 0
        jobs.wait_no_pods(JOB)
    print(f"exit code {exit_code}: {outcome} in the status {took:.1f} s after the operator's start")
    assert f"{JOB}-actor-1" in event["message"]
    assert f"exit code {exit_code}" in event["message"]
    assert f"bye with {exit_code}" in event["message"]
    # Released once recorded: the held pod is gone.
    wait_for(lambda: victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in jobs.pods(JOB, True)}, "release")


def test_deleting_the_job_releases_its_pods(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)
    jobs.delete(JOB)

    def released() -> bool:
        return not any(FINALIZER_POD_TRACKING in p["metadata"].get("finalizers", []) for p in jobs.pods(JOB, True))

    # Not waiting for the pods to go: that is the garbage collector's pace (20 s here), unheld.
    wait_for(released, "every pod of the deleted job released", timeout=10)
