"""The rules that settle a job before its pods exist: a child the API server refuses, an object
the pods name that is missing, a role that does not fit its GPUs; and what is looked up before
a pass while the pods are yet to be created. A job Failed for a reason a spec change fixes
starts again here when its spec changes."""

from __future__ import annotations

from rlkube_api.conditions import ConditionType, State, is_terminal, state_of
from rlkube_api.exit_codes import EXIT_CLASSES, ExitCode
from rlkube_api.names import child_name
from rlkube_api.rljob import Condition, RLJob, RLJobStatus
from rlkube_operator.child_errors import describe
from rlkube_operator.children.references import Reference, job_references
from rlkube_operator.children.topology import pod_roles
from rlkube_operator.observed import PodView, parse_time
from rlkube_operator.status.one_pass import Fate, Pass, forget_gang, role_counts

INVALID_CHILD = "InvalidChild"
MISSING_REFERENCE = "MissingReference"
DOES_NOT_FIT = "DoesNotFit"
# The trainer's full volume (exit_codes.ExitCode.STORAGE_FULL): permanent for the gang (a
# restart frees no space), but fixed once the user grows or cleans the volume and changes the
# spec (e.g. suspends and resumes the job).
STORAGE_FULL = next(c.reason for c in EXIT_CLASSES if c.code is ExitCode.STORAGE_FULL)
# Failed for these, a job starts again when its spec changes (a new generation).
FIXED_BY_A_SPEC_CHANGE = frozenset({INVALID_CHILD, STORAGE_FULL})
# While an object the pods name is missing, it is looked up again this often (nothing
# watched would wake the job when it is created).
REFERENCE_RECHECK_SECONDS = 5.0


def children_created(p: Pass) -> None:
    """The Created condition reports the last apply (a refused child names itself), or the
    objects the pods name that are missing (no pod is created for now)."""
    if p.observed.missing_references:
        once = "it exists" if len(p.observed.missing_references) == 1 else "they exist"
        message = f"{_not_found(p)}: the job's pods are created once {once}"
        p.conds.set(ConditionType.CREATED, "False", MISSING_REFERENCE, message)
    elif p.observed.apply_errors:
        detail = "; ".join(f"{k}: {v}" for k, v in sorted(p.observed.apply_errors.items()))
        p.conds.set(ConditionType.CREATED, "False", "CreateFailed", detail)
    else:
        p.conds.set(
            ConditionType.CREATED, "True", "ChildrenCreated", "StatefulSets, Services and ConfigMap are in place"
        )


def invalid_child(p: Pass) -> Fate | None:
    """A child the API server refuses as invalid: no pod was started (apply_children holds the
    StatefulSets back), and none will be until the spec changes."""
    if not p.observed.invalid_children:
        return None
    return p.finish(State.FAILED, ConditionType.FAILED, INVALID_CHILD, describe(p.job, p.observed.invalid_children))


def _not_found(p: Pass) -> str:
    missing = p.observed.missing_references
    verb = "does" if len(missing) == 1 else "do"
    return f"{', '.join(str(ref) for ref in missing)} {verb} not exist in namespace {p.job.metadata.namespace}"


def pods_to_come(job: RLJob, pods: list[PodView], present_sets: set[str]) -> bool:
    """Whether the job's pods are yet to be created (a new job, a resumed one, one still waiting
    for them): what they need is checked before this pass, and not once they exist."""
    status = job.status or RLJobStatus()
    if job.spec.suspend or (is_terminal(status.state) and not _failed_for_an_older_spec(job)):
        return False
    if any(not pod.deleting for pod in pods):
        return False
    created = next((c for c in status.conditions if c.type == ConditionType.CREATED), None)
    waiting = created is not None and created.status == "False" and created.reason in (MISSING_REFERENCE, DOES_NOT_FIT)
    resuming = state_of(status.state) is State.SUSPENDED
    sets = {child_name(job.metadata.name or "", role.name) for role in pod_roles(job)}
    # A terminal job here is one whose spec was fixed: it starts again.
    return waiting or resuming or not sets <= present_sets or is_terminal(status.state)


