"""The rules about the running gang: suspended, past its deadline, its driver succeeded, a
restart begun or a member failed (the failure policy decides), and readiness; and whether a
pod's deletion breaks the gang (pod_loss_breaks_gang, for the pod watch)."""

from __future__ import annotations

from rlkube_api.conditions import ConditionType, State, state_of
from rlkube_api.names import CONTROLLER_ROLE
from rlkube_api.rljob import RLJob, RLJobStatus
from rlkube_operator.failure_policy import COUNTED, FailureAction, classify, gravest
from rlkube_operator.gang.kueue import ADMISSION_GATE
from rlkube_operator.observed import BAD_IMAGE_REASONS, PodView, parse_time
from rlkube_operator.rollout_scaling import (
    ROLLOUT,
    elastic_rollout,
    gang_rollout_replicas,
    new_engine,
    rollout_starting,
    scaled_away,
)
from rlkube_operator.status.one_pass import Fate, Pass, forget_gang, iso, replicas_wanted, role_counts
from rlkube_operator.status.starting import why_new_engines_are_missing

# A child the API server refused is applied again this soon (nothing watched would wake the job).
APPLY_RETRY_SECONDS = 15.0


def _first_step_pending(status: RLJobStatus) -> bool:
    """After a gang restart, whether the new gang's driver has yet to report a step: its reports
    carry their attempt. (Reports without one, from an older driver or none at all: not waited for.)"""
    progress = status.progress
    return progress is not None and progress.attempt is not None and progress.attempt < status.restart_count


def _replaced_pods(job: RLJob, current: list[PodView], prev: RLJobStatus) -> list[PodView]:
    """Pods that were not part of the gang when it last ran: their predecessor died,
    even if the operator missed the failure (it was down, or the pod was deleted). A rollout
    that scales in place gains new pods as it grows, at ordinals the gang never had: those
    are new engines, not replacements (`new_engine`)."""
    if not prev.gang_pod_uids:
        return []
    members = set(prev.gang_pod_uids)
    return [p for p in current if p.uid and p.uid not in members and not new_engine(job, prev, p)]


def _restarting_message(ready: int, wanted: int) -> str:
    return f"the gang is restarting from its last checkpoint: {ready}/{wanted} pods are ready"


def _record_gang(p: Pass) -> None:
    """The running gang, as the next passes judge pods against it: its pods, and the rollout
    ordinals it has (a rollout pod at a higher one is a scale-up's new engine)."""
    p.status.gang_pod_uids = sorted(pod.uid for pod in p.current if pod.uid)
    p.status.gang_rollout_replicas = gang_rollout_replicas(p.job, p.current, p.prev.gang_rollout_replicas)


def suspended(p: Pass) -> Fate | None:
    if not p.job.spec.suspend:
        p.conds.clear(ConditionType.SUSPENDED, "Resumed", "spec.suspend is false: pods are recreated")
        if p.observed.apply_errors:
            p.requeue.append(APPLY_RETRY_SECONDS)  # e.g. a PodGroup CRD installed after the job
        return None
    p.conds.set(ConditionType.SUSPENDED, "True", "Suspended", "spec.suspend is true: the job's pods are deleted")
    p.conds.clear(ConditionType.RUNNING, "Suspended", "the job is suspended")
    p.status.state = State.SUSPENDED.value
    p.status.start_time = None  # activeDeadlineSeconds counts from the next start, as for Jobs
    forget_gang(p.status)  # the pods are gone on purpose; the resumed gang is a new one
    return Fate.SUSPENDED


def _first_gang_held_for_admission(p: Pass) -> bool:
    """The job's first gang, not yet admitted by Kueue (its pods carry the admission gate)."""
    never_ran = state_of(p.prev.state) in (None, State.PENDING, State.CREATED) and p.status.restart_count == 0
    return never_ran and any(ADMISSION_GATE in pod.scheduling_gates for pod in p.current)


