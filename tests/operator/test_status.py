"""compute_status(): from the job and its observed pods to the new status, the Events
and what to do next. Pure, with time passed in: every test drives it with fixed
datetimes and pod dicts, one reconcile after another."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlkube_api.names import ANNOTATION_ATTEMPT, LABEL_ROLE
from rlkube_api.rljob import Condition, Progress, RLJob, RLJobStatus, RoleStatus
from rlkube_operator.children.references import Reference
from rlkube_operator.observed import as_lost, pods_to_judge, view_pod
from rlkube_operator.plan import ApplyChildren, DeletePods, Plan
from rlkube_operator.status import Observed, compute_status
from rlkube_operator.status.before_pods import REFERENCE_RECHECK_SECONDS, references_to_check
from rlkube_operator.status.gang_rules import APPLY_RETRY_SECONDS
from rlkube_operator.status.starting import CREATE_FAILURE_GRACE_SECONDS, stateful_sets_to_explain
from rlkube_operator.status.writes import is_transition, status_write_delay
from tests.operator.helpers import CPU, Obj, at, gang_pods, iso, load_job, pod, replace_pod, set_path

JOB = load_job(CPU)  # controller 1 + actor 2 + rollout 1; backoffLimit 2, activeDeadlineSeconds 1800
WITH_TTL = set_path("spec.runPolicy.ttlSecondsAfterFinished", 600)
PODS = gang_pods(JOB)
UNSCHEDULABLE = "0/2 nodes are available: 2 Insufficient cpu."


def run(job: RLJob, pods: list[Obj], seconds: float, apply_errors: dict[str, str] | None = None) -> Plan:
    return compute_status(job, Observed([view_pod(p) for p in pods], at(seconds), apply_errors or {}))


def after(job: RLJob, decision: Plan) -> RLJob:
    """The job as the next reconcile sees it: the decided status written back."""
    return job.model_copy(update={"status": decision.status})


def with_spec(job: RLJob, **changes: object) -> RLJob:
    return job.model_copy(update={"spec": job.spec.model_copy(update=changes)})


def cond(status: RLJobStatus, type_: str) -> Condition:
    found = [c for c in status.conditions if c.type == type_]
    assert len(found) == 1, f"{type_}: {[c.type for c in status.conditions]}"
    return found[0]


def has_cond(status: RLJobStatus, type_: str) -> bool:
    return any(c.type == type_ for c in status.conditions)


def events(decision: Plan) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in decision.events]


def created(job: RLJob = JOB) -> RLJob:
    """After the first reconcile (children applied, no pods yet) at T0."""
    return after(job, run(job, [], 0))


def running(job: RLJob = JOB) -> RLJob:
    """Every pod Ready at T0 + 10 s."""
    return after(created(job), run(created(job), gang_pods(job), 10))


# --- the happy path -----------------------------------------------------------------------------


def test_first_reconcile_sets_created_and_running_false() -> None:
    d = run(JOB, [], 0)
    s = d.status
    assert s.state == "Created"
    created_cond = cond(s, "Created")
    assert (created_cond.status, created_cond.reason) == ("True", "ChildrenCreated")
    assert created_cond.last_transition_time == iso(at(0))
    assert created_cond.observed_generation == 1
    running_cond = cond(s, "Running")
    assert (running_cond.status, running_cond.reason) == ("False", "PodsNotReady")
    assert running_cond.message == "0/4 pods are ready"
    # A condition that never held announces nothing.
    assert events(d) == [("Normal", "ChildrenCreated")]
    assert (d.pods_wanted, d.restart_gang, d.delete_children) == (True, False, False)
    # As for Jobs, the start (and activeDeadlineSeconds) counts from the first reconcile.
    assert (s.restart_count, s.start_time, s.completion_time) == (0, iso(at(0)), None)
    assert s.roles == {
        "controller": RoleStatus(replicas=1),
        "actor": RoleStatus(replicas=2, layout="dp2"),
        "rollout": RoleStatus(replicas=1, layout="dp1"),
    }
    assert s.observed_generation == 1


def test_all_pods_ready_is_running() -> None:
    d = run(created(), PODS, 10)
    s = d.status
    assert s.state == "Running"
    c = cond(s, "Running")
    assert (c.status, c.reason, c.last_transition_time) == ("True", "AllPodsReady", iso(at(10)))
    assert s.start_time == iso(at(0))
    assert cond(s, "Created").last_transition_time == iso(at(0))  # no flip, time kept
    assert events(d) == [("Normal", "AllPodsReady")]
    assert s.roles["actor"] == RoleStatus(replicas=2, active=2, ready=2, layout="dp2")
    assert d.pods_wanted
    assert d.requeue_after == 1790  # come back when activeDeadlineSeconds runs out


def test_steady_state_changes_nothing() -> None:
    job = running()
    assert job.status is not None
    d = run(job, PODS, 100)
    assert d.events == []
    assert d.status == job.status  # same conditions, same lastTransitionTimes, same start time
    assert d.requeue_after == pytest.approx(1800 - 100)


def test_a_flip_moves_last_transition_time() -> None:
    pods = replace_pod(PODS, pod("tiny-cpu", "actor", 1, ready=False))
    d = run(running(), pods, 100)
    c = cond(d.status, "Running")
    assert (c.status, c.reason, c.message) == ("False", "PodsNotReady", "3/4 pods are ready")
    assert c.last_transition_time == iso(at(100))
    assert events(d) == [("Normal", "PodsNotReady")]
    assert d.status.start_time == iso(at(0))  # the job did start


@pytest.mark.parametrize("generation", [1, 7])
def test_observed_generation(generation: int) -> None:
    job = load_job(CPU, generation=generation)
    for d in (run(job, [], 0), run(running(job), gang_pods(job), 20)):
        assert d.status.observed_generation == generation
        assert {c.observed_generation for c in d.status.conditions} == {generation}


# --- failures and gang restarts -----------------------------------------------------------------

FAILED_ACTOR = pod("tiny-cpu", "actor", 1, phase="Failed", ready=False, terminated=(1, "Error"))
FAILURES = [
    pytest.param(FAILED_ACTOR, "Error (exit code 1)", id="pod-failed"),
    pytest.param(
        pod("tiny-cpu", "actor", 1, last_terminated=(137, "OOMKilled"), restarts=1),
        "OOMKilled (exit code 137)",
        id="container-restarted-after-oom",
    ),
    pytest.param(
        pod(
            "tiny-cpu", "actor", 1, ready=False, waiting=("CrashLoopBackOff", "back-off"), last_terminated=(1, "Error")
        ),
        "Error (exit code 1)",
        id="crash-loop",
    ),
    pytest.param(
        pod("tiny-cpu", "actor", 1, phase="Failed", ready=False, terminated=(1, "Error"), deleting=True),
        "Error (exit code 1)",
        id="failed-while-being-deleted",
    ),
]


def test_a_member_deleted_while_it_still_serves_its_driver_restarts_the_gang_at_once() -> None:
    """A role pod deleted while the job runs keeps running through its grace period (it serves
    the driver until the driver has saved). The operator keeps it as lost at its deletion;
    judged as the index still shows it, a live member, the gang would run on without it."""
    serving = pod("tiny-cpu", "actor", 0, deleting=True)
    indexed = replace_pod(PODS, serving)
    assert run(running(), indexed, 100).status.restart_count == 0  # what the index alone says
    kept = {serving["metadata"]["uid"]: as_lost(serving, "the pod was deleted while the job ran")}
    d = run(running(), pods_to_judge(indexed, kept), 100)
    assert (d.status.restart_count, d.status.state) == (1, "Restarting")
    assert "pod tiny-cpu-actor-0 (role actor) failed: the pod was deleted while the job ran" in (
        cond(d.status, "Restarting").message
    )


def test_the_old_gang_kept_as_lost_during_its_restart_keeps_its_grace_period() -> None:
    """A restart deletes the old gang before its status write lands, so the deletion events
    find the job still at attempt 0 and the operator keeps those pods as lost too. The next
    pass judges them: they are an earlier attempt's (no second restart) and being deleted
    already (not deleted again, at grace 0, which would cut short their time to save)."""
    serving = pod("tiny-cpu", "actor", 0, deleting=True)
    kept = {serving["metadata"]["uid"]: as_lost(serving, "the pod was deleted while the job ran")}
    restarted = after(running(), run(running(), pods_to_judge(replace_pod(PODS, serving), kept), 100))
    assert restarted.status is not None and restarted.status.restart_count == 1
    old_gang = [{**p, "metadata": {**p["metadata"], "deletionTimestamp": iso(at(100))}} for p in PODS]
    kept = {p["metadata"]["uid"]: as_lost(p, "the pod was deleted while the job ran") for p in old_gang}
    d = run(restarted, pods_to_judge(old_gang, kept), 101)
    assert d.status.restart_count == 1
    assert not [a for a in d.actions if isinstance(a, DeletePods)]


@pytest.mark.parametrize(("bad", "reason"), FAILURES)
def test_a_failed_pod_restarts_the_gang(bad: Obj, reason: str) -> None:
    d = run(running(), replace_pod(PODS, bad), 100)
    s = d.status
    assert s.restart_count == 1
    assert s.state == "Restarting"
    restarting = cond(s, "Restarting")
    # OOMKilled is named as the reason.
    expected = "OOMKilled" if "OOMKilled" in reason else "PodFailed"
    assert (restarting.status, restarting.reason) == ("True", expected)
    assert "pod tiny-cpu-actor-1 (role actor)" in restarting.message
    assert reason in restarting.message
    assert restarting.last_transition_time == iso(at(100))
    r = cond(s, "Running")
    assert (r.status, r.reason, r.last_transition_time) == ("False", "Restarting", iso(at(100)))
    assert ("Warning", expected) in events(d)
    assert (d.restart_gang, d.pods_wanted) == (True, True)
    assert d.requeue_after == 1.0
    assert s.completion_time is None


def test_a_pod_replaced_while_running_restarts_the_gang() -> None:
    """The StatefulSet recreated a pod after the gang was ready: its predecessor died unseen."""
    replacement = pod("tiny-cpu", "rollout", 0, created=at(50))
    d = run(running(), replace_pod(PODS, replacement), 100)
    assert d.status.restart_count == 1
    assert d.restart_gang
    assert "pod tiny-cpu-rollout-0 (role rollout)" in cond(d.status, "Restarting").message


@pytest.mark.parametrize(
    ("restart_count", "backoff_limit", "state"),
    [(0, 0, "Failed"), (0, 2, "Restarting"), (1, 2, "Restarting"), (2, 2, "Failed"), (1, 1, "Failed")],
)
def test_backoff_limit(restart_count: int, backoff_limit: int, state: str) -> None:
    job = load_job(CPU, set_path("spec.runPolicy.backoffLimit", backoff_limit))
    job = job.model_copy(
        update={"status": RLJobStatus(state="Restarting", restart_count=restart_count, start_time=iso(at(0)))}
    )
    pods = gang_pods(job, attempt=restart_count)
    pods = replace_pod(pods, pod("tiny-cpu", "rollout", 0, attempt=restart_count, terminated=(1, "Error")))
    d = run(job, pods, 100)
    s = d.status
    assert s.state == state
    if state == "Failed":
        failed = cond(s, "Failed")
        assert (failed.status, failed.reason) == ("True", "BackoffLimitExceeded")
        assert f"backoffLimit={backoff_limit}" in failed.message
        assert "pod tiny-cpu-rollout-0 (role rollout)" in failed.message
        assert s.restart_count == restart_count
        assert (d.pods_wanted, d.restart_gang) == (False, False)
        assert s.completion_time == iso(at(100))
        assert ("Warning", "BackoffLimitExceeded") in events(d)
        assert not any(c.type in ("Running", "Restarting") and c.status == "True" for c in s.conditions)
    else:
        assert s.restart_count == restart_count + 1
        assert (d.pods_wanted, d.restart_gang) == (True, True)
        assert not has_cond(s, "Failed")


def test_restarts_until_the_backoff_limit_then_failed() -> None:
    """backoffLimit=2: two gang restarts, and the third failure fails the job."""
    job, now = running(), 100
    for attempt in range(3):
        failure = pod("tiny-cpu", "actor", 1, attempt=attempt, phase="Failed", ready=False, terminated=(1, "Error"))
        gang = gang_pods(JOB, attempt=attempt, created=at(now - 50))
        d = run(job, replace_pod(gang, failure), now)
        job = after(job, d)
        if attempt < 2:
            assert (d.status.state, d.status.restart_count, d.restart_gang) == ("Restarting", attempt + 1, True)
            # The next gang comes up.
            job = after(job, run(job, gang_pods(JOB, attempt=attempt + 1, created=at(now + 10)), now + 20))
            assert job.status is not None
            assert job.status.state == "Running"
            now += 100
    s = d.status
    assert (s.state, s.restart_count, d.pods_wanted) == ("Failed", 2, False)
    assert cond(s, "Failed").reason == "BackoffLimitExceeded"
    assert cond(s, "Running").status == "False"
    restarting = cond(s, "Restarting")
    assert (restarting.status, restarting.reason) == ("False", "BackoffLimitExceeded")
    assert [e for e in events(d) if e[0] == "Warning"] == [("Warning", "BackoffLimitExceeded")]


def test_pods_of_an_older_attempt_are_ignored() -> None:
    failing = after(running(), run(running(), replace_pod(PODS, FAILED_ACTOR), 100))
    assert failing.status is not None
    assert failing.status.restart_count == 1
    old = [pod("tiny-cpu", "actor", 1, attempt=0, phase="Failed", ready=False, terminated=(1, "Error"))]

    # Only the dead gang is left: nothing new to restart for.
    d = run(failing, old, 101)
    assert (d.status.restart_count, d.status.state, d.restart_gang) == (1, "Restarting", False)
    assert d.status.roles["actor"] == RoleStatus(replicas=2, layout="dp2")

    # The new gang is up: Running again, the old failure still ignored.
    d = run(failing, old + gang_pods(JOB, attempt=1, created=at(110)), 120)
    s = d.status
    assert (s.restart_count, s.state, d.restart_gang) == (1, "Running", False)
    assert s.roles["actor"] == RoleStatus(replicas=2, active=2, ready=2, layout="dp2")
    restarting = cond(s, "Restarting")
    assert (restarting.status, restarting.reason) == ("False", "Resumed")
    assert cond(s, "Running").status == "True"
    assert s.start_time == iso(at(0))  # the first start counts for the deadline


def _restart_begun(pods: list[Obj]) -> Plan:
    """An operator decided the gang's restart (new templates applied, the old gang deleted)
    and died before its status write: the status still says the old attempt."""
    return run(running(), pods, 100)


@pytest.mark.parametrize(
    "pods",
    [
        pytest.param(gang_pods(JOB, attempt=1, created=at(90)), id="new-gang-up"),
        pytest.param(gang_pods(JOB, attempt=1, ready=False, created=at(90))[:2], id="new-gang-coming"),
        # Killed between applying the templates and deleting the old gang: the failed pod's
        # replacement already has the new template, the rest are of the old attempt.
        pytest.param(replace_pod(PODS, pod("tiny-cpu", "actor", 1, attempt=1, created=at(90))), id="old-gang-left"),
    ],
)
def test_a_restart_whose_status_write_was_lost_is_taken_up(pods: list[Obj]) -> None:
    d = _restart_begun(pods)
    s = d.status
    assert (s.restart_count, s.state) == (1, "Restarting")
    assert cond(s, "Restarting").status == "True"
    assert [a.attempt for a in d.actions if isinstance(a, ApplyChildren)] == [1]  # never back to attempt 0
    assert {name for a in d.actions if isinstance(a, DeletePods) for name, _ in a.pods} == {
        p["metadata"]["name"] for p in pods if p["metadata"]["annotations"][ANNOTATION_ATTEMPT] == "0"
    }
    assert cond(s, "Restarting").reason == "RestartTakenUp"
    # Then it is an ordinary restarted gang.
    d = run(after(running(), d), gang_pods(JOB, attempt=1, created=at(90)), 110)
    assert (d.status.restart_count, d.status.state, d.restart_gang) == (1, "Running", False)


def test_a_lost_restart_past_the_backoff_limit_is_still_taken_up() -> None:
    """The pass that began it checked backoffLimit; the job does not fail for it now."""
    job = load_job(CPU, set_path("spec.runPolicy.backoffLimit", 1))
    job = after(created(job), run(created(job), gang_pods(job), 10))
    d = run(job, gang_pods(job, attempt=1, created=at(90)), 100)
    assert (d.status.restart_count, d.status.state) == (1, "Restarting")
    d = run(after(job, d), gang_pods(job, attempt=1, created=at(90)), 110)
    assert (d.status.restart_count, d.status.state) == (1, "Running")


# --- success, deadlines, timeouts ---------------------------------------------------------------


@pytest.mark.parametrize(
    "driver",
    [
        pod("tiny-cpu", "controller", phase="Succeeded", ready=False, terminated=(0, "Completed")),
        pod("tiny-cpu", "controller", last_terminated=(0, "Completed"), restarts=1),
    ],
    ids=["exited", "exited-and-restarted"],
)
@pytest.mark.parametrize("ttl", [None, 600])
def test_driver_exit_0_is_success(driver: Obj, ttl: int | None) -> None:
    job = running(load_job(CPU, WITH_TTL) if ttl else JOB)
    d = run(job, replace_pod(gang_pods(job), driver), 500)
    s = d.status
    assert s.state == "Succeeded"
    succeeded = cond(s, "Succeeded")
    assert (succeeded.status, succeeded.reason) == ("True", "DriverSucceeded")
    assert cond(s, "Running").status == "False"
    assert s.completion_time == iso(at(500))
    assert not d.pods_wanted
    # One Event, though two conditions change (Succeeded True, Running False) for one reason.
    assert events(d).count(("Normal", "DriverSucceeded")) == 1
    assert d.requeue_after == ttl


def test_a_worker_exiting_0_is_not_success() -> None:
    worker = pod("tiny-cpu", "actor", 0, ready=False, terminated=(0, "Completed"))
    d = run(running(), replace_pod(PODS, worker), 500)
    assert d.status.state != "Succeeded"
    assert not has_cond(d.status, "Succeeded")
    assert d.pods_wanted


@pytest.mark.parametrize(("seconds", "failed"), [(1799, False), (1800, True), (5000, True)])
def test_active_deadline(seconds: float, failed: bool) -> None:
    d = run(running(), PODS, seconds)
    s = d.status
    if failed:
        assert s.state == "Failed"
        c = cond(s, "Failed")
        assert (c.status, c.reason) == ("True", "DeadlineExceeded")
        assert "activeDeadlineSeconds=1800" in c.message
        assert not d.pods_wanted
        assert s.completion_time == iso(at(seconds))
        assert ("Warning", "DeadlineExceeded") in events(d)
    else:
        assert s.state == "Running"
        assert d.requeue_after == pytest.approx(1.0)


def test_unschedulable_only_after_the_pending_timeout() -> None:
    stuck = pod("tiny-cpu", "rollout", 0, unschedulable=UNSCHEDULABLE)
    pods = replace_pod(PODS, stuck)
    job = created()

    early = run(job, pods, 299)
    assert not has_cond(early.status, "Unschedulable")
    assert early.requeue_after == pytest.approx(1.0)
    assert early.events == []

    late = run(job, pods, 300)
    c = cond(late.status, "Unschedulable")
    assert (c.status, c.reason) == ("True", "Unschedulable")
    assert c.message.startswith("role rollout:")
    assert "tiny-cpu-rollout-0" in c.message
    assert UNSCHEDULABLE in c.message
    assert ("Warning", "Unschedulable") in events(late)
    assert late.status.state == "Created"  # not a failure: the job waits
    assert late.pods_wanted

    # Placed at last: the condition clears.
    placed = run(after(job, late), PODS, 400)
    c = cond(placed.status, "Unschedulable")
    assert (c.status, c.reason, c.last_transition_time) == ("False", "Scheduled", iso(at(400)))
    assert placed.status.state == "Running"


@pytest.mark.parametrize(
    "reason", ["ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError"]
)
def test_bad_image_fails_after_the_pending_timeout(reason: str) -> None:
    bad = pod("tiny-cpu", "actor", 0, phase="Pending", ready=False, waiting=(reason, 'image "nope" not found'))
    pods = replace_pod(PODS, bad)
    job = created()

    early = run(job, pods, 100)
    assert early.status.state == "Created"
    assert cond(early.status, "Running").reason == reason
    assert early.requeue_after == pytest.approx(200)
    assert early.pods_wanted

    late = run(job, pods, 300)
    s = late.status
    assert s.state == "Failed"
    c = cond(s, "Failed")
    assert (c.status, c.reason) == ("True", reason)
    assert "pod tiny-cpu-actor-0 (role actor)" in c.message
    assert 'image "nope" not found' in c.message
    assert not late.pods_wanted
    assert s.completion_time == iso(at(300))


# --- pods not created -----------------------------------------------------------------------------

NO_SERVICE_ACCOUNT = (
    'create Pod tiny-cpu-rollout-0 in StatefulSet tiny-cpu-rollout failed error: pods "tiny-cpu-rollout-0" is '
    'forbidden: error looking up service account ml/missing: serviceaccount "missing" not found'
)
NO_ROLLOUT = [p for p in PODS if p["metadata"]["labels"][LABEL_ROLE] != "rollout"]


def not_created(job: RLJob, seconds: float, failed_at: float | None, pods: list[Obj] = NO_ROLLOUT) -> Plan:
    """A pass that sees the rollout StatefulSet's FailedCreate Event last seen at `failed_at` (None: none)."""
    failures = {} if failed_at is None else {"tiny-cpu-rollout": (at(failed_at), NO_SERVICE_ACCOUNT)}
    return compute_status(job, Observed([view_pod(p) for p in pods], at(seconds), create_failures=failures))


