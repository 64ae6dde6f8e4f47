"""Pod template overrides: what a cluster needs on the trainer's pods that rlkube
itself does not decide (labels for cost tracking, a Secret's value in the
environment, RDMA devices, a log-shipping sidecar, a restricted securityContext).

One `podTemplate` for the whole job (`spec.podTemplate`) and one per role
(`spec.roles.<role>.podTemplate`, `spec.controller.podTemplate`). The merge, done by
the operator (`rlkube_operator/children/overrides.py`), is:

- the job's template first, then the role's on top: maps (labels, annotations,
  resources, securityContexts) merge key by key and lists merge by their key (env,
  volumes, initContainers, sidecars, imagePullSecrets, schedulingGates by name,
  volumeMounts by mountPath), the role's entry replacing the job's;
  topologySpreadConstraints, priorityClassName and serviceAccountName are replaced
  whole;
- then onto the pod the operator builds: labels and annotations are added, env comes
  after the operator's (so it overrides rlkube's NCCL defaults and `spec.env`),
  resources are added to the trainer container's, volumes and mounts are appended,
  the pod and container securityContexts are merged key by key, initContainers and
  sidecars are appended, priorityClassName replaces the gang's.

What the operator owns is refused with a message naming the field: the rendezvous
and Ray environment, its volumes and mount paths, its labels and annotations, the
GPU/CPU/memory resources (set by gpusPerReplica and resources), and the trainer
container itself (there is no command field; a sidecar may not be named `trainer`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.kube_syntax import (
    CONFIG_MAP_KEY,
    ENV_NAME_PATTERN,
    IMAGE,
    LOCAL_PATH,
    LONG_NAME,
    QUALIFIED_NAME,
    QUALIFIED_NAME_WHAT,
    SHORT_NAME,
    LabelValue,
    cel_is_annotation_key,
    cel_is_label_key,
)
from rlkube_api.names import AGENT_DIR, CONFIG_DIR, REWARD_DIR, SHM_DIR, Env
from rlkube_api.security_context import ContainerSecurityContext, PodSecurityContext
from rlkube_api.volumes import VolumeSource

# The trainer container's name; sidecars may not take it.
TRAINER_CONTAINER = "trainer"
# Volume names the operator itself mounts in every pod.
OPERATOR_VOLUMES = ("agent", "checkpoints", "config", "reward", "shm")
OPERATOR_MOUNT_PATHS = (AGENT_DIR, CONFIG_DIR, REWARD_DIR, SHM_DIR)
# Variables the operator sets in every pod; a user value would break the rendezvous.
RESERVED_ENV = tuple(sorted(v for k, v in vars(Env).items() if k.isupper()))
# Set from gpusPerReplica and resources; one fact written once.
OPERATOR_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
# Label and annotation keys the operator writes (selectors, attempts, progress, gangs).
OPERATOR_KEY_PREFIX = "rlkube.dev/"
OPERATOR_LABELS = ("app.kubernetes.io/managed-by",)

_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

# The downward API's fields an environment variable may take (the core API's
# validEnvDownwardAPIFieldPathExpressions), and one label or annotation by key.
ENV_FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
ENV_FIELD_PATH_PATTERN = (
    "^(" + "|".join(path.replace(".", "[.]") for path in ENV_FIELD_PATHS) + ")$"
    "|^metadata[.](labels|annotations)\\['[^']+'\\]$"
)
# Resources a variable may take (validEnvDownwardAPIResourcePathExpressions, and huge pages).
ENV_RESOURCE_PATTERN = "^(limits|requests)[.](cpu|memory|ephemeral-storage|hugepages-.+)$"
# The divisors the core API allows per resource (validateContainerResourceDivisor), compared as
# quantities as it does (1000m is 1).
CPU_DIVISORS = ("1m", "1")
BYTE_DIVISORS = ("1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei")


def _divisor_in(expr: str, divisors: tuple[str, ...]) -> str:
    return f"{_json(divisors)}.exists(d, quantity({expr}).compareTo(quantity(d)) == 0)"


def _json(values: tuple[str, ...]) -> str:
    return json.dumps(list(values))


def _unique(field: str, key: str = "name") -> CelRule:
    return CelRule(
        f"!has(self.{field}) || self.{field}.all(x, self.{field}.exists_one(y, y.{key} == x.{key}))",
        f"{key}s must be unique",
        f".{field}",
    )


class _KubeObject(ApiModel):
    """A Kubernetes object of its own kind, passed through as written; only the fields
    rlkube checks are declared (the API server validates the rest on the StatefulSet)."""

    model_config = ConfigDict(**{**ApiModel.model_config, "extra": "allow"})


class SecretKeySelector(ApiModel):
    """A key of a Secret in the job's namespace."""

    name: Annotated[str, LONG_NAME] = Field(min_length=1, max_length=253, description="Secret name.")
    key: Annotated[str, CONFIG_MAP_KEY] = Field(min_length=1, max_length=253, description="Key in the Secret.")
    optional: bool | None = Field(None, description="Start even when the Secret or key is missing.")


