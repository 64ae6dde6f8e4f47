"""scheduler-plugins coscheduling: a PodGroup (scheduling.x-k8s.io/v1alpha1) with
minMember and scheduleTimeoutSeconds; pods carry the group label."""

from __future__ import annotations

from typing import Any

from rlkube_api.rljob import RLJob
from rlkube_operator.gang.base import PodSchedulingPatch
from rlkube_operator.gang.resources import pod_group

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
# The scheduler-plugins chart deploys its scheduler under this name.
DEFAULT_SCHEDULER = "scheduler-plugins-scheduler"


class Coscheduling:
    name = "coscheduling"

    def children(self, job: RLJob) -> list[dict[str, Any]]:
        gang = job.spec.run_policy.gang
        assert gang is not None
        return [pod_group(job, "scheduling.x-k8s.io/v1alpha1", scheduleTimeoutSeconds=gang.schedule_timeout_seconds)]

    def pod_patch(self, job: RLJob, role: str, attempt: int) -> PodSchedulingPatch:
        gang = job.spec.run_policy.gang
        assert gang is not None
        return PodSchedulingPatch(
            scheduler_name=gang.scheduler_name or DEFAULT_SCHEDULER,
            priority_class_name=gang.priority_class_name,
            labels={GROUP_LABEL: job.metadata.name or ""},
        )