def past_deadline(p: Pass) -> Fate | None:
    if _first_gang_held_for_admission(p):
        # Counted from admission: as for a Job Kueue unsuspends, time in the queue is no run time.
        p.status.start_time = None
        return None
    # As for Jobs, the deadline counts from when the job first wanted pods, running or not.
    p.status.start_time = p.status.start_time or iso(p.now)
    deadline = p.job.spec.run_policy.active_deadline_seconds
    started = parse_time(p.status.start_time)
    if deadline is None or started is None:
        return None
    left = deadline - (p.now - started).total_seconds()
    if left > 0:
        p.requeue.append(left)
        return None
    return p.finish(
        State.FAILED,
        ConditionType.FAILED,
        "DeadlineExceeded",
        f"the job ran longer than activeDeadlineSeconds={deadline}",
    )


def driver_succeeded(p: Pass) -> Fate | None:
    if not any(pod.succeeded for pod in p.current if pod.role == CONTROLLER_ROLE):
        return None
    return p.finish(State.SUCCEEDED, ConditionType.SUCCEEDED, "DriverSucceeded", "the driver finished training")


def restart_begun(p: Pass) -> Fate | None:
    """Pods of an attempt newer than the status's: a pass decided that restart (applied the
    new templates, maybe deleted the old gang) and its operator died before writing the
    status. The restart is taken up where it stopped, not decided again: the dying pass
    checked backoffLimit, and the old gang's pods are no failure of the new one. Without
    this, the job would re-apply the old templates and count a gang it does not have."""
    newest = max((pod.attempt for pod in p.observed.pods if not pod.deleting), default=0)
    if p.prev.state is None or newest <= p.prev.restart_count:
        return None
    status = p.status
    status.restart_count = newest
    forget_gang(status)
    status.roles = role_counts(p.job, [pod for pod in p.observed.pods if pod.attempt == newest and not pod.deleting])
    ready = sum(r.ready for r in status.roles.values())
    p.conds.set(
        ConditionType.RESTARTING,
        "True",
        "RestartTakenUp",
        f"pods of attempt {newest} exist while the status said {p.prev.restart_count}: a restart begun before the"
        f" operator stopped; restarting the gang (restart {newest})",
    )
    p.conds.set(ConditionType.RUNNING, "False", "Restarting", _restarting_message(ready, replicas_wanted(status)))
    status.state = State.RESTARTING.value
    p.requeue = [1.0]
    return Fate.RESTART


def gang_failed(p: Pass) -> Fate | None:
    prev, policy = p.prev, p.job.spec.run_policy
    # A failed pod counts even while its StatefulSet deletes it.
    # A rollout pod the spec scaled away ends on purpose (its SIGTERM exit code, a Failed phase).
    failed = [
        pod
        for pod in p.observed.pods
        if pod.attempt == prev.restart_count and pod.failed and not scaled_away(p.job, pod)
    ]
    replaced = _replaced_pods(p.job, p.current, prev)
    if not (failed or replaced):
        return None
    # A replaced member whose Events tell how it ended is judged as if it had been seen.
    departed = [p.observed.departed[pod.name] for pod in replaced if pod.name in p.observed.departed]
    unknown = [pod for pod in replaced if pod.name not in p.observed.departed]
    pod, verdict = gravest(
        [(pod, classify(pod, policy.pod_failure_policy)) for pod in failed + departed]
        + [(pod, COUNTED) for pod in unknown]
    )
    if not pod.failed:
        cause = "it was deleted or failed and its StatefulSet replaced it"
    elif pod.departed:
        cause = f"{pod.failure_reason()} (from its exit record and Events: its StatefulSet replaced it while no operator watched)"
    else:
        cause = pod.failure_reason()
    what = f"pod {pod.name} (role {pod.role}) failed: {cause}"
    if verdict.why:
        what = f"{what}; {verdict.why}"
    if verdict.action is FailureAction.FAIL_JOB:
        return p.finish(State.FAILED, ConditionType.FAILED, verdict.reason, what)
    uncounted = prev.uncounted_restarts or 0
    counted = prev.restart_count - uncounted
    if verdict.action is FailureAction.COUNT and counted >= policy.backoff_limit:
        return p.finish(
            State.FAILED,
            ConditionType.FAILED,
            "BackoffLimitExceeded",
            f"{what}; {counted} restarts reached backoffLimit={policy.backoff_limit}",
        )
    status = p.status
    status.restart_count = prev.restart_count + 1
    if verdict.action is FailureAction.IGNORE:
        status.uncounted_restarts = uncounted + 1
    forget_gang(status)
    # Counted for the new attempt, as the next pass will: the decision is a fixed point,
    # so the loop needs no further pass (nor the watch's echo of this write) to settle.
    status.roles = role_counts(p.job, [pod for pod in p.observed.pods if pod.attempt == status.restart_count])
    ready = sum(r.ready for r in status.roles.values())
    p.conds.set(
        ConditionType.RESTARTING,
        "True",
        verdict.reason,
        f"{what}; restarting the gang (restart {status.restart_count})",
    )
    p.conds.set(ConditionType.RUNNING, "False", "Restarting", _restarting_message(ready, replicas_wanted(status)))
    status.state = State.RESTARTING.value
    p.requeue = [1.0]
    return Fate.RESTART