def test_a_stateful_set_that_cannot_create_its_pods_says_so_at_once() -> None:
    job = created()
    d = not_created(job, 6, failed_at=2)
    c = cond(d.status, "Running")
    # Running was False already: its status did not flip, its transition time stays.
    assert (c.status, c.reason, c.last_transition_time) == ("False", "PodsNotCreated", iso(at(0)))
    assert c.message == (
        f"StatefulSet tiny-cpu-rollout cannot create its pods: {NO_SERVICE_ACCOUNT}; the job fails if they are "
        "still missing after runPolicy.pendingTimeoutSeconds=300"
    )
    assert d.status.state == "Created"
    assert not has_cond(d.status, "Failed")
    assert [(e.type, e.reason, e.message) for e in d.events] == [("Warning", "PodsNotCreated", c.message)]
    assert d.pods_wanted
    assert d.requeue_after == pytest.approx(294)  # when the wait is over
    # Told once: the next passes of the same wait change nothing.
    again = not_created(after(job, d), 60, failed_at=58)
    assert again.events == [] and again.status == d.status


def test_every_stateful_set_that_cannot_create_its_pods_is_named() -> None:
    pods = [p for p in NO_ROLLOUT if p["metadata"]["labels"][LABEL_ROLE] != "actor"]
    failures = {name: (at(2), f"{name}: quota exceeded") for name in ("tiny-cpu-actor", "tiny-cpu-rollout")}
    d = compute_status(created(), Observed([view_pod(p) for p in pods], at(6), create_failures=failures))
    message = cond(d.status, "Running").message
    assert message.startswith("StatefulSet tiny-cpu-actor cannot create its pods (nor can tiny-cpu-rollout): ")
    assert "tiny-cpu-actor: quota exceeded" in message


