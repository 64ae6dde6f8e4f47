"""Kueue: admission through spec.suspend (Kueue unsuspends an admitted job) and
the queue-name label on the job's workloads."""

from __future__ import annotations

from typing import Any

from rlkube_api.rljob import RLJob
from rlkube_operator.gang.base import PodSchedulingPatch

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class Kueue:
    name = "kueue"

    def children(self, job: RLJob) -> list[dict[str, Any]]:
        return []

    def pod_patch(self, job: RLJob, role: str) -> PodSchedulingPatch:
        gang = job.spec.run_policy.gang
        assert gang is not None
        return PodSchedulingPatch(
            scheduler_name=gang.scheduler_name,
            priority_class_name=gang.priority_class_name,
            labels=self.job_labels(job),
        )

    def job_labels(self, job: RLJob) -> dict[str, str]:
        gang = job.spec.run_policy.gang
        return {QUEUE_LABEL: gang.queue} if gang is not None and gang.queue else {}