def readiness(p: Pass) -> Fate:
    status, conds = p.status, p.conds
    ready = sum(r.ready for r in status.roles.values())
    wanted = replicas_wanted(status)
    if ready == wanted and wanted > 0 and conds.is_true(ConditionType.RESTARTING) and _first_step_pending(status):
        # Restarting until the new gang trains: its pods are up, its driver resumes.
        _record_gang(p)
        conds.set(
            ConditionType.RUNNING,
            "False",
            "Restarting",
            f"all {wanted} pods are ready; waiting for the new gang's first step (restart {status.restart_count})",
        )
        status.state = State.RESTARTING.value
    elif ready == wanted and wanted > 0:
        conds.set(ConditionType.RUNNING, "True", "AllPodsReady", f"all {wanted} pods are ready")
        _record_gang(p)
        conds.clear(ConditionType.RESTARTING, "Resumed", "the gang is running again")
        status.state = State.RUNNING.value
    elif (
        state_of(p.prev.state) is State.RUNNING
        and not conds.is_true(ConditionType.RESTARTING)
        and elastic_rollout(p.job)
        and rollout_starting(status.roles)
    ):
        # A rollout scaling: the gang trains on while new engines start (and join it) or
        # removed ones go.
        rollout = status.roles[ROLLOUT]
        conds.set(
            ConditionType.RUNNING,
            "True",
            "AllPodsReady",
            f"the gang is running; the rollout is scaling: {rollout.ready}/{rollout.replicas} rollout pods are ready"
            + why_new_engines_are_missing(p),
        )
        _record_gang(p)
        status.state = State.RUNNING.value
    elif conds.is_true(ConditionType.RESTARTING):
        conds.set(ConditionType.RUNNING, "False", "Restarting", _restarting_message(ready, wanted))
        status.state = State.RESTARTING.value
    else:
        was_running = conds.is_true(ConditionType.RUNNING)
        waiting = [pod.waiting_reason for pod in p.current if pod.waiting_reason in BAD_IMAGE_REASONS]
        reason = waiting[0] if waiting else "PodsNotReady"
        conds.set(ConditionType.RUNNING, "False", reason or "PodsNotReady", f"{ready}/{wanted} pods are ready")
        # A running gang with a pod briefly not ready is still running; the condition says why.
        running = was_running or state_of(p.prev.state) is State.RUNNING
        status.state = State.RUNNING.value if running else State.CREATED.value
    return Fate.ACTIVE


def pod_loss_breaks_gang(job_state: str | None, restart_count: int, suspended: bool, pod_attempt: int) -> bool:
    """Whether a pod being deleted means the gang lost a member: a pod of the current attempt
    while the job wants pods. The operator never deletes those itself (it deletes older
    attempts, or scales to zero when suspended or done), so someone else did."""
    state = state_of(job_state)
    if suspended or state is None or state.terminal or state is State.SUSPENDED:
        return False
    return pod_attempt == restart_count
