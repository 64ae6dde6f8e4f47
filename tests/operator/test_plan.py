"""The plan compute_status returns: every rule's actions, in order (test_status.py covers
the conditions and Events each rule sets). Pure: fixed times, pod dicts, no cluster."""

from __future__ import annotations

import pytest

from rlkube_api.conditions import ConditionType, State, is_terminal, state_of
from rlkube_api.names import ANNOTATION_RUN_FINISHED
from rlkube_api.rljob import RLJob, RunPolicy
from rlkube_operator.children.references import Reference
from rlkube_operator.observed import view_pod
from rlkube_operator.plan import (
    Action,
    ApplyChildren,
    CountRestart,
    DeleteChildren,
    DeletePods,
    ObserveTimeToRunning,
    Plan,
    ScaleToZero,
    WriteStatus,
)
from rlkube_operator.status import Observed, compute_status
from rlkube_operator.status.before_pods import REFERENCE_RECHECK_SECONDS
from rlkube_operator.status.compute import FINISHED_GRACE_SECONDS, RULES
from rlkube_operator.status.gang_rules import APPLY_RETRY_SECONDS, pod_loss_breaks_gang
from rlkube_operator.status.writes import COUNTS_WRITE_INTERVAL
from tests.operator.helpers import CPU, Obj, at, gang_pods, load_job, pod, replace_pod, set_path
from tests.operator.test_status import gated

GRACE = RunPolicy().termination_grace_period_seconds  # the default

JOB = load_job(CPU)  # controller 1 + actor 2 + rollout 1; backoffLimit 2, activeDeadlineSeconds 1800
PODS = gang_pods(JOB)
SETS = ("tiny-cpu-controller", "tiny-cpu-actor", "tiny-cpu-rollout")
STUCK = "0/2 nodes are available: 2 Insufficient cpu."


def uids(pods: list[Obj]) -> tuple[tuple[str, str], ...]:
    return tuple((q["metadata"]["name"], q["metadata"]["uid"]) for q in pods)


def released(pods: list[Obj]) -> list[Action]:
    """What an ended job does with pods still running: each pod deleted with the short grace
    period, then its StatefulSets to zero."""
    return [DeletePods(uids(pods), FINISHED_GRACE_SECONDS), ScaleToZero(SETS)]


def released_with(ended: Obj, pods: list[Obj]) -> list[Action]:
    """As `released`, when one pod has already ended (its container exited): that one deleted
    at once, having nothing to save."""
    return [DeletePods(uids([ended]), 0), *released([q for q in pods if q is not ended])]


def plan(
    job: RLJob,
    pods: list[Obj],
    seconds: float,
    *,
    apply_errors: dict[str, str] | None = None,
    since_last_write: float = float("inf"),
    created_at: float | None = None,
) -> Plan:
    observed = Observed(
        [view_pod(p) for p in pods],
        at(seconds),
        apply_errors or {},
        since_last_write=since_last_write,
        job_created=None if created_at is None else at(created_at),
    )
    return compute_status(job, observed)


def after(job: RLJob, p: Plan) -> RLJob:
    return job.model_copy(update={"status": p.status})


def kinds(p: Plan) -> list[type[Action]]:
    return [type(a) for a in p.actions]


def created() -> RLJob:
    return after(JOB, plan(JOB, [], 0))


def running(job: RLJob = JOB) -> RLJob:
    first = after(job, plan(job, [], 0))
    return after(first, plan(first, gang_pods(job), 10))


def test_the_rules_run_in_a_fixed_order() -> None:
    names = [rule.__name__ for rule in RULES]
    assert names == [
        "invalid_child",
        "suspended",
        "past_deadline",
        "driver_succeeded",
        "restart_begun",
        "initialized",
        "gang_failed",
        "missing_reference",
        "does_not_fit",
        "bad_image",
        "stuck_before_start",
        "pods_not_created",
        "awaiting_admission",
        "unschedulable",
        "readiness",
    ]


