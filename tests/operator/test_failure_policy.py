"""The failure policy (failure_policy.py) and what compute_status does with it: the trainer's
configuration error fails the job at once with its message, disruptions restart the gang
without counting, OOMKilled is named, and the user's rules come first."""

from __future__ import annotations

import pytest

from rlkube_api.exit_codes import ExitCode
from rlkube_api.rljob import PodFailurePolicy, RLJob
from rlkube_operator.failure_policy import FailureAction, classify
from rlkube_operator.observed import as_lost, view_pod
from rlkube_operator.plan import ApplyChildren, DeletePods, ScaleToZero
from tests.operator.helpers import CPU, Obj, at, gang_pods, load_job, pod, replace_pod, set_path
from tests.operator.test_status import after, cond, events, run, running

MESSAGE = "model.path (RLJob spec.model.path) '/models/nope': does not exist"


def crashed(role: str, code: int, reason: str = "Error", message: str = "", attempt: int = 0, **conditions: str) -> Obj:
    """A pod whose container exited `code` and is in CrashLoopBackOff (a StatefulSet pod restarts)."""
    found = pod(
        "tiny-cpu",
        role,
        0,
        attempt=attempt,
        ready=False,
        waiting=("CrashLoopBackOff", "back-off"),
        last_terminated=(code, reason),
    )
    container = found["status"]["containerStatuses"][0]
    container["lastState"]["terminated"]["message"] = message
    found["status"]["conditions"] += [{"type": t, "status": s} for t, s in conditions.items()]
    return found