@pytest.mark.parametrize(
    ("failed_at", "pods"),
    [
        (-30.0, NO_ROLLOUT),  # an Event older than the wait: an earlier attempt's (or job's)
        # The rollout has its pods since (a quota raised); the actor, short of one, reported nothing.
        (2.0, [p for p in PODS if p["metadata"]["name"] != "tiny-cpu-actor-1"]),
    ],
)
def test_a_create_failure_that_is_not_this_attempts_says_nothing(failed_at: float, pods: list[Obj]) -> None:
    d = not_created(created(), 6, failed_at=failed_at, pods=pods)
    assert cond(d.status, "Running").reason != "PodsNotCreated"
    assert ("Warning", "PodsNotCreated") not in events(d)
    assert not has_cond(d.status, "Failed")


def test_a_restarted_gangs_pods_not_created_say_so_and_it_stays_restarting() -> None:
    job = running()
    failed = replace_pod(PODS, pod("tiny-cpu", "actor", 1, phase="Failed", terminated=(1, "Error")))
    restarting = after(job, run(job, failed, 20))
    assert restarting.status is not None and restarting.status.state == "Restarting"
    new_gang = [
        p for p in gang_pods(job, attempt=1, created=at(22)) if p["metadata"]["labels"][LABEL_ROLE] != "rollout"
    ]
    # The Event of the first attempt's failure (before the restart) is not this attempt's.
    old = not_created(restarting, 30, failed_at=15, pods=new_gang)
    assert cond(old.status, "Running").reason == "Restarting"
    d = not_created(restarting, 30, failed_at=26, pods=new_gang)
    assert (cond(d.status, "Running").status, cond(d.status, "Running").reason) == ("False", "PodsNotCreated")
    assert d.status.state == "Restarting"
    assert cond(d.status, "Restarting").status == "True"


