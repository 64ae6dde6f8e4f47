"""The rules about pods that have not started: model and data fetches, images that cannot be
pulled, containers that do not start, StatefulSets that cannot create their pods, Kueue's
admission and pods no node fits; and what is looked up before a pass to explain them."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from datetime import datetime

from rlkube_api.conditions import ConditionType, State, is_terminal, state_of
from rlkube_api.names import child_name
from rlkube_api.rljob import Condition, RLJob
from rlkube_operator.children.references import job_references
from rlkube_operator.children.topology import pod_roles
from rlkube_operator.gang.kueue import ADMISSION_GATE
from rlkube_operator.initialization import initialization
from rlkube_operator.observed import BAD_IMAGE_REASONS, STARTING_REASON, PodView, parse_time
from rlkube_operator.rollout_scaling import ROLLOUT
from rlkube_operator.status.one_pass import PODS_NOT_CREATED, Fate, Pass, replicas_wanted

CONTAINERS_NOT_STARTED = "ContainersNotStarted"
AWAITING_ADMISSION = "AwaitingAdmission"
# How soon a pod whose containers are still being created past the timeout, with nothing
# wrong reported (a large image still pulling), is looked at again.
STARTING_RECHECK_SECONDS = 30.0
CREATE_FAILURE_RECHECK_SECONDS = 5.0
# A StatefulSet (podManagementPolicy Parallel) creates all its pods within a second or so of
# being applied: only one still short of them this long after the attempt asked for them has
# its FailedCreate Events read. Earlier, nearly every new job would cost an Events list per role
# while its pods are merely on their way.
CREATE_FAILURE_GRACE_SECONDS = 5.0


def _age(pod: PodView, now: datetime) -> float:
    return (now - pod.created).total_seconds() if pod.created else 0.0


def initialized(p: Pass) -> Fate | None:
    """model.uri and data.uri (initialization.py): the Initialized condition, and the job's end
    when a fetch cannot succeed."""
    found = initialization(p.job, p.current)
    if found is None:
        return None
    p.conds.set(ConditionType.INITIALIZED, found.status, found.reason, found.message)
    return p.finish(State.FAILED, ConditionType.FAILED, found.reason, found.message) if found.failed else None


def bad_image(p: Pass) -> Fate | None:
    timeout = p.job.spec.run_policy.pending_timeout_seconds
    for pod in p.current:
        if pod.waiting_reason not in BAD_IMAGE_REASONS:
            continue
        if _age(pod, p.now) >= timeout:
            return p.finish(
                State.FAILED,
                ConditionType.FAILED,
                pod.waiting_reason or "ImagePullFailed",
                f"pod {pod.name} (role {pod.role}) cannot start its container for {timeout}s: "
                f"{pod.waiting_message or pod.waiting_reason}",
            )
        p.requeue.append(timeout - _age(pod, p.now))
    return None


def _starting_too_long(job: RLJob, pod: PodView, now: datetime) -> bool:
    return (
        pod.waiting_reason == STARTING_REASON
        and pod.scheduled_at is not None
        and (now - pod.scheduled_at).total_seconds() >= job.spec.run_policy.pending_timeout_seconds
    )


def pods_to_explain(job: RLJob, pods: list[PodView], now: datetime) -> list[PodView]:
    """Pods scheduled for pendingTimeoutSeconds whose containers have not started and whose
    status says nothing more: the kubelet's reason is in their Warning Events (FailedMount...)."""
    return [
        pod
        for pod in pods
        if pod.attempt == (job.status.restart_count if job.status else 0)
        and not pod.deleting
        and not pod.waiting_message
        and _starting_too_long(job, pod, now)
    ]


_MOUNT_FAILED = re.compile(r'for volume "([^"]+)"')


def name_volume_source(job: RLJob, cause: str) -> str:
    """The kubelet's mount error names the pod's volume, not what the user wrote ("configmap
    references non-existent config key" says nothing of which ConfigMap): the volume's
    source is added from the job's pods."""
    mount = _MOUNT_FAILED.search(cause)
    if mount is None:
        return cause
    sources = [f"{ref.kind} {ref.name}" for ref in job_references(job) if ref.use == f"volume {mount[1]}"]
    return f"{cause} (volume {mount[1]}: {', '.join(sources)})" if sources else cause


