"""Gang members lost with their node (operator/rlkube_operator/node_loss.py): a pod the taint
eviction controller deleted from a silent node stays Terminating, as no kubelet confirms it;
the operator restarts the gang and deletes the old pod without its node once its grace period
has passed, so its StatefulSet can make it again. Pure: pods as the API server returns them,
the status function's plan."""

from __future__ import annotations

from datetime import timedelta

from rlkube_api.rljob import RLJob
from rlkube_operator.node_loss import EVENT_LOST_POD_DELETED, deletions_past_their_node, loss_message
from rlkube_operator.observed import as_lost, pods_to_judge, slim_pod, view_pod
from rlkube_operator.plan import DeletePods, Plan
from rlkube_operator.status import Observed, compute_status
from tests.operator.helpers import CPU, Obj, at, gang_pods, iso, load_job, pod, replace_pod

JOB = load_job(CPU)
GRACE = 20  # seconds: the deletion's grace period in these pods
NODE = "node-b"


def evicted(name_role: str, index: int, evicted_at: float, attempt: int = 0) -> Obj:
    """A running pod of `NODE` as it stays once the taint eviction controller deleted it and
    no kubelet answers: marked DisruptionTarget, deletionTimestamp GRACE seconds on, phase and
    containers as last reported."""
    found = pod("tiny-cpu", name_role, index, attempt=attempt)
    found["spec"] = {"nodeName": NODE}
    found["metadata"]["deletionTimestamp"] = iso(at(evicted_at) + timedelta(seconds=GRACE))
    found["status"]["conditions"].append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
        }
    )
    return found


def run(job: RLJob, pods: list[Obj], seconds: float) -> Plan:
    return compute_status(job, Observed([view_pod(p) for p in pods], at(seconds)))


def after(job: RLJob, plan: Plan) -> RLJob:
    return job.model_copy(update={"status": plan.status})


def running() -> RLJob:
    created = after(JOB, run(JOB, [], 0))
    return after(created, run(created, gang_pods(JOB), 10))


def test_an_evicted_member_restarts_the_gang_naming_its_node() -> None:
    lost = evicted("actor", 1, 100)
    view = view_pod(lost)
    assert view_pod(slim_pod(lost)) == view  # the operator's index keeps what the decision reads
    assert loss_message(view).startswith(f"evicted from node {NODE}: ")
    kept = {view.uid: as_lost(slim_pod(lost), loss_message(view))}
    plan = run(running(), pods_to_judge(replace_pod(gang_pods(JOB), lost), kept), 100)
    assert (plan.status.restart_count, plan.status.state) == (1, "Restarting")
    restarting = next(c for c in plan.status.conditions if c.type == "Restarting")
    assert f"evicted from node {NODE}" in restarting.message


def test_the_old_gang_s_member_lost_with_its_node_is_deleted_without_it_once_its_grace_has_passed() -> None:
    lost = evicted("actor", 1, 100)
    kept = {view_pod(lost).uid: as_lost(slim_pod(lost), "evicted")}
    restarted = after(running(), run(running(), pods_to_judge(replace_pod(gang_pods(JOB), lost), kept), 100))
    # The rest of the old gang is deleted by the restart (grace given); the lost pod stays.
    old_gang = [
        p if p is lost else {**p, "metadata": {**p["metadata"], "deletionTimestamp": iso(at(100 + GRACE))}}
        for p in replace_pod(gang_pods(JOB), lost)
    ]
    within = run(restarted, old_gang, 100 + GRACE - 5)
    assert not [a for a in within.actions if isinstance(a, DeletePods) and a.grace_period_seconds == 0]
    assert within.requeue_after is not None and within.requeue_after <= 5
    past = run(restarted, old_gang, 100 + GRACE + 1)
    forced = [a for a in past.actions if isinstance(a, DeletePods) and a.grace_period_seconds == 0]
    assert forced == [DeletePods(((lost["metadata"]["name"], lost["metadata"]["uid"]),))]
    [event] = [e for e in past.events if e.reason == EVENT_LOST_POD_DELETED]
    assert event.type == "Warning" and f"node {NODE}" in event.message and "tiny-cpu-actor-1" in event.message


def test_only_pods_of_an_earlier_attempt_evicted_by_their_node_s_taint_go_without_their_kubelet() -> None:
    now = at(1000)
    ordinary = view_pod(pod("tiny-cpu", "actor", 0, deleting=True))  # deleted, its kubelet alive
    current = view_pod(evicted("actor", 1, 100, attempt=1))  # the gang now running
    stale = view_pod(evicted("rollout", 0, 100))
    gone, events, waits = deletions_past_their_node([ordinary, current, stale], 1, now)
    assert gone == [DeletePods(((stale.name, stale.uid),))] and len(events) == 1 and waits == []
    assert deletions_past_their_node([stale], 1, at(100)) == ([], [], [GRACE])
