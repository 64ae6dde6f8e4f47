"""A pod of a running job fails while the operator is down; the operator starts again.

- Failed as a pod and replaced by its StatefulSet (phase Failed, as kwok's chaos stage makes
  it): the pod is gone, but the exit record its trainer wrote as it exited (the trainer's own
  `record_exit`, here called for the kwok pod, which runs no container) holds the exit code
  and message. The operator reads it back by the old pod's UID: the code is named in the
  job's Event, and a configuration error fails the job instead of restarting it.
- Exited and restarted in place (restartPolicy Always, as a kubelet does it): the exit is in
  the container's lastState.
Either way the job converges within seconds of the operator's start. Uses the session's
in-process operator."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from rlkube_api.exit_codes import ExitCode
from rlkube_api.names import Env
from rlkube_e2e.testing import ClusterInfo, wait_for
from rlkube_trainer.loop.progress import kubeconfig_api
from rlkube_trainer.pod.exit_record import record_exit
from tests.operator.cluster_kit import TINY_PODS, InProcessOperator, Jobs, attempt, condition, tiny_job

pytestmark = pytest.mark.cluster

JOB = "restarted"
VICTIM = f"{JOB}-actor-1"
# From the operator's start (kopf ready) to the decision in the status. Measured 0.3-0.7 s on
# this machine (2 cores shared with other sessions); the slack is for a loaded CI runner.
CONVERGE_SECONDS = 10.0


@pytest.fixture
def restartable(operator: InProcessOperator) -> Iterator[InProcessOperator]:
    """The session's operator; running again after the test whatever happens."""
    yield operator
    if not operator.running:
        operator.start()


def replaced(jobs: Jobs, old_uid: str) -> dict[str, Any] | None:
    """The victim's successor, once its StatefulSet has deleted the failed pod and made it."""
    found = next((p for p in jobs.pods(JOB) if p["metadata"]["name"] == VICTIM), None)
    return found if found is not None and found["metadata"]["uid"] != old_uid else None


@pytest.mark.parametrize(
    ("how", "exit_code", "outcome"),
    [
        ("replaced", 42, "restart"),
        ("replaced", int(ExitCode.CONFIG), "failed"),
        ("in-place", 42, "restart"),
    ],
    ids=["replaced-counted", "replaced-config-error", "restarted-in-place"],
)
def test_a_pod_failed_while_the_operator_is_down_keeps_its_exit_code(
    cluster: ClusterInfo, jobs: Jobs, restartable: InProcessOperator, how: str, exit_code: int, outcome: str
) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)
    old_uid = jobs.pod(VICTIM)["metadata"]["uid"]
    message = f"bye with {exit_code}"

    restartable.stop()
    if how == "replaced":
        env = {Env.POD_NAME: VICTIM, Env.POD_UID: old_uid, Env.NAMESPACE: jobs.namespace, Env.JOB_NAME: JOB}
        said = f"exit code {exit_code}: {message}"
        assert record_exit(exit_code, said, env, api=kubeconfig_api(cluster.kubeconfig))
        jobs.fail_pod(VICTIM, exit_code, said)
        wait_for(lambda: replaced(jobs, old_uid), "the failed pod replaced by its StatefulSet", timeout=30)
    else:
        jobs.crash_container(VICTIM, exit_code, message=f"exit code {exit_code}: {message}")

    restartable.start()
    started = time.monotonic()
    if outcome == "restart":
        jobs.wait(JOB, lambda j: j["status"].get("restartCount") == 1, "restartCount 1", CONVERGE_SECONDS)
        took = time.monotonic() - started
        event = jobs.wait_event(JOB, "PodFailed")
        jobs.wait_running(JOB, restarts=1)
        assert all(attempt(p) == 1 for p in jobs.wait_pods(JOB, TINY_PODS, at_attempt=1))
    else:
        job = jobs.wait_state(JOB, "Failed", CONVERGE_SECONDS)
        took = time.monotonic() - started
        event = jobs.wait_event(JOB, "TrainerConfigError")
        failed = condition(job, "Failed")
        assert failed is not None and f"exit code {exit_code}" in failed["message"] and message in failed["message"]
        assert job["status"].get("restartCount", 0) == 0
        jobs.wait_no_pods(JOB)
    print(f"{how}, exit code {exit_code}: {outcome} in the status {took:.1f} s after the operator's start")
    assert f"{VICTIM} (role actor)" in event["message"]
    assert f"exit code {exit_code}" in event["message"]
    assert message in event["message"]
    if how == "replaced":
        assert "its StatefulSet replaced it while no operator watched" in event["message"]