def stuck_before_start(p: Pass) -> Fate | None:
    """A scheduled pod whose containers never start (a ConfigMap, Secret or claim that cannot
    be mounted, say) ends the job after pendingTimeoutSeconds with the kubelet's message. A pod
    with nothing wrong reported is only still pulling its image: it is left alone."""
    timeout = p.job.spec.run_policy.pending_timeout_seconds
    for pod in p.current:
        if pod.waiting_reason != STARTING_REASON or pod.scheduled_at is None:
            continue
        if not _starting_too_long(p.job, pod, p.now):
            p.requeue.append(timeout - (p.now - pod.scheduled_at).total_seconds())
            continue
        cause = pod.waiting_message or p.observed.pod_warnings.get(pod.name)
        if not cause:
            p.requeue.append(STARTING_RECHECK_SECONDS)
            continue
        cause = name_volume_source(p.job, cause)
        return p.finish(
            State.FAILED,
            ConditionType.FAILED,
            CONTAINERS_NOT_STARTED,
            f"pod {pod.name} (role {pod.role}) has been scheduled for over {timeout}s without starting its "
            f"containers: {cause}",
        )
    return None


def _pods_awaited_since(job: RLJob, state: str | None, conditions: Iterable[Condition]) -> datetime | None:
    """When the current attempt's pods were asked for: the StatefulSets going in (Created), or
    the gang's restart; None before the children exist, or for a job that wants no pods."""
    if job.spec.suspend or is_terminal(state):
        return None
    wanted = (ConditionType.CREATED, ConditionType.RESTARTING)
    times = [parse_time(c.last_transition_time) for c in conditions if c.type in wanted and c.status == "True"]
    return max((t for t in times if t is not None), default=None)


def _present(job: RLJob, pods: list[PodView]) -> Counter[str]:
    attempt = job.status.restart_count if job.status else 0
    return Counter(pod.role for pod in pods if pod.attempt == attempt and not pod.deleting)


def _gang_rollout(job: RLJob) -> int | None:
    """The rollout pods a running gang needs, where its rollout scales in place: the ordinals it
    has (status.gangRolloutReplicas). A scale-up's pods past them are new engines the gang trains
    without, so their StatefulSet failing to create them must not fail the job."""
    status = job.status
    if status is None or status.gang_rollout_replicas is None or state_of(status.state) is not State.RUNNING:
        return None
    return status.gang_rollout_replicas


def _roles_missing_pods(job: RLJob, pods: list[PodView]) -> list[str]:
    """The StatefulSets short of the pods the gang needs."""
    present, gang_rollout = _present(job, pods), _gang_rollout(job)
    return [
        child_name(job.metadata.name or "", role.name)
        for role in pod_roles(job)
        if present.get(role.name, 0)
        < (role.replicas if role.name != ROLLOUT or gang_rollout is None else min(role.replicas, gang_rollout))
    ]


def _new_engines_missing(job: RLJob, pods: list[PodView]) -> str | None:
    """The rollout StatefulSet of a running gang that is short of a scale-up's new engines."""
    gang_rollout = _gang_rollout(job)
    if gang_rollout is None or _present(job, pods).get(ROLLOUT, 0) >= job.spec.roles.rollout.replicas:
        return None
    return child_name(job.metadata.name or "", ROLLOUT)


def stateful_sets_to_explain(job: RLJob, pods: list[PodView], now: datetime) -> list[str]:
    """The StatefulSets still short of pods CREATE_FAILURE_GRACE_SECONDS (or a shorter
    pendingTimeoutSeconds) after the attempt asked for them: why is in their controller's
    FailedCreate Events."""
    since = _pods_awaited_since(job, job.status.state, job.status.conditions) if job.status else None
    grace = min(CREATE_FAILURE_GRACE_SECONDS, job.spec.run_policy.pending_timeout_seconds)
    if since is None or (now - since).total_seconds() < grace:
        return []
    scaling = _new_engines_missing(job, pods)
    return _roles_missing_pods(job, pods) + ([scaling] if scaling else [])