def test_the_condition_clears_once_the_pods_are_created() -> None:
    waiting = after(created(), not_created(created(), 6, failed_at=2))
    starting = gang_pods(JOB, ready=False, created=at(40))
    d = not_created(waiting, 45, failed_at=30, pods=starting)
    c = cond(d.status, "Running")
    assert (c.status, c.reason, c.message) == ("False", "PodsNotReady", "0/4 pods are ready")
    assert events(d) == [("Normal", "PodsNotReady")]
    assert d.status.state == "Created"
    ready = run(after(waiting, d), PODS, 50)
    assert (cond(ready.status, "Running").reason, ready.status.state) == ("AllPodsReady", "Running")


def test_pods_not_created_for_the_pending_timeout_fail_the_job() -> None:
    waiting = after(created(), not_created(created(), 6, failed_at=2))
    early = not_created(waiting, 299, failed_at=290)
    assert early.status.state == "Created" and early.requeue_after == pytest.approx(1)
    d = not_created(waiting, 300, failed_at=290)
    s = d.status
    assert s.state == "Failed"
    c = cond(s, "Failed")
    assert (c.status, c.reason) == ("True", "PodsNotCreated")
    assert c.message == f"StatefulSet tiny-cpu-rollout has not created its pods for over 300s: {NO_SERVICE_ACCOUNT}"
    assert [e for e in events(d) if e[1] == "PodsNotCreated"] == [("Warning", "PodsNotCreated")]
    assert not d.pods_wanted and s.completion_time == iso(at(300))