class ConfigMapKeySelector(ApiModel):
    """A key of a ConfigMap in the job's namespace."""

    name: Annotated[str, LONG_NAME] = Field(min_length=1, max_length=253, description="ConfigMap name.")
    key: Annotated[str, CONFIG_MAP_KEY] = Field(min_length=1, max_length=253, description="Key in the ConfigMap.")
    optional: bool | None = Field(None, description="Start even when the ConfigMap or key is missing.")


class ObjectFieldSelector(ApiModel):
    """A field of the pod (the downward API), e.g. metadata.name or spec.nodeName."""

    field_path: str = Field(
        min_length=1,
        max_length=512,
        pattern=ENV_FIELD_PATH_PATTERN,
        description="Path of the field: " + ", ".join(ENV_FIELD_PATHS) + ", metadata.labels['KEY'] or "
        "metadata.annotations['KEY'].",
    )
    api_version: Literal["v1"] | None = Field(None, description="Schema version of fieldPath (v1).")


class ResourceFieldSelector(ApiModel):
    """A resource of the trainer container, e.g. limits.memory."""

    cel_rules = (
        CelRule(
            "!has(self.divisor) || !self.resource.endsWith('.cpu') || isQuantity(self.divisor) && "
            + _divisor_in("self.divisor", CPU_DIVISORS),
            "with a cpu resource the divisor must be " + " or ".join(CPU_DIVISORS),
            ".divisor",
        ),
        CelRule(
            "!has(self.divisor) || !(self.resource.endsWith('.memory') || self.resource.endsWith('.ephemeral-storage'))"
            " || isQuantity(self.divisor) && " + _divisor_in("self.divisor", BYTE_DIVISORS),
            "with a memory or ephemeral-storage resource the divisor must be one of " + ", ".join(BYTE_DIVISORS),
            ".divisor",
        ),
    )

    resource: str = Field(
        min_length=1,
        max_length=253,
        pattern=ENV_RESOURCE_PATTERN,
        description="Resource: limits. or requests. and cpu, memory, ephemeral-storage or hugepages-SIZE.",
    )
    container_name: Annotated[str, SHORT_NAME] | None = Field(
        None, max_length=63, description="Container (default: trainer)."
    )
    divisor: str | None = Field(None, max_length=32, description="Unit of the value, e.g. 1Mi.")