# --- each rule's plan ------------------------------------------------------------------------------


def test_a_new_job_applies_its_children_then_writes_its_status() -> None:
    p = plan(JOB, [], 0)
    assert p.actions == [ApplyChildren(attempt=0, pods_wanted=True), WriteStatus(p.status)]
    assert p.status.state == State.CREATED


def test_readiness_running_observes_the_time_to_running_once() -> None:
    p = plan(created(), PODS, 10, created_at=-2)
    assert kinds(p) == [ApplyChildren, WriteStatus, ObserveTimeToRunning]
    assert p.actions[-1] == ObserveTimeToRunning(12.0)
    assert p.status.state == State.RUNNING
    # Running already: no second observation, and nothing changed, so nothing written.
    steady = plan(after(created(), p), PODS, 20, created_at=-2)
    assert steady.actions == [ApplyChildren(attempt=0, pods_wanted=True)]


def test_suspended_keeps_the_children_at_zero_replicas() -> None:
    job = running(load_job(CPU, set_path("spec.suspend", True)))
    p = plan(job, PODS, 100)
    assert p.status.state == State.SUSPENDED
    assert p.actions[0] == ApplyChildren(attempt=0, pods_wanted=False)
    assert not p.pods_wanted


def test_past_deadline_writes_the_failure_then_lets_the_pods_go() -> None:
    p = plan(running(), PODS, 1800)
    assert p.status.state == State.FAILED
    assert p.actions == [WriteStatus(p.status), *released(PODS)]
    assert p.requeue_after is None  # no TTL: nothing left to do


def test_a_finished_run_on_the_driver_pod_is_the_jobs_success_and_every_pod_goes_at_once() -> None:
    """The driver records its finished run on its pod and idles (an exit would be restarted):
    the success is written first (the pods are its evidence), then every pod, the idle driver
    too, is deleted with the short grace period, not the job's, and the StatefulSets go to zero."""
    job = running(load_job(CPU, set_path("spec.runPolicy.ttlSecondsAfterFinished", 600)))
    driver = pod("tiny-cpu", "controller")
    driver["metadata"]["annotations"][ANNOTATION_RUN_FINISHED] = "2026-12-01T12:08:20Z"
    pods = replace_pod(PODS, driver)
    p = plan(job, pods, 500)
    assert p.status.state == State.SUCCEEDED
    assert p.actions == [WriteStatus(p.status), *released(pods)]
    assert FINISHED_GRACE_SECONDS < GRACE
    assert p.requeue_after == 600


def test_a_driver_that_exited_0_and_was_restarted_is_deleted_without_grace() -> None:
    """Without the annotation (the driver could not write it) the kubelet restarts a driver that
    exited 0; the success stands, and the restarted driver has nothing to save."""
    job = running()
    driver = pod("tiny-cpu", "controller", last_terminated=(0, "Completed"), restarts=1)
    pods = replace_pod(PODS, driver)
    p = plan(job, pods, 500)
    assert p.status.state == State.SUCCEEDED
    assert p.actions == [WriteStatus(p.status), *released_with(driver, pods)]


def test_pods_of_an_ended_job_are_deleted_until_they_are_gone() -> None:
    """A pod still there after the terminal state was written (the operator stopped before
    deleting, or the StatefulSet controller deletes it with the job's long grace period) is
    deleted with the short one; once they are all gone, nothing."""
    job = running()
    done = after(job, plan(job, PODS, 1800))
    assert is_terminal(done.status.state if done.status else None)
    left = [pod("tiny-cpu", "actor", 1), pod("tiny-cpu", "rollout", 0, deleting=True)]
    again = plan(done, left, 1801)
    assert [a for a in again.actions if not isinstance(a, WriteStatus)] == released(left)
    gone = plan(after(done, again), [], 1802)
    assert not any(isinstance(a, ScaleToZero | DeletePods) for a in gone.actions)


