"""How an RLJob names its runtime (spec.runtimeRef), and the copy of the runtime a job keeps in
its status once resolved. Apart from runtime.py so that the RLJob and its status can name
them without importing the runtime's models (which are built from the RLJob's parts)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from rlkube_api.base import ApiModel
from rlkube_api.kube_syntax import LONG_NAME

RuntimeKind = Literal["RLJobRuntime", "ClusterRLJobRuntime"]


class RuntimeRef(ApiModel):
    """The runtime whose template this job is written against."""

    kind: RuntimeKind = Field(
        "ClusterRLJobRuntime",
        description="RLJobRuntime (in the job's namespace) or ClusterRLJobRuntime (cluster-wide).",
    )
    name: Annotated[str, LONG_NAME] = Field(min_length=1, max_length=253, description="The runtime's name.")


class RuntimeSnapshot(ApiModel):
    """The runtime as the job resolved it, copied when first resolved: the job keeps using this
    copy for the rest of its life, so that a runtime edited or deleted under a job does not
    change it (new jobs get the new runtime)."""

    kind: RuntimeKind = Field(description="RLJobRuntime or ClusterRLJobRuntime.")
    name: str = Field(description="The runtime's name.")
    generation: int | None = Field(None, description="The runtime's metadata.generation when copied.")
    template: dict[str, Any] = Field(default_factory=dict, description="The runtime's spec.template when copied.")
    locked: list[str] | None = Field(None, description="The runtime's spec.locked when copied.")