class EnvVarSource(ApiModel):
    """Where a variable's value comes from (exactly one)."""

    cel_rules = (
        CelRule(
            "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), has(self.resourceFieldRef)]"
            ".filter(x, x).size() == 1",
            "exactly one of secretKeyRef, configMapKeyRef, fieldRef and resourceFieldRef must be set",
        ),
    )

    secret_key_ref: SecretKeySelector | None = Field(None, description="A Secret's key.")
    config_map_key_ref: ConfigMapKeySelector | None = Field(None, description="A ConfigMap's key.")
    field_ref: ObjectFieldSelector | None = Field(None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(None, description="A resource of the container.")


class EnvVarOverride(ApiModel):
    """A variable of the trainer container: a value, or a value from a Secret, ConfigMap or the pod."""

    cel_rules = (
        CelRule(
            "!(self.name in " + _json(RESERVED_ENV) + ")",
            "may not set a variable the operator manages: " + ", ".join(RESERVED_ENV),
            ".name",
        ),
        CelRule("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both", ".valueFrom"),
    )

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str | None = Field(None, max_length=32768, description="Value.")
    value_from: EnvVarSource | None = Field(None, description="Value from a Secret, ConfigMap or the pod.")


class ExtraResources(ApiModel):
    """Resources added to the trainer container, e.g. {rdma/ib: 1} or {vpc.amazonaws.com/efa: 4}."""

    cel_rules = tuple(
        CelRule(
            f"!has(self.{part}) || self.{part}.all(k, !(k in " + _json(OPERATOR_RESOURCES) + "))",
            "cpu, memory and nvidia.com/gpu are set by the role's resources and gpusPerReplica",
            f".{part}",
        )
        for part in ("requests", "limits")
    )

    requests: dict[str, str] | None = Field(None, max_length=32, description="Extra requests (quantities).")
    limits: dict[str, str] | None = Field(None, max_length=32, description="Extra limits (quantities).")


class VolumeOverride(VolumeSource):
    """A Kubernetes Volume added to the pod: {name, <source>: {...}}."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        *VolumeSource.cel_rules,
        CelRule(
            "!(self.name in " + _json(OPERATOR_VOLUMES) + ")",
            "name is used by the operator: " + ", ".join(OPERATOR_VOLUMES),
            ".name",
        ),
    )

    name: str = Field(min_length=1, max_length=63, pattern=_NAME, description="Volume name (DNS label).")


class VolumeMountOverride(ApiModel):
    """A Kubernetes VolumeMount added to the trainer container."""

    cel_rules = (
        CelRule(
            "!(self.mountPath in " + _json(OPERATOR_MOUNT_PATHS) + ")",
            "mountPath is used by the operator: " + ", ".join(OPERATOR_MOUNT_PATHS),
            ".mountPath",
        ),
        CelRule(
            "!(has(self.subPath) && has(self.subPathExpr))", "set subPath or subPathExpr, not both", ".subPathExpr"
        ),
        CelRule(
            "!has(self.recursiveReadOnly) || self.recursiveReadOnly == 'Disabled' || "
            "(has(self.readOnly) && self.readOnly && (!has(self.mountPropagation) || self.mountPropagation == 'None'))",
            "recursiveReadOnly needs readOnly: true and mountPropagation None",
            ".recursiveReadOnly",
        ),
    )

    name: Annotated[str, SHORT_NAME] = Field(
        min_length=1, max_length=63, description="The volume (podTemplate.volumes, spec.volumes or the operator's)."
    )
    mount_path: str = Field(min_length=1, max_length=4096, pattern=r"^/", description="Absolute path.")
    read_only: bool | None = Field(None, description="Mount read-only.")
    sub_path: Annotated[str, LOCAL_PATH] | None = Field(
        None, max_length=4096, description="Mount this path of the volume (relative, no '..')."
    )
    sub_path_expr: Annotated[str, LOCAL_PATH] | None = Field(
        None, max_length=4096, description="subPath with $(VAR) references to the container's environment."
    )
    mount_propagation: Literal["None", "HostToContainer", "Bidirectional"] | None = Field(
        None, description="How mounts propagate between the host and the container."
    )
    recursive_read_only: Literal["Disabled", "IfPossible", "Enabled"] | None = Field(
        None, description="Make submounts read-only too."
    )


class ContainerOverride(_KubeObject):
    """A Kubernetes Container (an init container or a sidecar), passed through as written."""

    cel_rules = (
        CelRule(
            f"self.name != '{TRAINER_CONTAINER}'",
            f"the container named {TRAINER_CONTAINER} is the operator's",
            ".name",
        ),
    )

    name: str = Field(min_length=1, max_length=63, pattern=_NAME, description="Container name (DNS label).")
    image: Annotated[str, IMAGE] = Field(min_length=1, max_length=1024, description="The container's image.")


class LocalObjectReference(ApiModel):
    """A reference to an object in the job's namespace."""

    name: Annotated[str, LONG_NAME] = Field(min_length=1, max_length=253, description="Object name.")


class SchedulingGate(ApiModel):
    """A pod scheduling gate: the pod stays unscheduled until a controller removes it."""

    name: Annotated[str, QUALIFIED_NAME] = Field(min_length=1, max_length=316, description="Gate name.")


def _keys_rule(field: str) -> CelRule:
    return CelRule(
        f"!has(self.{field}) || self.{field}.all(k, !k.startsWith('{OPERATOR_KEY_PREFIX}')"
        f" && !(k in " + _json(OPERATOR_LABELS) + "))",
        f"keys under {OPERATOR_KEY_PREFIX} and {', '.join(OPERATOR_LABELS)} are the operator's",
        f".{field}",
    )


class PodTemplate(ApiModel):
    """Additions to a role's pods (the job's template, then the role's, on top of what the operator builds)."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        _keys_rule("labels"),
        _keys_rule("annotations"),
        CelRule(
            f"!has(self.labels) || self.labels.all(k, {cel_is_label_key('k')})",
            "label keys must be qualified names: " + QUALIFIED_NAME_WHAT,
            ".labels",
        ),
        CelRule(
            f"!has(self.annotations) || self.annotations.all(k, {cel_is_annotation_key('k')})",
            "annotation keys must be qualified names: " + QUALIFIED_NAME_WHAT,
            ".annotations",
        ),
        _unique("env"),
        _unique("volumes"),
        _unique("volumeMounts", "mountPath"),
        _unique("initContainers"),
        _unique("sidecars"),
    )

    labels: dict[str, LabelValue] | None = Field(None, max_length=64, description="Pod labels.")
    annotations: dict[str, str] | None = Field(None, max_length=64, description="Pod annotations.")
    env: list[EnvVarOverride] | None = Field(
        None, max_length=64, description="Trainer container env, with valueFrom (secretKeyRef, configMapKeyRef, ...)."
    )
    resources: ExtraResources | None = Field(None, description="Extra resources of the trainer container.")
    volumes: list[VolumeOverride] | None = Field(None, max_length=32, description="Extra pod volumes.")
    volume_mounts: list[VolumeMountOverride] | None = Field(
        None, max_length=32, description="Extra mounts of the trainer container."
    )
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        None, max_length=16, description="Extra Secrets for pulling images (sidecars' too)."
    )
    priority_class_name: Annotated[str, LONG_NAME] | None = Field(
        None, max_length=253, description="The pods' PriorityClass."
    )
    service_account_name: Annotated[str, LONG_NAME] | None = Field(
        None, max_length=253, description="The pods' ServiceAccount (role templates only)."
    )
    pod_security_context: PodSecurityContext | None = Field(
        None, description="The pod's securityContext (a Kubernetes PodSecurityContext), merged key by key."
    )
    security_context: ContainerSecurityContext | None = Field(
        None, description="The trainer container's securityContext (a Kubernetes SecurityContext), merged key by key."
    )
    init_containers: list[ContainerOverride] | None = Field(
        None, max_length=16, description="Init containers, run before the trainer."
    )
    sidecars: list[ContainerOverride] | None = Field(
        None, max_length=16, description="Containers running next to the trainer."
    )
    topology_spread_constraints: list[dict[str, Any]] | None = Field(
        None, max_length=16, description="Kubernetes TopologySpreadConstraints of the pods."
    )
    scheduling_gates: list[SchedulingGate] | None = Field(
        None, max_length=16, description="Pods wait unscheduled until these gates are removed."
    )


class JobPodTemplate(PodTemplate):
    """Additions to every pod of the job (or to the controller's). No serviceAccountName:
    these pods run as spec.serviceAccountName, whose Role lets the driver report progress."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        *PodTemplate.cel_rules,
        CelRule(
            "!has(self.serviceAccountName)",
            "set spec.serviceAccountName for the whole job (the driver's progress Role is bound to it)",
            ".serviceAccountName",
        ),
    )
