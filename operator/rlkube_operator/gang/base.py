"""The interface every gang-scheduling plugin implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from rlkube_api.rljob import RLJob


@dataclass(frozen=True)
class PodSchedulingPatch:
    """What a gang plugin adds to a role's pod template."""

    scheduler_name: str | None = None
    priority_class_name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


class GangPlugin(Protocol):
    name: str

    def children(self, job: RLJob) -> list[dict[str, Any]]:
        """Objects the plugin needs (e.g. a PodGroup), owned by the job like the rest."""
        ...

    def pod_patch(self, job: RLJob, role: str, attempt: int) -> PodSchedulingPatch:
        """What the role's pods of this attempt (a gang restart's count) need."""
        ...


class NoGang:
    """Default: the cluster's scheduler places pods one by one."""

    name = "none"

    def children(self, job: RLJob) -> list[dict[str, Any]]:
        return []

    def pod_patch(self, job: RLJob, role: str, attempt: int) -> PodSchedulingPatch:
        return PodSchedulingPatch()