def references_to_check(job: RLJob, pods: list[PodView], present_sets: set[str]) -> list[Reference]:
    """The ConfigMaps, Secrets and claims to look up before this pass: only while the job's pods
    are yet to be created. Once pods exist, a ConfigMap deleted under them is the kubelet's to
    report (stuck_before_start)."""
    return job_references(job) if pods_to_come(job, pods, present_sets) else []


def does_not_fit(p: Pass) -> Fate | None:
    """The memory estimate of a role exceeds its GPUs (looked up only before the pods are
    created): no pod is created, so none holds GPUs to run out of memory in its first step. The
    estimate is made again every few seconds (a node's label, spec.fit or the job's sizes may
    change) and the pods come once it fits."""
    if not p.observed.fit_refusals:
        return None
    message = (
        "; ".join(p.observed.fit_refusals)
        + ". No pod is created: change the layout, fsdpConfig (modelDtype, offload), the micro-batch or the "
        "GPUs (`kubectl rlkube plan` shows the estimate)"
    )
    p.conds.set(ConditionType.CREATED, "False", DOES_NOT_FIT, message)
    p.status.state = State.PENDING.value
    p.requeue.append(REFERENCE_RECHECK_SECONDS)
    return Fate.HELD


def missing_reference(p: Pass) -> Fate | None:
    """An object the pods name does not exist: no pod is created (the StatefulSets stay at zero
    replicas, as when suspended), so none sits scheduled holding GPUs for a mount that cannot
    succeed. It is looked up again every few seconds and the pods come once it exists; after
    pendingTimeoutSeconds of waiting, Failed. The wait runs from when Created turned False."""
    if not p.observed.missing_references:
        return None
    timeout = p.job.spec.run_policy.pending_timeout_seconds
    created = p.conds.by_type[ConditionType.CREATED]  # children_created set it this pass
    since = parse_time(created.last_transition_time) or p.now
    waited = (p.now - since).total_seconds()
    if waited >= timeout:
        return p.finish(
            State.FAILED,
            ConditionType.FAILED,
            MISSING_REFERENCE,
            f"{_not_found(p)} after waiting pendingTimeoutSeconds={timeout}; no pod was created",
        )
    p.status.state = State.PENDING.value
    p.requeue.append(min(REFERENCE_RECHECK_SECONDS, timeout - waited))
    return Fate.HELD


def _failed(job: RLJob) -> Condition | None:
    """The job's Failed condition, if it is True."""
    conditions = job.status.conditions if job.status else []
    failed = next((c for c in conditions if c.type == ConditionType.FAILED), None)
    return failed if failed is not None and failed.status == "True" else None


def _failed_for_an_older_spec(job: RLJob) -> bool:
    """Failed for a reason a spec change may fix (FIXED_BY_A_SPEC_CHANGE), and the spec has
    changed since."""
    failed = _failed(job)
    if failed is None or failed.reason not in FIXED_BY_A_SPEC_CHANGE:
        return False
    return failed.observed_generation != job.metadata.generation


def spec_fixed(p: Pass) -> bool:
    """A job Failed for an invalid child or a full volume whose spec has changed since: it
    starts again (the Failed condition cleared, the new spec's children applied). After a full
    volume the gang ran: it starts as a new attempt, not counted against backoffLimit (the
    failed gang's pods are an older attempt's, no failure of the new one), and its driver
    resumes from the last complete checkpoint."""
    if not _failed_for_an_older_spec(p.job):
        return False
    message = "the spec changed: its children are applied again"
    failed = _failed(p.job)
    if failed is not None and failed.reason == STORAGE_FULL:
        status = p.status
        status.restart_count = p.prev.restart_count + 1
        status.uncounted_restarts = (p.prev.uncounted_restarts or 0) + 1
        forget_gang(status)
        p.prev = p.prev.model_copy(update={"restart_count": status.restart_count, "gang_pod_uids": None})
        p.current = []
        status.roles = role_counts(p.job, [])
        message = (
            "the spec changed after the volume filled up: the gang starts again "
            f"(restart {status.restart_count}, not counted) from its last complete checkpoint"
        )
    p.conds.set(ConditionType.FAILED, "False", "SpecChanged", message)
    p.status.state = State.CREATED.value
    p.status.completion_time = None
    return True
