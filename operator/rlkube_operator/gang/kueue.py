"""Kueue: the whole gang admitted as one plain-pod group.

Every pod of an attempt carries the queue label, the group's name and the group's size, so
Kueue's pod integration builds one Workload for the gang and ungates all of its pods at once,
or none: a ClusterQueue with room for half the gang admits nothing. Only the pods carry
Kueue's labels, never the StatefulSets: Kueue's statefulset integration (where a cluster
enables it) would otherwise claim each role's StatefulSet as a group of its own and admit a
partial gang.
"""

from __future__ import annotations

from typing import Any

from rlkube_api.rljob import RLJob
from rlkube_operator.children.topology import total_pods
from rlkube_operator.gang.base import PodSchedulingPatch

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE_IN_GROUP_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
# The scheduling gate Kueue's pod webhook puts on every pod it manages until admission.
ADMISSION_GATE = "kueue.x-k8s.io/admission"


def pod_group_name(job: RLJob, attempt: int) -> str:
    """One group per attempt: Kueue names the group's Workload after it, and an attempt's
    group is finished once the old gang's pods have ended (RETRIABLE_IN_GROUP_ANNOTATION), its
    Workload kept as finished. A restarted gang is a new group, admitted afresh once the old
    gang's quota is released. (41-character job names keep it a label value.)"""
    return f"{job.metadata.name}-attempt-{attempt}"


class Kueue:
    name = "kueue"

    def children(self, job: RLJob) -> list[dict[str, Any]]:
        return []

    def pod_patch(self, job: RLJob, role: str, attempt: int) -> PodSchedulingPatch:
        gang = job.spec.run_policy.gang
        assert gang is not None
        # Without a queue the group labels still go on: a namespace's default LocalQueue (or
        # manageJobsWithoutQueueName) then admits the gang whole too.
        labels = {GROUP_NAME_LABEL: pod_group_name(job, attempt)}
        if gang.queue:
            labels[QUEUE_LABEL] = gang.queue
        return PodSchedulingPatch(
            scheduler_name=gang.scheduler_name,
            priority_class_name=gang.priority_class_name,
            labels=labels,
            annotations={
                GROUP_TOTAL_COUNT_ANNOTATION: str(total_pods(job)),
                # The operator never replaces one member in place: a lost pod restarts the gang
                # as a new attempt (a new group). So the attempt's group is done once all its
                # pods have ended, and Kueue then releases its quota and its pods' finalizers
                # (a retriable group would hold both, waiting for replacements).
                RETRIABLE_IN_GROUP_ANNOTATION: "false",
            },
        )