def test_create_failures_are_looked_for_after_a_short_grace_then_less_and_less_often() -> None:
    """Nothing wakes the job when an Event arrives: the status function asks for a pass when
    the grace is over, then after a quarter of the wait so far; the reconciler reads the Events
    only for StatefulSets short of pods past the grace."""
    job = created()
    views = [view_pod(p) for p in NO_ROLLOUT]
    assert stateful_sets_to_explain(job, views, at(CREATE_FAILURE_GRACE_SECONDS - 1)) == []
    assert stateful_sets_to_explain(job, views, at(CREATE_FAILURE_GRACE_SECONDS)) == ["tiny-cpu-rollout"]
    assert stateful_sets_to_explain(job, [view_pod(p) for p in PODS], at(100)) == []
    assert run(JOB, [], 0).requeue_after == pytest.approx(CREATE_FAILURE_GRACE_SECONDS)
    for seconds, look in ((1, 4), (CREATE_FAILURE_GRACE_SECONDS, 5), (10, 5), (100, 25), (280, 20)):
        d = not_created(job, seconds, failed_at=None)
        assert d.requeue_after == pytest.approx(look), seconds
        assert cond(d.status, "Running").reason == "PodsNotReady"
    # With every pod there, nothing is looked for.
    assert run(job, PODS, 10).requeue_after == pytest.approx(1790)


# --- suspend --------------------------------------------------------------------------------------


def test_suspend_and_resume() -> None:
    suspended_job = with_spec(running(), suspend=True)
    d = run(suspended_job, PODS, 100)
    s = d.status
    assert s.state == "Suspended"
    c = cond(s, "Suspended")
    assert (c.status, c.reason) == ("True", "Suspended")
    assert cond(s, "Running").status == "False"
    assert not d.pods_wanted
    assert s.start_time is None  # activeDeadlineSeconds counts from the next start
    assert ("Normal", "Suspended") in events(d)

    resumed_job = with_spec(after(suspended_job, d), suspend=False)
    d = run(resumed_job, [], 200)
    c = cond(d.status, "Suspended")
    assert (c.status, c.reason, c.last_transition_time) == ("False", "Resumed", iso(at(200)))
    assert ("Normal", "Resumed") in events(d)
    assert d.pods_wanted
    assert d.status.state == "Created"


def test_created_suspended_never_asks_for_pods() -> None:
    """Kueue creates jobs suspended and admits them by unsuspending."""
    d = run(with_spec(JOB, suspend=True), [], 0)
    assert d.status.state == "Suspended"
    assert cond(d.status, "Created").status == "True"
    assert not d.pods_wanted


# --- missing references ---------------------------------------------------------------------------

REWARD = Reference("ConfigMap", "tiny-reward", "volume reward")
SETS = {"tiny-cpu-controller", "tiny-cpu-actor", "tiny-cpu-rollout"}


def held(job: RLJob, seconds: float, *missing: Reference, pods: list[Obj] | None = None) -> Plan:
    observed = Observed([view_pod(p) for p in pods or []], at(seconds), missing_references=missing or (REWARD,))
    return compute_status(job, observed)


