"""The status function itself: the rules in their order, and the plan of one pass they make:
the status write, the children applied, the old gang's pods deleted, or an ended job's pods
released."""

from __future__ import annotations

from collections.abc import Iterable

from rlkube_api.conditions import State, is_terminal, state_of
from rlkube_api.names import CONTROLLER_ROLE, child_name
from rlkube_api.rljob import Progress, RLJob, RLJobStatus
from rlkube_operator.children.topology import pod_roles
from rlkube_operator.node_loss import deletions_past_their_node
from rlkube_operator.observed import PodView, parse_time
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
from rlkube_operator.rollout_scaling import rollout_scaled
from rlkube_operator.status.before_pods import (
    children_created,
    does_not_fit,
    invalid_child,
    missing_reference,
    spec_fixed,
)
from rlkube_operator.status.gang_rules import (
    driver_succeeded,
    gang_failed,
    past_deadline,
    readiness,
    restart_begun,
    suspended,
)
from rlkube_operator.status.one_pass import Conditions, Fate, Observed, Pass, Rule, role_counts
from rlkube_operator.status.starting import (
    awaiting_admission,
    bad_image,
    initialized,
    pods_not_created,
    stuck_before_start,
    unschedulable,
)
from rlkube_operator.status.writes import COUNTS_WRITE_INTERVAL, status_write_delay

# SIGTERM to SIGKILL for the pods of a job that has ended. Its pods have nothing left to save: a
# succeeded driver wrote its last checkpoint before it recorded its success, and a failed job
# never runs again. A few seconds let the processes end cleanly; the job's own grace period
# (runPolicy.terminationGracePeriodSeconds, for saving the step in progress) would hold every
# pod, and the resources it asked for, that long after the end.
FINISHED_GRACE_SECONDS = 5


def _progress(pods: list[PodView], previous: Progress | None) -> Progress | None:
    """The driver's latest report (the controller pod's progress annotation)."""
    reports = [p.progress for p in pods if p.role == CONTROLLER_ROLE and p.progress]
    if not reports:
        return previous
    # The newest attempt's report first: a dead gang's pod (still being deleted) may show a
    # later step than the new gang, which resumed from a checkpoint before it.
    latest = max(reports, key=lambda r: (_int(r.get("attempt")), _int(r.get("step")), str(r.get("updatedAt", ""))))
    known = {f.alias or name for name, f in Progress.model_fields.items()}
    try:
        # Fields a newer driver adds are ignored, not a reason to drop the report.
        return Progress.model_validate({k: v for k, v in latest.items() if k in known})
    except ValueError:
        return previous


def _without_estimate(progress: Progress | None) -> Progress | None:
    """An ended job's progress: nothing is left to estimate (the driver's last report still had)."""
    if progress is None:
        return None
    return progress.model_copy(update={"time_remaining": None, "estimated_completion_time": None})


def _int(value: object) -> int:
    return value if isinstance(value, int) else -1


# The rules, in the order they are tried; the first to return a Fate decides the pass.
RULES: tuple[Rule, ...] = (
    invalid_child,
    suspended,
    past_deadline,
    driver_succeeded,
    restart_begun,
    initialized,
    gang_failed,
    missing_reference,
    does_not_fit,
    bad_image,
    stuck_before_start,
    pods_not_created,
    awaiting_admission,
    unschedulable,
    readiness,
)


def compute_status(job: RLJob, observed: Observed) -> Plan:
    prev = job.status or RLJobStatus()
    status = prev.model_copy(deep=True)
    status.observed_generation = job.metadata.generation
    current = [pod for pod in observed.pods if pod.attempt == prev.restart_count and not pod.deleting]
    status.roles = role_counts(job, current)
    status.progress = _progress(observed.pods, prev.progress)
    p = Pass(job, observed, prev, status, Conditions(prev.conditions, observed.now, job.metadata.generation), current)

    if is_terminal(prev.state) and not spec_fixed(p):
        status.progress = _without_estimate(status.progress)
        return _finished(p)
    children_created(p)
    if (scaled := rollout_scaled(job, prev)) is not None:
        p.conds.events.append(scaled)
    fate = Fate.ACTIVE
    for rule in RULES:
        if (decided := rule(p)) is not None:
            fate = decided
            break
    status.conditions = p.conds.as_list()
    if is_terminal(status.state):
        status.progress = _without_estimate(status.progress)

    if fate is Fate.FINISHING:
        # The terminal state is written first: the pods are its evidence (the driver's exit
        # code or finished run) until it is stored.
        return _with_write(p, [], fate, then=_release(job, observed.pods))
    # For a restart: the new templates first (the attempt annotation), then the old gang goes.
    actions: list[Action] = [ApplyChildren(status.restart_count, pods_wanted=fate not in (Fate.SUSPENDED, Fate.HELD))]
    actions += _stale_pods(observed, status, job.spec.run_policy.termination_grace_period_seconds)
    gone, events, waits = deletions_past_their_node(observed.pods, status.restart_count, observed.now)
    actions += gone
    p.conds.events += events
    p.requeue += waits
    return _with_write(p, actions, fate)


