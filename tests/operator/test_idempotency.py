"""The operator can be stopped and started at any point: a new instance finds the
same children (server-side apply, no duplicates), keeps the status it wrote
(restartCount, conditions) and converges; a failure that happened while it was
down is still noticed. Uses the session's operator (one instance at a time)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

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
    """Stops and starts the operator, then waits for the new instance's first pass over the job."""
    took = operator.stop()
    print(f"operator stopped in {took:.1f} s")
    before = reconciles(namespace)
    operator.start()
    wait_for(lambda: reconciles(namespace) > before, "the new operator instance to reconcile the job", 30)


def uids(items: list[dict[str, Any]]) -> set[str]:
    return {str(item["metadata"]["uid"]) for item in items}


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


def test_restart_right_after_a_gang_restart_does_not_count_it_twice(jobs: Jobs, restartable: InProcessOperator) -> None:
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
    job = jobs.wait_running(JOB)
    old = uids(jobs.wait_pods(JOB, TINY_PODS))
    children = jobs.child_uids(JOB)
    # The operator tells a replacement pod by its creationTimestamp being later than
    # the Running condition's lastTransitionTime; both have whole seconds, so a pod
    # replaced within the same second goes unnoticed (reported; not what this tests).
    running_since = datetime.fromisoformat(condition(job, "Running")["lastTransitionTime"])  # type: ignore[index]
    time.sleep(max(0.0, (running_since + timedelta(seconds=1.1) - datetime.now(UTC)).total_seconds()))

    restartable.stop()
    victim = jobs.pod(f"{JOB}-rollout-0")["metadata"]["uid"]
    jobs.fail_pod(f"{JOB}-rollout-0")
    # With nobody watching, the StatefulSet replaces the failed pod (same attempt).
    # Waits sized for a loaded 2-core CI machine (the controller-manager is slow there).
    wait_for(lambda: victim not in uids(jobs.pods(JOB, include_deleting=True)), "the failed pod to be replaced", 90)
    assert len(uids(jobs.wait_pods(JOB, TINY_PODS, timeout=90)) - old) == 1
    before = reconciles(jobs.namespace)
    restartable.start()
    wait_for(lambda: reconciles(jobs.namespace) > before, "the new operator instance to reconcile the job", 30)

    jobs.wait(JOB, lambda j: j["status"].get("restartCount") == 1, "restartCount 1")
    # The Event keeps the cause; the Restarting condition may already read "Resumed"
    # when the replacement gang comes up within one poll.
    assert f"{JOB}-rollout-0" in jobs.wait_event(JOB, "PodFailed")["message"]
    pods = jobs.wait_pods(JOB, TINY_PODS, at_attempt=1, timeout=90)
    assert not uids(pods) & old
    jobs.wait_running(JOB, restarts=1, timeout=90)
    assert jobs.child_uids(JOB) == children


def test_a_job_deleted_while_the_operator_is_down_stays_gone(jobs: Jobs, restartable: InProcessOperator) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)

    restartable.stop()
    jobs.delete(JOB)
    # No finalizer of the operator's holds it: the job goes, its children are collected.
    wait_for(lambda: not jobs.exists(JOB), "the RLJob to be gone without the operator", timeout=15)
    wait_for(lambda: not jobs.children(JOB), "every child to be garbage-collected", timeout=60)
    restartable.start()

    time.sleep(3)  # the new instance recreates nothing
    assert not jobs.children(JOB)
    assert not jobs.pods(JOB, include_deleting=True)


def test_a_pod_replaced_within_the_second_the_gang_became_ready_is_noticed(
    jobs: Jobs, restartable: InProcessOperator
) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)

    restartable.stop()
    victim = jobs.pod(f"{JOB}-actor-0")["metadata"]["uid"]
    jobs.fail_pod(f"{JOB}-actor-0")
    wait_for(lambda: victim not in uids(jobs.pods(JOB, include_deleting=True)), "the failed pod to be replaced")

    def replaced() -> dict[str, Any] | None:  # the StatefulSet recreates it a moment after the old one goes
        return next((p for p in jobs.pods(JOB) if p["metadata"]["name"] == f"{JOB}-actor-0"), None)

    replacement = wait_for(replaced, "the replacement pod")
    # What the operator would have written had the gang become ready earlier in that same second:
    # the timestamps it compares cannot tell the two apart.
    job = jobs.get(JOB)
    conditions = job["status"]["conditions"]
    for cond in conditions:
        if cond["type"] == "Running":
            cond["lastTransitionTime"] = replacement["metadata"]["creationTimestamp"]
    jobs.kubectl(
        "patch", "rljob", JOB, "-n", jobs.namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"conditions": conditions}}),
    )  # fmt: skip
    restartable.start()

    # The operator's start (kopf's listings, the first pass) is slow on a loaded machine.
    jobs.wait(JOB, lambda j: j["status"].get("restartCount") == 1, "restartCount 1", timeout=30)
