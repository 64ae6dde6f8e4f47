"""Volcano: a PodGroup (scheduling.volcano.sh/v1beta1) with minMember of all pods
and minTaskMember per role; pods name the group and their task."""

from __future__ import annotations

from typing import Any

from rlkube_api.rljob import RLJob
from rlkube_operator.children.topology import pod_roles
from rlkube_operator.gang.base import PodSchedulingPatch
from rlkube_operator.gang.resources import pod_group

GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
TASK_ANNOTATION = "volcano.sh/task-spec"


class Volcano:
    name = "volcano"

    def children(self, job: RLJob) -> list[dict[str, Any]]:
        gang = job.spec.run_policy.gang
        assert gang is not None
        spec: dict[str, Any] = {"minTaskMember": {r.name: r.replicas for r in pod_roles(job)}}
        if gang.queue:
            spec["queue"] = gang.queue
        if gang.priority_class_name:
            spec["priorityClassName"] = gang.priority_class_name
        return [pod_group(job, "scheduling.volcano.sh/v1beta1", **spec)]

    def pod_patch(self, job: RLJob, role: str, attempt: int) -> PodSchedulingPatch:
        gang = job.spec.run_policy.gang
        assert gang is not None
        return PodSchedulingPatch(
            scheduler_name=gang.scheduler_name or "volcano",
            priority_class_name=gang.priority_class_name,
            annotations={GROUP_ANNOTATION: job.metadata.name or "", TASK_ANNOTATION: role},
        )