def test_a_missing_reference_holds_the_pods_back_and_says_what_is_missing() -> None:
    d = held(JOB, 0)
    s = d.status
    assert s.state == "Pending"
    assert not d.pods_wanted  # the StatefulSets stay at zero: no pod is created
    c = cond(s, "Created")
    assert (c.status, c.reason, c.last_transition_time) == ("False", "MissingReference", iso(at(0)))
    assert c.message == (
        "ConfigMap tiny-reward (volume reward) does not exist in namespace ml: the job's pods are created once it exists"
    )
    assert [(e.type, e.reason, e.message) for e in d.events] == [("Warning", "MissingReference", c.message)]
    assert not has_cond(s, "Running") and not has_cond(s, "Failed")
    # Looked up again soon: nothing watched would wake the job when it is created.
    assert d.requeue_after == REFERENCE_RECHECK_SECONDS

    # Still missing: nothing new to say or write.
    again = held(after(JOB, d), 5)
    assert again.status == s and again.events == [] and again.written is None
    assert not again.pods_wanted


def test_every_missing_reference_is_named() -> None:
    wandb = Reference("Secret", "wandb", "env WANDB_API_KEY of container trainer")
    c = cond(held(JOB, 0, REWARD, wandb).status, "Created")
    assert c.message.startswith(
        "ConfigMap tiny-reward (volume reward), Secret wandb (env WANDB_API_KEY of container trainer) do not exist"
    )
    assert c.message.endswith("once they exist")


def test_the_job_starts_once_the_reference_exists() -> None:
    waiting = after(JOB, held(JOB, 0))
    d = run(waiting, [], 30)
    assert d.pods_wanted
    assert d.status.state == "Created"
    c = cond(d.status, "Created")
    assert (c.status, c.reason, c.last_transition_time) == ("True", "ChildrenCreated", iso(at(30)))
    assert ("Normal", "ChildrenCreated") in events(d)
    # The pods' own timeouts count from now, not from the wait.
    d = run(after(waiting, d), [], 30 + 299)
    assert d.status.state == "Created" and not has_cond(d.status, "Failed")


def test_a_reference_missing_for_the_pending_timeout_fails_the_job() -> None:
    job = load_job(CPU, set_path("spec.runPolicy.pendingTimeoutSeconds", 60))
    first = held(job, 0)
    d = held(after(job, first), 57)
    assert d.status.state == "Pending" and d.requeue_after == pytest.approx(3)
    d = held(after(job, first), 60)
    s = d.status
    assert s.state == "Failed"
    failed = cond(s, "Failed")
    assert (failed.status, failed.reason) == ("True", "MissingReference")
    assert failed.message == (
        "ConfigMap tiny-reward (volume reward) does not exist in namespace ml after waiting "
        "pendingTimeoutSeconds=60; no pod was created"
    )
    assert ("Warning", "MissingReference") in events(d)
    assert not d.pods_wanted and s.completion_time == iso(at(60))


def test_a_resumed_job_waits_for_a_reference_deleted_meanwhile() -> None:
    suspended_job = with_spec(running(), suspend=True)
    resumed = with_spec(after(suspended_job, run(suspended_job, PODS, 100)), suspend=False)
    d = held(resumed, 200)
    assert d.status.state == "Pending" and not d.pods_wanted
    c = cond(d.status, "Created")
    assert (c.status, c.reason, c.last_transition_time) == ("False", "MissingReference", iso(at(200)))


def test_references_are_looked_up_only_before_pods_are_created() -> None:
    assert references_to_check(JOB, [], set()) == [REWARD]  # a new job
    assert references_to_check(JOB, [], SETS - {"tiny-cpu-actor"}) == [REWARD]  # a StatefulSet to create
    assert references_to_check(after(JOB, held(JOB, 0)), [], SETS) == [REWARD]  # still waiting
    views = [view_pod(p) for p in PODS]
    # Pods exist: a ConfigMap deleted under them is the kubelet's to report (ContainersNotStarted).
    assert references_to_check(running(), views, SETS) == []
    assert references_to_check(JOB, views[:1], set()) == []
    # Created, with its StatefulSets: nothing to look up (a restart's pods are the kubelet's too).
    assert references_to_check(created(), [], SETS) == []
    # Suspended: no pods wanted. Resuming: looked up again.
    suspended_job = with_spec(running(), suspend=True)
    assert references_to_check(suspended_job, [], SETS) == []
    resumed = with_spec(after(suspended_job, run(suspended_job, PODS, 100)), suspend=False)
    assert references_to_check(resumed, [], SETS) == [REWARD]
    # Ended (here: past the pending timeout still waiting): never again.
    waiting = after(JOB, held(JOB, 0))
    failed = after(waiting, held(waiting, 300))
    assert failed.status is not None and failed.status.state == "Failed"
    assert references_to_check(failed, [], SETS) == []


# --- terminal states and cleanup ------------------------------------------------------------------


def _succeeded(job: RLJob) -> RLJob:
    """Succeeded at T0 + 1000 s."""
    driver = pod("tiny-cpu", "controller", phase="Succeeded", ready=False, terminated=(0, "Completed"))
    return after(running(job), run(running(job), replace_pod(gang_pods(job), driver), 1000))


def _deadline_failed(job: RLJob) -> RLJob:
    """Failed (DeadlineExceeded) at T0 + 1810 s."""
    return after(running(job), run(running(job), gang_pods(job), 10 + 1800))


@pytest.mark.parametrize(
    ("finish", "finished_at"), [(_succeeded, 1000), (_deadline_failed, 1810)], ids=["succeeded", "failed"]
)
def test_terminal_state_sticks_and_ttl_deletes_children(finish: Callable[[RLJob], RLJob], finished_at: int) -> None:
    job = finish(load_job(CPU, WITH_TTL))
    assert job.status is not None
    state, done = job.status.state, job.status.completion_time
    assert state in ("Succeeded", "Failed")
    assert done == iso(at(finished_at))
    # Pods come back (a stale watch, a restarted operator) and even fail: nothing changes.
    pods = replace_pod(gang_pods(job), FAILED_ACTOR)
    d = run(job, pods, finished_at + 100)
    assert (d.status.state, d.status.completion_time, d.status.restart_count) == (state, done, 0)
    assert d.status.conditions == job.status.conditions
    assert d.events == []
    assert (d.pods_wanted, d.restart_gang, d.delete_children) == (False, False, False)
    assert d.requeue_after == pytest.approx(500)

    d = run(job, [], finished_at + 600)
    assert d.delete_children
    assert d.requeue_after is None
    assert d.status.state == state