def _finished(p: Pass) -> Plan:
    """A terminal job: no children applied, no pod left (those still there, say after the
    operator stopped between writing the terminal state and deleting them, are deleted);
    the children are deleted once the TTL elapses."""
    actions = _release(p.job, p.observed.pods)
    ttl = p.job.spec.run_policy.ttl_seconds_after_finished
    done = parse_time(p.prev.completion_time)
    if ttl is not None and done is not None:
        left = ttl - (p.now - done).total_seconds()
        if left <= 0:
            actions.append(DeleteChildren())
        else:
            p.requeue.append(left)
    return _with_write(p, actions, None)


def _release(job: RLJob, pods: list[PodView]) -> list[Action]:
    """An ended job lets go of its pods at once: every pod still there is deleted with
    FINISHED_GRACE_SECONDS (those whose containers ended at once), then its StatefulSets go to
    zero replicas so that nothing recreates them. Deleted first, the pods get the short grace
    period as their only one: scaled down first, the StatefulSet controller would delete them
    with the pods' own (the job's, for saving a step), and only a kubelet that honours a
    shortened grace period would cut that. A StatefulSet recreates no pod while its
    predecessor terminates, so the scale-down right after comes in time. Pods already being
    deleted get the short grace period too (it shortens a longer one); nothing once the pods
    are gone."""
    if not pods:
        return []
    ended = tuple((pod.name, pod.uid) for pod in pods if pod.failed or (pod.succeeded and not pod.run_finished))
    running = tuple((pod.name, pod.uid) for pod in pods if (pod.name, pod.uid) not in ended)
    actions: list[Action] = []
    if ended:
        actions.append(DeletePods(ended))
    if running:
        actions.append(DeletePods(running, FINISHED_GRACE_SECONDS))
    actions.append(ScaleToZero(tuple(child_name(job.metadata.name or "", r.name) for r in pod_roles(job))))
    return actions


def _stale_pods(observed: Observed, status: RLJobStatus, grace_period_seconds: int) -> list[Action]:
    """Pods of an earlier attempt still around (a restart's old gang): those whose containers
    ended at once, the running ones with the grace period to save the step in progress."""
    stale = [pod for pod in observed.pods if pod.attempt < status.restart_count and not pod.deleting]
    ended = tuple((pod.name, pod.uid) for pod in stale if pod.failed or pod.succeeded)
    running = tuple((pod.name, pod.uid) for pod in stale if not (pod.failed or pod.succeeded))
    actions: list[Action] = []
    if ended:
        actions.append(DeletePods(ended))
    if running:
        actions.append(DeletePods(running, grace_period_seconds))
    return actions


def _with_write(p: Pass, actions: list[Action], fate: Fate | None, then: Iterable[Action] = ()) -> Plan:
    """Adds the status write (now, or a requeue for when it is due), the actions that come
    after it (`then`) and the metrics."""
    events = p.conds.events if fate is not None else []
    requeue = list(p.requeue)
    delay = status_write_delay(p.prev, p.status, p.observed.since_last_write, COUNTS_WRITE_INTERVAL)
    if delay == 0:
        actions.append(WriteStatus(p.status))
    elif delay is not None:
        # Nothing is lost: the next pass computes the status afresh from the pods.
        requeue.append(delay)
    actions += then
    if fate is Fate.RESTART:
        actions.append(CountRestart())
    first_run = state_of(p.prev.state) in (None, State.PENDING, State.CREATED) and p.status.restart_count == 0
    if state_of(p.status.state) is State.RUNNING and first_run and p.observed.job_created is not None:
        actions.append(ObserveTimeToRunning((p.now - p.observed.job_created).total_seconds()))
    return Plan(p.status, events, actions, min(requeue) if requeue else None)
