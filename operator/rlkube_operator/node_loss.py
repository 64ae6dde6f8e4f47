"""Gang members lost with their node. A node that stops answering (powered off, its kubelet
hung, cut off) is tainted `node.kubernetes.io/unreachable` or `not-ready` (NoExecute) by the
node lifecycle controller; once a pod's toleration of that taint runs out, the taint eviction
controller marks it DisruptionTarget (reason DeletionByTaintManager) and deletes it. But only
the pod's kubelet can confirm the deletion, so on a silent node the pod stays Terminating,
and its StatefulSet makes no replacement while the old pod object exists: the restarted gang
would wait for the node forever. The operator deletes such a pod of an earlier attempt
without waiting for its kubelet (grace 0, as `kubectl delete --force` does), once the grace
period the deletion gave it has passed too: evicted past the toleration the job set, and not
confirmed by then, the node is taken as gone (docs/reliability.md, "A node lost")."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from rlkube_operator.observed import PodView
from rlkube_operator.plan import DeletePods, Event

# The DisruptionTarget reason of a pod the taint eviction controller deleted.
TAINT_EVICTION = "DeletionByTaintManager"
EVENT_LOST_POD_DELETED = "LostPodDeleted"


def lost_with_node(pod: PodView) -> bool:
    """Deleted by the taint eviction controller: its node has carried a NoExecute taint
    longer than the pod tolerates it."""
    return pod.deleting and pod.disruption_reason == TAINT_EVICTION


def loss_message(pod: PodView) -> str:
    """Why a gang member being deleted while the job ran is lost, naming its node when the
    node's taint evicted it."""
    if lost_with_node(pod):
        return (
            f"evicted from node {pod.node or '(unknown)'}: the node's NoExecute taint (unreachable or "
            "not ready) outlasted the pod's toleration"
        )
    return "the pod was deleted while the job ran"


def deletions_past_their_node(
    pods: Iterable[PodView], restart_count: int, now: datetime
) -> tuple[list[DeletePods], list[Event], list[float]]:
    """The old gang's pods lost with their node whose deletion's grace period has passed:
    deleted now without their kubelet's confirmation, one Event each naming the node; and
    the seconds until the next such pod's grace period ends (a pass is due then)."""
    gone, events, waits = [], [], []
    for pod in pods:
        if pod.attempt >= restart_count or not lost_with_node(pod) or pod.deletion_due is None:
            continue
        left = (pod.deletion_due - now).total_seconds()
        if left > 0:
            waits.append(left)
            continue
        gone.append((pod.name, pod.uid))
        events.append(
            Event(
                "Warning",
                EVENT_LOST_POD_DELETED,
                f"pod {pod.name} (uid {pod.uid}) was evicted from node {pod.node or '(unknown)'}, which has not "
                "confirmed it within its grace period: deleted without the node, so its StatefulSet makes it again",
            )
        )
    return ([DeletePods(tuple(gone))] if gone else []), events, waits