def pods_not_created(p: Pass) -> Fate | None:
    """A StatefulSet that cannot create its pods (its controller's FailedCreate Event of this
    attempt: a missing ServiceAccount, a quota, a Pod Security violation) says so at once,
    Running=False/PodsNotCreated naming it with the controller's message, while the job waits
    for the cause to be fixed (the pods come, the condition clears). Still short of its pods
    pendingTimeoutSeconds after the attempt asked for them, it ends the job with that reason:
    its other roles' pods would otherwise hold their GPUs waiting for it forever."""
    # This pass's conditions: the pass that creates the children starts the wait, and must
    # come back when it is over (the watch may bring nothing: a StatefulSet that cannot create
    # pods may never change).
    since = _pods_awaited_since(p.job, p.status.state, p.conds.by_type.values())
    missing = _roles_missing_pods(p.job, p.observed.pods)
    if since is None or not missing:
        return None
    failures = [
        (name, message)
        for name, (last_seen, message) in sorted(p.observed.create_failures.items())
        if name in missing and last_seen >= since  # this attempt's failure, not an earlier one's
    ]
    timeout = p.job.spec.run_policy.pending_timeout_seconds
    waited = (p.now - since).total_seconds()
    if waited >= timeout:
        if failures:
            name, message = failures[0]
            return p.finish(
                State.FAILED,
                ConditionType.FAILED,
                PODS_NOT_CREATED,
                f"StatefulSet {name} has not created its pods for over {timeout}s: {message}",
            )
        # No failure reported yet: the controller-manager posts its Events asynchronously (late
        # under load), and nothing else wakes the job when one arrives.
        p.requeue.append(CREATE_FAILURE_RECHECK_SECONDS)
        return None
    p.requeue.append(timeout - waited)
    if not failures:
        # Nothing wakes the job when an Event arrives: it looks once the grace is over, then again
        # after a quarter of the wait so far (at least every 5 s), so that a StatefulSet short of
        # pods with no Event (a busy controller-manager) costs some 15 Events lists over the
        # default timeout, not 60.
        if waited < CREATE_FAILURE_GRACE_SECONDS:
            p.requeue.append(CREATE_FAILURE_GRACE_SECONDS - waited)
        else:
            p.requeue.append(max(CREATE_FAILURE_RECHECK_SECONDS, waited / 4))
        return None
    if p.conds.is_true(ConditionType.RUNNING):
        return None  # a running gang's rollout adding engines: the gang trains on (readiness)
    name, message = failures[0]
    others = [other for other, _ in failures[1:]]
    also = f" (nor can {', '.join(others)})" if others else ""
    p.conds.set(
        ConditionType.RUNNING,
        "False",
        PODS_NOT_CREATED,
        f"StatefulSet {name} cannot create its pods{also}: {message}; the job fails if they are still "
        f"missing after runPolicy.pendingTimeoutSeconds={timeout}",
    )
    restarting = p.conds.is_true(ConditionType.RESTARTING)
    p.status.state = State.RESTARTING.value if restarting else State.CREATED.value
    return Fate.ACTIVE


def why_new_engines_are_missing(p: Pass) -> str:
    """A scale-up's rollout pods that their StatefulSet reported it cannot create (a quota, say):
    the gang trains on without them, and the Running condition says why they are not coming."""
    name = _new_engines_missing(p.job, p.observed.pods)
    since = _pods_awaited_since(p.job, p.prev.state, p.prev.conditions)
    failure = p.observed.create_failures.get(name) if name else None
    if failure is None or since is None or failure[0] < since:
        return ""
    return f"; StatefulSet {name} cannot create the new ones: {failure[1]}"


def awaiting_admission(p: Pass) -> Fate | None:
    """Pods Kueue holds back (its admission gate) until the queue admits the whole gang: the
    job waits, however long the queue takes; no pending timeout runs out meanwhile."""
    gated = [pod for pod in p.current if ADMISSION_GATE in pod.scheduling_gates]
    if not gated:
        return None
    gang = p.job.spec.run_policy.gang
    queue = f"queue {gang.queue}" if gang is not None and gang.queue else "the namespace's default queue"
    wanted = replicas_wanted(p.status)
    p.conds.set(
        ConditionType.RUNNING,
        "False",
        AWAITING_ADMISSION,
        f"waiting for Kueue admission in {queue}: {len(gated)}/{wanted} pods are held by the {ADMISSION_GATE} gate",
    )
    p.conds.clear(ConditionType.UNSCHEDULABLE, AWAITING_ADMISSION, "the pods wait for Kueue admission")
    restarting = p.conds.is_true(ConditionType.RESTARTING)
    p.status.state = State.RESTARTING.value if restarting else State.CREATED.value
    return Fate.ACTIVE


def unschedulable(p: Pass) -> Fate | None:
    """Only a condition: the job waits for a node (the deadline, if any, ends it)."""
    timeout = p.job.spec.run_policy.pending_timeout_seconds
    stuck = [pod for pod in p.current if pod.unschedulable_message is not None]
    overdue = [pod for pod in stuck if _age(pod, p.now) >= timeout]
    if overdue:
        pod = overdue[0]
        p.conds.set(
            ConditionType.UNSCHEDULABLE,
            "True",
            "Unschedulable",
            f"role {pod.role}: pod {pod.name} has been Pending for over {timeout}s: {pod.unschedulable_message}",
        )
        return None
    p.requeue += [timeout - _age(pod, p.now) for pod in stuck]
    if not stuck:
        p.conds.clear(ConditionType.UNSCHEDULABLE, "Scheduled", "every pod has a node")
    return None
