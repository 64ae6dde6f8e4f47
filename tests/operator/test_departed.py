"""A gang member that failed and was replaced while no operator watched: what its trainer's
exit record (in the job's exit-record ConfigMap) and its Events (an eviction) tell is read
back by the pod's UID
(`observed.departed_pod`, `Reconciler.departed_pods`) and judged by the failure policy as if
the pod had been seen: its exit code is named, a configuration error fails the job, a
disruption is not counted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rlkube_api.exit_codes import ExitCode
from rlkube_api.names import ANNOTATION_EXIT_CODE, EVENT_TRAINER_EXITED
from rlkube_operator.job_state import TrackedJob
from rlkube_operator.observed import DISRUPTION_TARGET, departed_pod, view_pod
from rlkube_operator.status import Observed, compute_status
from rlkube_trainer.pod.exit_record import exit_event
from tests.operator.helpers import CPU, Obj, at, load_job, pod, replace_pod, set_path
from tests.operator.test_reconcile import NAMESPACE, FakeKube, body_of, reconcile
from tests.operator.test_status import PODS, cond, running

VICTIM = "tiny-cpu-actor-0"


def old_uid() -> str:
    return next(p["metadata"]["uid"] for p in PODS if p["metadata"]["name"] == VICTIM)


def replacement() -> Obj:
    """The pod the actor's StatefulSet made in the failed one's place (a new UID)."""
    return pod("tiny-cpu", "actor", 0, created=at(50))


def trainer_exit(code: int, message: str) -> dict[str, Any]:
    """The record the trainer's own code writes as it exits (trainer/rlkube_trainer/pod/exit_record.py)."""
    return exit_event(code, f"exit code {code}: {message}", VICTIM, old_uid(), NAMESPACE, at(40))


def kubelet_event(reason: str, message: str) -> dict[str, Any]:
    return {
        "involvedObject": {"kind": "Pod", "name": VICTIM, "uid": old_uid(), "namespace": NAMESPACE},
        "type": "Warning",
        "reason": reason,
        "message": message,
        "lastTimestamp": "2026-01-01T00:00:41Z",
    }


def replacements() -> dict[str, Any]:
    view = view_pod(replacement())
    return {view.name: view}


# --- what the Events tell ---------------------------------------------------------------------


def test_the_trainers_exit_record_gives_the_exit_code_and_message() -> None:
    found = departed_pod(
        [kubelet_event("Killing", "Stopping container trainer")], replacements(), trainer_exit(3, "rank 2 lost")
    )
    assert found is not None and found.departed and found.failed
    assert (found.uid, found.name, found.role) == (old_uid(), VICTIM, "actor")
    assert found.terminated == (3, "Error")
    assert found.failure_reason() == "Error (exit code 3): exit code 3: rank 2 lost"
    assert DISRUPTION_TARGET not in dict(found.conditions)


def test_a_trainer_exited_event_is_not_trusted() -> None:
    """An Event can be posted by whoever may create Events in the namespace, about any pod
    (another job's pods could, when they could post their own): a `TrainerExited` Event says
    nothing to the operator, only the job's own exit record does."""
    forged = trainer_exit(int(ExitCode.CONFIG), "forged: fail this job")
    assert departed_pod([forged], replacements()) is None
    found = departed_pod([forged], replacements(), trainer_exit(3, "rank 2 lost"))
    assert found is not None and found.terminated == (3, "Error")
    assert "forged" not in found.failure_reason()


def test_an_eviction_is_a_disruption() -> None:
    found = departed_pod([kubelet_event("Evicted", "The node was low on resource: memory.")], replacements())
    assert found is not None
    assert (DISRUPTION_TARGET, "True") in found.conditions
    assert found.failure_reason() == "Evicted: The node was low on resource: memory."


@pytest.mark.parametrize(
    ("events", "record", "replaced"),
    [
        pytest.param([], None, True, id="no-events"),
        pytest.param([{**kubelet_event("Killing", "Stopping container")}], None, True, id="nothing-telling"),
        pytest.param(
            [],
            {**trainer_exit(3, "x"), "metadata": {"annotations": {ANNOTATION_EXIT_CODE: "three"}}},
            True,
            id="bad-code",
        ),
        pytest.param([], trainer_exit(3, "x"), False, id="not-replaced-yet"),
    ],
)
def test_events_that_say_nothing_leave_the_replacement_unexplained(
    events: list[dict[str, Any]], record: dict[str, Any] | None, replaced: bool
) -> None:
    assert departed_pod(events, replacements() if replaced else {}, record) is None


