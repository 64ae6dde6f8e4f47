"""The operator can be stopped and started at any point: a new instance finds the
same children (server-side apply, no duplicates), keeps the status it wrote
(restartCount, conditions) and converges; a failure that happened while it was
down is still noticed. Uses the session's operator (one instance at a time)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlkube_e2e.testing import wait_for
from rlkube_operator.metrics import METRICS
from tests.operator.cluster_kit import TINY_PODS, InProcessOperator, Jobs, attempt, condition, tiny_job

pytestmark = pytest.mark.cluster

JOB = "tiny"


def reconciles(namespace: str) -> float:
    return METRICS.registry.get_sample_value("rlkube_reconcile_total", {"namespace": namespace}) or 0.0


@pytest.fixture
def restartable(operator: InProcessOperator) -> Iterator[InProcessOperator]:
    """The session's operator; running again after the test whatever happens."""
    yield operator
    if not operator.running:
        operator.start()


def restart(operator: InProcessOperator, namespace: str) -> None:
    """Stops and starts the operator, then waits for the new instance's first passes over the job."""
    operator.stop()
    before = reconciles(namespace)
    operator.start()
    wait_for(lambda: reconciles(namespace) >= before + 2, "the new operator instance to reconcile the job", 30)


def uids(items: list[dict[str, object]]) -> set[str]:
    return {str(item["metadata"]["uid"]) for item in items}  # type: ignore[index]


def test_restart_while_running_changes_nothing(jobs: Jobs, restartable: InProcessOperator) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    before = jobs.wait_running(JOB)
    pods = jobs.wait_pods(JOB, TINY_PODS)
    children = jobs.child_uids(JOB)

    restart(restartable, jobs.namespace)

    after = jobs.wait_running(JOB)
    assert jobs.child_uids(JOB) == children  # same objects, none added
    assert uids(jobs.wait_pods(JOB, TINY_PODS)) == uids(pods)  # no restart of the gang
    assert after["status"].get("restartCount", 0) == 0
    assert after["status"]["startTime"] == before["status"]["startTime"]
    assert condition(after, "Running") == condition(before, "Running")


def test_restart_right_after_a_gang_restart_does_not_count_it_twice(
    jobs: Jobs, restartable: InProcessOperator
) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)
    children = jobs.child_uids(JOB)

    jobs.fail_pod(f"{JOB}-actor-0")
    jobs.wait(JOB, lambda j: j["status"].get("restartCount") == 1, "restartCount 1")
    restart(restartable, jobs.namespace)

    pods = jobs.wait_pods(JOB, TINY_PODS, at_attempt=1)
    job = jobs.wait_running(JOB, restarts=1)
    assert job["status"]["restartCount"] == 1
    assert all(attempt(p) == 1 for p in pods)
    assert jobs.child_uids(JOB) == children


def test_a_failure_while_the_operator_is_down_is_noticed_after(jobs: Jobs, restartable: InProcessOperator) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    old = uids(jobs.wait_pods(JOB, TINY_PODS))
    children = jobs.child_uids(JOB)

    restartable.stop()
    victim = jobs.pod(f"{JOB}-rollout-0")["metadata"]["uid"]
    jobs.fail_pod(f"{JOB}-rollout-0")
    # With nobody watching, the StatefulSet replaces the failed pod (same attempt).
    wait_for(lambda: victim not in uids(jobs.pods(JOB, include_deleting=True)), "the failed pod to be replaced")
    assert len(uids(jobs.wait_pods(JOB, TINY_PODS)) - old) == 1
    before = reconciles(jobs.namespace)
    restartable.start()
    wait_for(lambda: reconciles(jobs.namespace) > before, "the new operator instance to reconcile the job", 30)

    job = jobs.wait(JOB, lambda j: j["status"].get("restartCount") == 1, "restartCount 1")
    assert f"{JOB}-rollout-0" in condition(job, "Restarting")["message"]  # type: ignore[index]
    pods = jobs.wait_pods(JOB, TINY_PODS, at_attempt=1)
    assert not uids(pods) & old
    jobs.wait_running(JOB, restarts=1)
    assert jobs.child_uids(JOB) == children