def test_terminal_without_ttl_keeps_children() -> None:
    job = _deadline_failed(JOB)
    d = run(job, [], 100_000)
    assert d.status.state == "Failed"
    assert (d.delete_children, d.pods_wanted, d.requeue_after) == (False, False, None)


# --- apply errors ---------------------------------------------------------------------------------

APPLY_ERROR = {"StatefulSet/tiny-cpu-actor": 'admission webhook "policy" denied the request'}


def test_apply_error_on_a_running_job() -> None:
    d = run(running(), PODS, 100, APPLY_ERROR)
    c = cond(d.status, "Created")
    assert (c.status, c.reason, c.last_transition_time) == ("False", "CreateFailed", iso(at(100)))
    assert "StatefulSet/tiny-cpu-actor" in c.message
    assert "denied the request" in c.message
    assert ("Warning", "CreateFailed") in events(d)
    # Retried soon: no watch would wake the job for it.
    assert d.requeue_after == APPLY_RETRY_SECONDS

    # Applied at last: Created again.
    d = run(after(running(), d), PODS, 200)
    c = cond(d.status, "Created")
    assert (c.status, c.reason) == ("True", "ChildrenCreated")
    assert ("Normal", "ChildrenCreated") in events(d)


def test_apply_error_on_the_first_reconcile_is_a_condition() -> None:
    errors = {**APPLY_ERROR, "ConfigMap/tiny-cpu-config": "quota exceeded"}
    d = run(JOB, [], 0, errors)
    c = cond(d.status, "Created")
    assert (c.status, c.reason) == ("False", "CreateFailed")
    assert "ConfigMap/tiny-cpu-config: quota exceeded" in c.message
    assert "StatefulSet/tiny-cpu-actor" in c.message


def test_apply_error_on_the_first_reconcile_emits_a_warning() -> None:
    d = run(JOB, [], 0, APPLY_ERROR)
    assert ("Warning", "CreateFailed") in events(d)


# --- progress -------------------------------------------------------------------------------------

PROGRESS = {
    "step": 12,
    "totalSteps": 30,
    "rewardMean": 0.5,
    "tokensPerSecondPerGPU": 1234.5,
    "lastCheckpointStep": 10,
    "updatedAt": "2025-03-01T12:05:00Z",
}


def test_progress_is_copied_from_the_driver_pod() -> None:
    pods = replace_pod(PODS, pod("tiny-cpu", "controller", progress=PROGRESS))
    d = run(running(), pods, 300)
    assert d.status.progress == Progress(
        step=12,
        total_steps=30,
        reward_mean=0.5,
        tokens_per_second_per_gpu=1234.5,
        last_checkpoint_step=10,
        updated_at="2025-03-01T12:05:00Z",
    )
    assert d.status.to_wire()["progress"]["rewardMean"] == 0.5


@pytest.mark.parametrize(
    "pods",
    [
        replace_pod(PODS, pod("tiny-cpu", "actor", 0, progress={"step": 99})),  # only the driver reports
        replace_pod(PODS, pod("tiny-cpu", "controller", progress={"step": "many"})),  # invalid: ignored
        replace_pod(PODS, pod("tiny-cpu", "controller", progress="{not json")),
        PODS,  # the driver pod was replaced and has not reported yet
    ],
    ids=["worker-pod", "invalid", "bad-json", "none"],
)
def test_progress_keeps_the_last_good_report(pods: list[Obj]) -> None:
    reported = run(running(), replace_pod(PODS, pod("tiny-cpu", "controller", progress=PROGRESS)), 300)
    d = run(after(running(), reported), pods, 400)
    assert d.status.progress is not None
    assert d.status.progress.step == 12


def test_the_time_remaining_goes_once_the_job_has_ended() -> None:
    report = {**PROGRESS, "estimatedCompletionTime": "2025-03-01T12:10:00Z", "timeRemaining": "3m20s"}
    running_ = run(running(), replace_pod(PODS, pod("tiny-cpu", "controller", progress=report)), 300)
    assert running_.status.progress is not None and running_.status.progress.time_remaining == "3m20s"
    driver = pod("tiny-cpu", "controller", phase="Succeeded", ready=False, terminated=(0, "Completed"), progress=report)
    ended = run(after(running(), running_), replace_pod(PODS, driver), 400)
    later = run(after(running(), ended), replace_pod(PODS, driver), 500)  # a pass over the ended job
    for d in (ended, later):
        assert d.status.state == "Succeeded"
        assert d.status.progress is not None and d.status.progress.step == 12  # the rest stays
        assert (d.status.progress.time_remaining, d.status.progress.estimated_completion_time) == (None, None)


def test_no_progress_before_the_driver_reports() -> None:
    assert run(running(), PODS, 300).status.progress is None


def test_a_resumed_gang_is_not_taken_for_replaced_pods() -> None:
    """Suspend deletes the pods on purpose: the pods after resuming are a new gang, no restart."""
    suspended = after(running(), run(with_spec(running(), suspend=True), [], 100))
    assert suspended.status is not None and suspended.status.gang_pod_uids is None
    fresh = gang_pods(JOB, created=at(200))
    d = run(with_spec(suspended, suspend=False), fresh, 210)
    assert (d.status.restart_count, d.restart_gang, d.status.state) == (0, False, "Running")


# --- every decision is a fixed point --------------------------------------------------------------


def _old_gang_deleting() -> list[Obj]:
    return [{**p, "metadata": {**p["metadata"], "deletionTimestamp": iso(at(101))}} for p in PODS]


RESTARTED = after(running(), run(running(), replace_pod(PODS, FAILED_ACTOR), 100))
NEW_GANG = gang_pods(JOB, attempt=1, created=at(110))
NEW_GANG_PENDING = gang_pods(JOB, attempt=1, ready=False, created=at(110))
STUCK = replace_pod(PODS, pod("tiny-cpu", "rollout", 0, unschedulable=UNSCHEDULABLE))
BAD_IMAGE = replace_pod(PODS, pod("tiny-cpu", "actor", 0, phase="Pending", ready=False, waiting=("ErrImagePull", "x")))