def disrupted(role: str, attempt: int = 0) -> Obj:
    """A pod the scheduler preempted: Failed, with DisruptionTarget=True."""
    found = pod("tiny-cpu", role, 0, attempt=attempt, phase="Failed", ready=False, terminated=(137, "Error"))
    found["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    )
    return found


def stopped_by_kueue(role: str) -> Obj:
    """A running pod Kueue stopped (its Workload preempted): the condition it sets before the
    delete, and the pod as the operator keeps a member lost while it ran (observed.as_lost)."""
    found = as_lost(pod("tiny-cpu", role, 0), "the pod was deleted while the job ran")
    found["status"]["conditions"].append(
        {"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvictedDueToPreempted"}
    )
    return found


def policy(*rules: dict[str, object]) -> PodFailurePolicy:
    return PodFailurePolicy.model_validate({"rules": list(rules)})


@pytest.mark.parametrize(
    ("bad", "rules", "action", "reason"),
    [
        pytest.param(crashed("controller", ExitCode.CONFIG), None, "FailJob", "TrainerConfigError", id="config"),
        pytest.param(crashed("controller", 1), None, "Count", "PodFailed", id="error"),
        pytest.param(crashed("actor", ExitCode.STORAGE_FULL), None, "FailJob", "StorageFull", id="storage-full"),
        pytest.param(crashed("actor", 137, "OOMKilled"), None, "Count", "OOMKilled", id="oom"),
        pytest.param(disrupted("actor"), None, "Ignore", "PodDisrupted", id="preempted"),
        pytest.param(stopped_by_kueue("actor"), None, "Ignore", "PodDisrupted", id="stopped-by-kueue"),
        pytest.param(
            {**pod("tiny-cpu", "actor", phase="Failed"), "status": {"phase": "Failed", "reason": "Evicted"}},
            None,
            "Ignore",
            "PodDisrupted",
            id="evicted-by-kubelet",
        ),
        pytest.param(
            crashed("actor", 42),
            policy({"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}),
            "FailJob",
            "PodFailurePolicy",
            id="user-failjob",
        ),
        pytest.param(
            crashed("controller", ExitCode.CONFIG),
            policy({"action": "Count", "onExitCodes": {"operator": "In", "values": [78]}}),
            "Count",
            "PodFailurePolicy",
            id="user-rule-before-the-defaults",
        ),
        pytest.param(
            crashed("actor", 3),
            policy({"action": "Ignore", "onExitCodes": {"operator": "NotIn", "values": [1, 2]}}),
            "Ignore",
            "PodFailurePolicy",
            id="user-notin",
        ),
        pytest.param(
            crashed("actor", 1, ConfigIssue="True"),
            policy({"action": "FailJob", "onPodConditions": [{"type": "ConfigIssue"}]}),
            "FailJob",
            "PodFailurePolicy",
            id="user-pod-condition",
        ),
    ],
)
def test_classify(bad: Obj, rules: PodFailurePolicy | None, action: str, reason: str) -> None:
    verdict = classify(view_pod(bad), rules)
    assert (verdict.action, verdict.reason) == (FailureAction(action), reason)


def test_the_trainers_config_error_fails_the_job_at_once_with_its_message() -> None:
    pods = replace_pod(gang_pods(load_job(CPU)), crashed("controller", ExitCode.CONFIG, message=MESSAGE))
    d = run(running(), pods, 100)
    s = d.status
    assert (s.state, s.restart_count) == ("Failed", 0)
    failed = cond(s, "Failed")
    assert failed.reason == "TrainerConfigError"
    assert MESSAGE in failed.message and "exit code 78" in failed.message
    assert not d.restart_gang
    assert any(isinstance(a, ScaleToZero) for a in d.actions)
    assert ("Warning", "TrainerConfigError") in events(d)
    assert MESSAGE in next(e.message for e in d.events if e.reason == "TrainerConfigError")


def test_a_role_pods_config_error_fails_the_job_too_and_wins_over_other_failures() -> None:
    pods = replace_pod(gang_pods(load_job(CPU)), crashed("controller", 1, message="role pods did not join"))
    pods = replace_pod(pods, crashed("rollout", ExitCode.CONFIG, message=MESSAGE))
    s = run(running(), pods, 100).status
    assert (s.state, cond(s, "Failed").reason) == ("Failed", "TrainerConfigError")
    assert "pod tiny-cpu-rollout-0 (role rollout)" in cond(s, "Failed").message


def test_disruptions_restart_the_gang_without_counting_against_the_backoff_limit() -> None:
    job = running(load_job(CPU, set_path("spec.runPolicy.backoffLimit", 0)))
    for attempt in range(3):
        bad = disrupted("actor", attempt)
        pods = replace_pod(gang_pods(job, attempt=attempt), bad)
        d = run(job, pods, 100 + attempt * 100)
        assert d.status.state == "Restarting" and d.restart_gang
        assert (d.status.restart_count, d.status.uncounted_restarts) == (attempt + 1, attempt + 1)
        assert cond(d.status, "Restarting").reason == "PodDisrupted"
        job = after(job, d)
        job = after(job, run(job, gang_pods(job, attempt=attempt + 1), 150 + attempt * 100))
    # A failure that counts is the first against backoffLimit=0.
    bad = crashed("actor", 1, attempt=3)
    d = run(job, replace_pod(gang_pods(job, attempt=3), bad), 500)
    assert (d.status.state, cond(d.status, "Failed").reason) == ("Failed", "BackoffLimitExceeded")
    assert "0 restarts reached backoffLimit=0" in cond(d.status, "Failed").message


def test_a_long_termination_message_keeps_its_end() -> None:
    log_tail = "x" * 3000 + " RuntimeError: NCCL timeout"
    pods = replace_pod(gang_pods(load_job(CPU)), crashed("actor", 1, message=log_tail))
    message = cond(run(running(), pods, 100).status, "Restarting").message
    assert "RuntimeError: NCCL timeout" in message
    assert len(message) < 1300


FULL = (
    "exit code 73 (STORAGE_FULL): no space left on the volume mounted at /ckpt (0 B free of 10 GiB) writing "
    "/ckpt/metrics.jsonl: No space left on device; free space there or grow the volume, then run the job again"
)


def test_a_full_volume_fails_the_job_naming_it_and_a_spec_change_resumes_it_as_a_new_attempt() -> None:
    """A restart frees no space: the job fails at once, its condition and Event naming the class,
    the volume and the file; once the user changes the spec (having freed space), the gang
    starts again as a new attempt, not counted against backoffLimit, and the failed gang's
    pods go as an older attempt's."""
    job = running(load_job(CPU, set_path("spec.runPolicy.backoffLimit", 0)))
    pods = replace_pod(gang_pods(job), crashed("controller", ExitCode.STORAGE_FULL, message=FULL))
    d = run(job, pods, 100)
    failed = cond(d.status, "Failed")
    assert (d.status.state, failed.reason) == ("Failed", "StorageFull")
    assert "mounted at /ckpt" in failed.message and "writing /ckpt/metrics.jsonl" in failed.message
    assert "exit code 73 (STORAGE_FULL)" in failed.message and "permanent, not restarted" in failed.message
    assert not d.restart_gang
    assert ("Warning", "StorageFull") in events(d)
    assert "mounted at /ckpt" in next(e.message for e in d.events if e.reason == "StorageFull")

    # The same spec again: still Failed, nothing applied.
    job = after(job, d)
    assert run(job, pods, 110).status.state == "Failed"
    # A new generation (e.g. suspended and resumed, or the claim grown): the gang starts again.
    changed = job.model_copy(update={"metadata": job.metadata.model_copy(update={"generation": 2})})
    d = run(changed, pods, 200)
    assert d.status.state not in ("Failed", "Succeeded")
    assert (d.status.restart_count, d.status.uncounted_restarts) == (1, 1)
    assert (cond(d.status, "Failed").status, cond(d.status, "Failed").reason) == ("False", "SpecChanged")
    assert "from its last complete checkpoint" in cond(d.status, "Failed").message
    assert ApplyChildren(1, pods_wanted=True) in d.actions
    deleted = {name for a in d.actions if isinstance(a, DeletePods) for name, _uid in a.pods}
    assert "tiny-cpu-controller-0" in deleted
    # The next pass, with the new attempt's pods up, runs (backoffLimit=0 was not spent).
    job = after(changed, d)
    assert run(job, gang_pods(job, attempt=1), 260).status.state == "Running"


def test_the_user_rules_are_read_from_the_spec() -> None:
    rule = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}
    job: RLJob = running(load_job(CPU, set_path("spec.runPolicy.podFailurePolicy", rule)))
    d = run(job, replace_pod(gang_pods(job), crashed("actor", 42)), 100)
    failed = cond(d.status, "Failed")
    assert failed.reason == "PodFailurePolicy"
    assert "spec.runPolicy.podFailurePolicy.rules[0] (FailJob) matched" in failed.message


def test_restarting_until_the_new_gang_reports_its_first_step() -> None:
    """The new gang's pods being ready is not training: the job stays Restarting, the STEP it
    shows from the newest attempt, until the new driver reports."""
    job = load_job(CPU)
    old_report = {"step": 35, "totalSteps": 60, "attempt": 0}
    gang = replace_pod(gang_pods(job), pod("tiny-cpu", "controller", 0, progress=old_report))
    job = after(running(), run(running(), gang, 50))
    bad = crashed("actor", 1)
    d = run(job, replace_pod(gang, bad), 100)
    assert d.status.state == "Restarting"
    job = after(job, d)
    # The new gang is up; the old driver's pod (being deleted) still shows step 35.
    dying = pod("tiny-cpu", "controller", 0, progress=old_report, deleting=True)
    new = gang_pods(job, attempt=1, created=at(110))
    d = run(job, [*new, dying], 120)
    assert d.status.state == "Restarting"
    assert cond(d.status, "Running").status == "False"
    assert "waiting for the new gang's first step" in cond(d.status, "Running").message
    job = after(job, d)
    # Its first report (resumed from the checkpoint at step 30): Running, the step it reports.
    first = {"step": 31, "totalSteps": 60, "attempt": 1}
    new = replace_pod(new, pod("tiny-cpu", "controller", 0, attempt=1, created=at(110), progress=first))
    d = run(job, [*new, dying], 130)
    assert d.status.state == "Running"
    assert d.status.progress is not None and (d.status.progress.step, d.status.progress.attempt) == (31, 1)
    assert cond(d.status, "Restarting").reason == "Resumed"
