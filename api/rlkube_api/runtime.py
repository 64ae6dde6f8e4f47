"""Runtime templates: what a platform team decides once for many RLJobs (image, pools, pod
settings, volumes, security, priority, run policy), as `RLJobRuntime` (namespaced) and
`ClusterRLJobRuntime` (cluster-scoped). A job names one in `spec.runtimeRef` and writes only
what it trains; runtime_merge.py puts the two together.

The template holds the RLJob's own fields, with the RLJob's models (one fact written once):
a template is validated as the parts of a job are, and the merged spec once more as a whole.
Only fields the RLJob's CRD gives no default are in the template: a default the API server
fills into every job would override the runtime's value in every job.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from rlkube_api.base import ApiModel
from rlkube_api.kube_syntax import IMAGE, LONG_NAME
from rlkube_api.pod_template import JobPodTemplate, LocalObjectReference, PodTemplate
from rlkube_api.rljob import EnvVar, ObjectMeta, PodVolume
from rlkube_api.roles import ALL_ROLES, Pool
from rlkube_api.run_policy import RunPolicy

KIND = "RLJobRuntime"
PLURAL = "rljobruntimes"
CLUSTER_KIND = "ClusterRLJobRuntime"
CLUSTER_PLURAL = "clusterrljobruntimes"


class RuntimeControllerTemplate(ApiModel):
    """The controller pod's settings (spec.controller of a job)."""

    pool: Pool | None = Field(None, description="Where the controller pod goes.")
    pod_template: JobPodTemplate | None = Field(None, description="Additions to the controller pod.")


class RuntimeRoleTemplate(ApiModel):
    """One role's pod settings (spec.roles.<role> of a job)."""

    pool: Pool | None = Field(None, description="Node pool of the role's pods: nodeSelector, tolerations, affinity.")
    pod_template: PodTemplate | None = Field(None, description="Additions to the role's pods, over the job's.")


class RuntimeRoleTemplates(ApiModel):
    """Per-role pod settings, by role name (spec.roles of a job)."""

    actor: RuntimeRoleTemplate | None = Field(None, description="The actor's pods.")
    critic: RuntimeRoleTemplate | None = Field(None, description="The critic's pods (when the job has one).")
    reference: RuntimeRoleTemplate | None = Field(None, description="The reference's pods (when separate).")
    reward: RuntimeRoleTemplate | None = Field(None, description="The reward model's pods (when separate).")
    rollout: RuntimeRoleTemplate | None = Field(None, description="The rollout's pods (when separate).")


class RuntimeTemplate(ApiModel):
    """The parts of an RLJob's spec a runtime provides; each has the meaning it has in a job."""

    image: Annotated[str, IMAGE] | None = Field(None, min_length=1, max_length=1024, description="Trainer image.")
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        None, max_length=16, description="Secrets for pulling the image."
    )
    service_account_name: Annotated[str, LONG_NAME] | None = Field(
        None, max_length=253, description="Pods' ServiceAccount."
    )
    env: list[EnvVar] | None = Field(None, max_length=128, description="Extra environment of every container.")
    volumes: list[PodVolume] | None = Field(None, max_length=32, description="Volumes mounted in every trainer pod.")
    pod_template: JobPodTemplate | None = Field(
        None, description="Additions to every pod (labels, securityContext, priorityClassName, sidecars, ...)."
    )
    controller: RuntimeControllerTemplate | None = Field(None, description="The controller pod's pool and template.")
    roles: RuntimeRoleTemplates | None = Field(None, description="Each role's pool and pod template.")
    run_policy: RunPolicy | None = Field(
        None,
        description="Restarts, deadlines, gang scheduling, pod failure policy; a job's runPolicy replaces it whole.",
    )


def lockable_paths() -> tuple[str, ...]:
    """The template's fields a runtime may lock, as dotted camelCase paths of a job's spec:
    every field of the template, and each field of the pod templates in it (a securityContext,
    a priorityClassName); not inside those, nor inside pools and runPolicy, which a job
    replaces whole."""
    return tuple(_paths(RuntimeTemplate, ""))


def _paths(model: type[ApiModel], prefix: str) -> Iterator[str]:
    for name, field in model.model_fields.items():
        path = prefix + (field.alias or name)
        inner = _model_of(field.annotation)
        if inner in (RuntimeControllerTemplate, RuntimeRoleTemplates, RuntimeRoleTemplate):
            # Not lockable as a whole: every job has spec.roles.actor, and spec.controller
            # (its resources have defaults); their runtime-provided parts are.
            yield from _paths(inner, path + ".")
            continue
        yield path
        if inner is not None and issubclass(inner, PodTemplate):
            yield from (path + "." + (f.alias or n) for n, f in inner.model_fields.items())


def _model_of(annotation: Any) -> type[ApiModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, ApiModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if isinstance(arg, type) and issubclass(arg, ApiModel):
            return arg
    return None


LOCKABLE = lockable_paths()


class RLJobRuntimeSpec(ApiModel):
    """A runtime: the template every job naming it starts from, and what jobs may not change."""

    template: RuntimeTemplate = Field(
        default_factory=RuntimeTemplate, description="What jobs naming this runtime get, unless they set it."
    )
    # An enum of the paths and a set-typed list in the CRD (a CEL rule over 124 paths would
    # exceed the API server's cost budget); the same checks here.
    locked: list[str] | None = Field(
        None,
        max_length=len(LOCKABLE),
        json_schema_extra={"items": {"type": "string", "enum": list(LOCKABLE)}, "x-kubernetes-list-type": "set"},
        description="Fields of the template a job may not set (dotted paths of the job's spec, e.g. image, "
        "podTemplate.securityContext, roles.rollout.pool, runPolicy). Locking a podTemplate field also "
        "locks it in controller.podTemplate and every roles.<role>.podTemplate, which would override it on "
        "their pods; locking serviceAccountName locks it in the roles' pod templates. A job that sets a "
        "locked field is held, the condition naming it.",
    )

    @field_validator("locked")
    @classmethod
    def _known_and_unique(cls, locked: list[str] | None) -> list[str] | None:
        unknown = [p for p in locked or [] if p not in LOCKABLE]
        if unknown:
            raise ValueError(
                f"{', '.join(unknown)}: each locked entry must be a field path of the template, e.g. image, "
                "podTemplate.securityContext, roles.actor.pool, runPolicy"
            )
        if locked is not None and len(set(locked)) != len(locked):
            raise ValueError("locked entries must be unique")
        return locked


class RLJobRuntime(ApiModel):
    """A runtime template for the RLJobs of its namespace."""

    api_version: Literal["rlkube.dev/v1alpha1"] = Field("rlkube.dev/v1alpha1", description="rlkube.dev/v1alpha1")
    kind: Literal["RLJobRuntime"] = Field("RLJobRuntime", description="RLJobRuntime")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    spec: RLJobRuntimeSpec = Field(description="The template and what jobs may not change.")


class ClusterRLJobRuntime(ApiModel):
    """A runtime template for the RLJobs of every namespace."""

    api_version: Literal["rlkube.dev/v1alpha1"] = Field("rlkube.dev/v1alpha1", description="rlkube.dev/v1alpha1")
    kind: Literal["ClusterRLJobRuntime"] = Field("ClusterRLJobRuntime", description="ClusterRLJobRuntime")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    spec: RLJobRuntimeSpec = Field(description="The template and what jobs may not change.")


assert set(RuntimeRoleTemplates.model_fields) == set(ALL_ROLES), "a role without runtime pod settings"