@pytest.mark.parametrize(
    ("job", "pods", "seconds"),
    [
        pytest.param(JOB, [], 0, id="first-pass"),
        pytest.param(created(), gang_pods(JOB, ready=False), 5, id="pods-pending"),
        pytest.param(created(), PODS[:2], 5, id="some-pods"),
        pytest.param(created(), PODS, 10, id="all-ready"),
        pytest.param(running(), replace_pod(PODS, FAILED_ACTOR), 100, id="restart-decision"),
        pytest.param(RESTARTED, _old_gang_deleting(), 101, id="old-gang-deleting"),
        pytest.param(RESTARTED, [], 102, id="no-pods"),
        pytest.param(RESTARTED, NEW_GANG_PENDING, 111, id="new-gang-pending"),
        pytest.param(RESTARTED, NEW_GANG_PENDING[:2] + NEW_GANG[2:], 112, id="new-gang-half-ready"),
        pytest.param(RESTARTED, NEW_GANG, 113, id="new-gang-ready"),
        pytest.param(created(), STUCK, 300, id="unschedulable"),
        pytest.param(created(), BAD_IMAGE, 100, id="bad-image-waiting"),
        pytest.param(with_spec(running(), suspend=True), PODS, 100, id="suspend"),
        pytest.param(
            running(),
            replace_pod(
                PODS, pod("tiny-cpu", "controller", phase="Succeeded", ready=False, terminated=(0, "Completed"))
            ),
            100,
            id="succeeded",
        ),
    ],
)
def test_the_next_pass_over_the_same_pods_changes_nothing(job: RLJob, pods: list[Obj], seconds: float) -> None:
    """The operator does not wake a job for the watch's echo of its own status write, so a
    decision must already be what the next pass over the same pods decides: no transition
    may rely on a second pass."""
    first = run(job, pods, seconds)
    second = run(after(job, first), pods, seconds + 0.5)
    assert second.status == first.status
    assert second.events == []


# --- when a status is written -----------------------------------------------------------------------


def test_counts_and_messages_alone_wait_for_the_interval_but_transitions_do_not() -> None:
    job = created()
    assert job.status is not None
    three_ready = run(job, PODS[:3] + gang_pods(JOB, ready=False)[3:], 5).status
    assert three_ready.state == job.status.state == "Created"  # only counts and a message changed
    assert status_write_delay(job.status, three_ready, since_last_write=0.2, interval=1.0) == pytest.approx(0.8)
    assert status_write_delay(job.status, three_ready, since_last_write=1.5, interval=1.0) == 0
    all_ready = run(job, PODS, 5).status
    assert status_write_delay(job.status, all_ready, since_last_write=0.0, interval=1.0) == 0  # Running: a transition
    assert status_write_delay(job.status, job.status, since_last_write=0.0, interval=1.0) is None
    reported = running().model_copy(deep=True)
    assert reported.status is not None
    with_progress = reported.status.model_copy(update={"progress": Progress(step=3)})
    assert is_transition(reported.status, with_progress)  # the driver's progress goes out at once


# --- Kueue admission ----------------------------------------------------------------------------

KUEUE = set_path("spec.runPolicy.gang", {"scheduler": "kueue", "queue": "team-a"})


def gated(job: RLJob, created_at: float = 0) -> list[Obj]:
    """The job's pods as Kueue's pod webhook leaves them until admission: held by its
    scheduling gate, Pending, and marked SchedulingGated by the API server."""
    pods = gang_pods(job, ready=False, created=at(created_at))
    for p in pods:
        p["spec"] = {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}
        p["status"] = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}],
        }
    return pods


@pytest.mark.parametrize(("queue", "named"), [("team-a", "queue team-a"), (None, "the namespace's default queue")])
def test_pods_held_for_kueue_admission_wait_past_the_pending_timeout(queue: str | None, named: str) -> None:
    """A queue may hold a gang for hours: the job waits, saying so, and never fails for it (nor
    for activeDeadlineSeconds, 1800 s here: it counts from admission, as for a Job Kueue unsuspends)."""
    job = created(load_job(CPU, set_path("spec.runPolicy.gang", {"scheduler": "kueue", "queue": queue})))
    timeout = job.spec.run_policy.pending_timeout_seconds
    for seconds in (1, timeout, 10 * timeout):
        d = run(job, gated(job), seconds)
        c = cond(d.status, "Running")
        assert (c.status, c.reason) == ("False", "AwaitingAdmission")
        assert c.message == (
            f"waiting for Kueue admission in {named}: 4/4 pods are held by the kueue.x-k8s.io/admission gate"
        )
        assert d.status.state == "Created"
        assert not has_cond(d.status, "Unschedulable")
        assert not has_cond(d.status, "Failed")
        assert d.status.start_time is None
        assert d.pods_wanted
        job = after(job, d)


def test_admitted_gang_runs_and_the_wait_clears() -> None:
    job = created(load_job(CPU, KUEUE))
    waiting = after(job, run(job, gated(job), 5))
    admitted = run(waiting, gang_pods(waiting), 20)
    c = cond(admitted.status, "Running")
    assert (c.status, c.reason) == ("True", "AllPodsReady")
    assert admitted.status.state == "Running"
    assert admitted.status.start_time == iso(at(20))  # activeDeadlineSeconds counts from here


def test_a_restarting_gang_held_for_admission_stays_restarting() -> None:
    """After a gang restart the new attempt's group queues afresh: the job is Restarting meanwhile."""
    job = running(load_job(CPU, KUEUE))
    failed = replace_pod(gang_pods(job), pod("tiny-cpu", "actor", 1, phase="Failed", terminated=(1, "Error")))
    restarting = after(job, run(job, failed, 20))
    assert restarting.status is not None and restarting.status.restart_count == 1
    new_gang = [
        {**p, "metadata": {**p["metadata"], "annotations": {ANNOTATION_ATTEMPT: "1"}}}
        for p in gated(job, created_at=25)
    ]
    d = run(restarting, new_gang, 30)
    assert d.status.state == "Restarting"
    assert cond(d.status, "Running").reason == "AwaitingAdmission"
    assert cond(d.status, "Restarting").status == "True"