# --- how the status judges it -----------------------------------------------------------------


def judged(departed: Obj | None, job: Any = None) -> Any:
    """The running job's next status with the actor replaced, and what its Events told."""
    job = running(job or load_job(CPU))
    pods = replace_pod(PODS, replacement())
    if departed is None:
        told = None
    elif departed["reason"] == EVENT_TRAINER_EXITED:
        told = departed_pod([], replacements(), departed)
    else:
        told = departed_pod([departed], replacements())
    observed = Observed([view_pod(p) for p in pods], at(100), departed={VICTIM: told} if told else {})
    return compute_status(job, observed)


def test_a_departed_pods_exit_code_is_named_and_counted() -> None:
    d = judged(trainer_exit(42, "bye"))
    restarting = cond(d.status, "Restarting")
    assert (d.status.restart_count, d.status.uncounted_restarts, restarting.reason) == (1, None, "PodFailed")
    assert f"pod {VICTIM} (role actor) failed: Error (exit code 42): exit code 42: bye" in restarting.message
    assert (
        "from its exit record and Events: its StatefulSet replaced it while no operator watched" in restarting.message
    )


def test_a_departed_pods_config_error_fails_the_job() -> None:
    d = judged(trainer_exit(int(ExitCode.CONFIG), "model.path '/nope': does not exist"))
    failed = cond(d.status, "Failed")
    assert (d.status.state, failed.reason, d.status.restart_count) == ("Failed", "TrainerConfigError", 0)
    assert "model.path '/nope': does not exist" in failed.message


def test_a_departed_pods_eviction_is_not_counted() -> None:
    d = judged(
        kubelet_event("Evicted", "The node was low on resource: memory."),
        load_job(CPU, set_path("spec.runPolicy.backoffLimit", 0)),
    )
    restarting = cond(d.status, "Restarting")
    assert (d.status.restart_count, d.status.uncounted_restarts, restarting.reason) == (1, 1, "PodDisrupted")
    assert "Evicted: The node was low on resource: memory." in restarting.message


def test_without_events_a_replacement_still_counts_unexplained() -> None:
    d = judged(None)
    restarting = cond(d.status, "Restarting")
    assert (d.status.restart_count, restarting.reason) == (1, "PodFailed")
    assert "it was deleted or failed and its StatefulSet replaced it" in restarting.message


# --- the pass asks for the Events only when a member was replaced unseen ------------------------


def test_the_pass_reads_the_events_of_a_member_replaced_unseen() -> None:
    job = running(load_job(CPU))
    status = job.status.to_wire() if job.status is not None else {}
    kube, tracked = FakeKube(), TrackedJob(NAMESPACE, "tiny-cpu")
    kube.exits[old_uid()] = trainer_exit(int(ExitCode.CONFIG), "no model there")

    reconcile(kube, tracked, body_of(status), PODS, 100)
    assert not [c for c in kube.calls if c[0] in ("pod_events", "exit_records")]  # the gang is whole

    reconcile(kube, tracked, body_of(status), replace_pod(PODS, replacement()), 101)
    assert [c for c in kube.calls if c[0] == "pod_events"] == [("pod_events", NAMESPACE, old_uid())]
    written = kube.written()
    assert written["state"] == "Failed"
    failed = next(c for c in written["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "TrainerConfigError" and "no model there" in failed["message"]


def test_an_event_posted_about_the_jobs_pod_by_anyone_else_does_not_fail_it() -> None:
    """Another job's pod (or anyone who may create Events in the namespace) posts a
    `TrainerExited` Event with a configuration-error code about this job's replaced pod: the
    job is not failed by it; without its own exit record the replacement counts as an
    unexplained failure and the gang restarts."""
    job = running(load_job(CPU))
    status = job.status.to_wire() if job.status is not None else {}
    kube, tracked = FakeKube(), TrackedJob(NAMESPACE, "tiny-cpu")
    forged = trainer_exit(int(ExitCode.CONFIG), "forged by another job")
    forged["reportingInstance"] = forged["source"]["component"] = "other-actor-0"
    kube.events[old_uid()] = [forged]
    reconcile(kube, tracked, body_of(status), replace_pod(PODS, replacement()), 101)
    written = kube.written()
    assert written["state"] != "Failed", written
    assert written["restartCount"] == 1
    assert "forged" not in json.dumps(written)