def test_gang_failed_applies_the_new_attempt_then_deletes_the_old_gang() -> None:
    failed = pod("tiny-cpu", "actor", 1, phase="Failed", ready=False, terminated=(137, "OOMKilled"))
    pods = replace_pod(PODS, failed)
    p = plan(running(), pods, 100)
    assert p.status.restart_count == 1
    assert kinds(p) == [ApplyChildren, DeletePods, DeletePods, WriteStatus, CountRestart]
    assert p.actions[0] == ApplyChildren(attempt=1, pods_wanted=True)
    ended, running_ = p.actions[1], p.actions[2]
    assert isinstance(ended, DeletePods) and isinstance(running_, DeletePods)
    # Every pod of attempt 0, each by its UID: the failed one at once, the running ones with the
    # grace period to save the step in progress.
    assert ended == DeletePods(((failed["metadata"]["name"], failed["metadata"]["uid"]),), 0)
    assert running_.grace_period_seconds == GRACE
    assert sorted(ended.pods + running_.pods) == sorted((q["metadata"]["name"], q["metadata"]["uid"]) for q in pods)
    assert p.restart_gang


def test_the_old_gang_is_deleted_until_it_is_gone_without_counting_again() -> None:
    failed = pod("tiny-cpu", "actor", 1, phase="Failed", ready=False, terminated=(1, "Error"))
    restarted = after(running(), plan(running(), replace_pod(PODS, failed), 100))
    leftover = pod("tiny-cpu", "rollout", 0)  # attempt 0, still there
    deleting = pod("tiny-cpu", "controller", 0, deleting=True)  # attempt 0, on its way out
    p = plan(restarted, [leftover, deleting], 101)
    assert DeletePods(((leftover["metadata"]["name"], leftover["metadata"]["uid"]),), GRACE) in p.actions
    assert CountRestart() not in p.actions
    assert p.actions[0] == ApplyChildren(attempt=1, pods_wanted=True)


def test_gang_failed_past_the_backoff_limit_fails_the_job() -> None:
    job = running(load_job(CPU, set_path("spec.runPolicy.backoffLimit", 0)))
    failed = pod("tiny-cpu", "actor", 0, phase="Failed", ready=False, terminated=(1, "Error"))
    pods = replace_pod(PODS, failed)
    p = plan(job, pods, 100)
    assert p.status.state == State.FAILED
    assert p.actions == [WriteStatus(p.status), *released_with(failed, pods)]


def test_missing_reference_applies_the_children_at_zero_replicas_and_looks_again_soon() -> None:
    missing = (Reference("ConfigMap", "tiny-reward", "volume reward"),)
    observed = Observed([], at(0), missing_references=missing)
    p = compute_status(JOB, observed)
    assert p.actions == [ApplyChildren(attempt=0, pods_wanted=False), WriteStatus(p.status)]
    assert p.status.state == State.PENDING
    assert p.requeue_after == REFERENCE_RECHECK_SECONDS
    # Found: the same children, with their replicas.
    found = plan(after(JOB, p), [], 5)
    assert found.actions == [ApplyChildren(attempt=0, pods_wanted=True), WriteStatus(found.status)]
    # Never found: Failed after pendingTimeoutSeconds (300), scaled to zero.
    late = compute_status(after(JOB, p), Observed([], at(300), missing_references=missing))
    assert late.status.state == State.FAILED
    assert late.actions == [WriteStatus(late.status)]  # no pod to let go of


def test_bad_image_past_the_pending_timeout_fails_the_job() -> None:
    timeout = JOB.spec.run_policy.pending_timeout_seconds
    # The whole gang (a StatefulSet short of pods would be looked at again sooner, for why).
    pods = replace_pod(
        PODS, pod("tiny-cpu", "actor", 0, phase="Pending", ready=False, waiting=("ErrImagePull", "not found"))
    )
    early = plan(created(), pods, 10)
    assert kinds(early) == [ApplyChildren, WriteStatus]
    assert early.requeue_after == pytest.approx(timeout - 10)
    late = plan(created(), pods, timeout)
    assert late.status.state == State.FAILED
    assert late.actions == [WriteStatus(late.status), *released(pods)]


def test_unschedulable_only_reports_and_keeps_the_pods() -> None:
    timeout = JOB.spec.run_policy.pending_timeout_seconds
    pods = [pod("tiny-cpu", "actor", 0, unschedulable=STUCK)]
    p = plan(created(), pods, timeout + 1)
    assert any(c.type == ConditionType.UNSCHEDULABLE and c.status == "True" for c in p.status.conditions)
    assert kinds(p) == [ApplyChildren, WriteStatus]
    assert p.pods_wanted


def test_pods_awaiting_kueue_admission_are_kept_past_the_pending_timeout() -> None:
    kueue = load_job(CPU, set_path("spec.runPolicy.gang", {"scheduler": "kueue", "queue": "team-a"}))
    job = after(kueue, plan(kueue, [], 0))
    pods = gated(job)
    p = plan(job, pods, 10 * job.spec.run_policy.pending_timeout_seconds)
    assert kinds(p) == [ApplyChildren, WriteStatus]
    assert p.pods_wanted and not is_terminal(p.status.state)


def test_a_finished_job_applies_nothing_and_deletes_its_children_after_the_ttl() -> None:
    job = running(load_job(CPU, set_path("spec.runPolicy.ttlSecondsAfterFinished", 600)))
    done = after(job, plan(job, PODS, 1800))  # past the deadline at 1800
    waiting = plan(done, [], 2000)
    assert not any(isinstance(a, ApplyChildren | ScaleToZero | DeleteChildren) for a in waiting.actions)
    assert waiting.requeue_after == pytest.approx(400)
    due = plan(done, [], 2400)
    assert DeleteChildren() in due.actions
    assert due.requeue_after is None


def test_refused_children_are_retried_soon() -> None:
    p = plan(created(), [], 5, apply_errors={"ConfigMap/tiny-cpu-config": "quota exceeded"})
    assert p.actions[0] == ApplyChildren(attempt=0, pods_wanted=True)
    assert p.requeue_after == APPLY_RETRY_SECONDS


# --- the status write -----------------------------------------------------------------------------


def test_counts_alone_wait_for_the_write_interval() -> None:
    job = created()
    three_ready = PODS[:3] + gang_pods(JOB, ready=False)[3:]
    held = plan(job, three_ready, 5, since_last_write=0.25)
    assert not any(isinstance(a, WriteStatus) for a in held.actions)
    assert held.requeue_after == pytest.approx(COUNTS_WRITE_INTERVAL - 0.25)
    due = plan(job, three_ready, 5, since_last_write=COUNTS_WRITE_INTERVAL)
    assert due.written == due.status


def test_a_transition_is_written_at_once() -> None:
    p = plan(created(), PODS, 5, since_last_write=0.0)
    assert p.written is not None
    assert p.written.state == State.RUNNING


# --- a lost pod -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "restarts", "suspended", "attempt", "lost"),
    [
        ("Running", 0, False, 0, True),
        ("Restarting", 1, False, 1, True),
        ("Created", 0, False, 0, True),
        ("Running", 1, False, 0, False),  # an older attempt: the operator deletes those itself
        ("Running", 0, True, 0, False),  # suspended: scaled down on purpose
        ("Suspended", 0, False, 0, False),
        ("Succeeded", 0, False, 0, False),
        ("Failed", 0, False, 0, False),
        (None, 0, False, 0, False),  # not reconciled yet
    ],
)
def test_pod_loss_breaks_gang(state: str | None, restarts: int, suspended: bool, attempt: int, lost: bool) -> None:
    assert pod_loss_breaks_gang(state, restarts, suspended, attempt) is lost


def test_states_read_back_as_strings_compare_with_the_enums() -> None:
    assert state_of("Running") is State.RUNNING
    assert state_of(None) is None
    assert [is_terminal(s) for s in ("Succeeded", "Failed", "Running", None)] == [True, True, False, False]
