"""The RLJob custom resource (rlkube.dev/v1alpha1): the trainer's configuration
plus what Kubernetes needs (image, pools, run policy), and the status the
operator reports.

The run policy (run_policy.py) and the status (status.py) have modules of their own;
their models are re-exported here, as the RLJob's parts.
"""

from __future__ import annotations

import json
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.config import CheckpointConfig, TrainerConfig
from rlkube_api.fetch_source import FETCH_PATH_RULES, DataSpec, FetchSource, ModelSpec
from rlkube_api.fit.model import FitSpec
from rlkube_api.kube_syntax import ENV_NAME_PATTERN, IMAGE, LONG_NAME, SHORT_NAME
from rlkube_api.pod_template import (
    OPERATOR_MOUNT_PATHS,
    OPERATOR_VOLUMES,
    RESERVED_ENV,
    JobPodTemplate,
    LocalObjectReference,
)
from rlkube_api.roles import Pool, Resources
from rlkube_api.run_policy import (
    GangPolicy,
    PodFailurePolicy,
    PodFailurePolicyOnExitCodes,
    PodFailurePolicyOnPodCondition,
    PodFailurePolicyRule,
    RunPolicy,
)
from rlkube_api.runtime_ref import RuntimeRef
from rlkube_api.status import Condition, ConditionType, JobState, Progress, RLJobStatus, RoleStatus
from rlkube_api.volumes import VolumeSource

__all__ = [
    "API_VERSION",
    "CONTROLLER_CPU",
    "CONTROLLER_MEMORY",
    "GROUP",
    "KIND",
    "MAX_NAME_LENGTH",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "CheckpointSpec",
    "Condition",
    "ConditionType",
    "ControllerResources",
    "ControllerSpec",
    "EnvVar",
    "GangPolicy",
    "JobState",
    "NetworkPolicySpec",
    "ObjectMeta",
    "PodFailurePolicy",
    "PodFailurePolicyOnExitCodes",
    "PodFailurePolicyOnPodCondition",
    "PodFailurePolicyRule",
    "PodVolume",
    "Progress",
    "RLJob",
    "RLJobSpec",
    "RLJobStatus",
    "RoleStatus",
    "RunPolicy",
]

GROUP = "rlkube.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"
PLURAL = "rljobs"
SINGULAR = "rljob"
SHORT_NAMES = ("rlj",)

# Child names are "<job>-<role>" (StatefulSets, headless Services) and the
# StatefulSet controller labels pods with "<statefulset>-<10-char hash>", which
# must fit a 63-character label value: 63 - 11 - len("-controller") = 41.
MAX_NAME_LENGTH = 41


class EnvVar(ApiModel):
    """An environment variable set in every trainer container (overrides rlkube's NCCL defaults)."""

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str = Field("", max_length=32768, description="Value.")


class PodVolume(ApiModel):
    """A volume mounted in every trainer pod: models, datasets, caches."""

    cel_rules = (
        CelRule(
            "!(self.name in " + json.dumps(list(OPERATOR_VOLUMES)) + ")",
            "name is used by the operator: " + ", ".join(OPERATOR_VOLUMES),
            ".name",
        ),
    )

    name: Annotated[str, SHORT_NAME] = Field(min_length=1, max_length=63, description="Volume name (DNS label).")
    mount_path: str = Field(min_length=1, max_length=4096, pattern=r"^/", description="Absolute path in containers.")
    read_only: bool = Field(False, description="Mount read-only.")
    source: VolumeSource = Field(
        description="A Kubernetes volume source, e.g. {persistentVolumeClaim: {claimName: models}} or "
        "{hostPath: {path: /data}}.",
    )


class NetworkPolicySpec(ApiModel):
    """A NetworkPolicy around the job's pods (on by default): only the job's own pods reach
    them, and the monitoring namespace only the driver's metrics port. The operator needs no
    way in: it reaches the pods only through the API server."""

    # The operator applies its children and never prunes one the spec stops asking for.
    cel_rules = (CelRule("self.enabled == oldSelf.enabled", "enabled is immutable", ".enabled", transition=True),)

    enabled: bool = Field(
        True,
        description="Create the NetworkPolicy (enforced only by a network plugin that enforces them). "
        "false leaves the job's unauthenticated ports open to every pod the cluster's own policies let through.",
    )
    metrics_namespace: Annotated[str, SHORT_NAME] = Field(
        "monitoring", max_length=63, description="Namespace whose pods (Prometheus) may scrape the driver's metrics."
    )


# The controller pod's defaults (spec.controller.resources replaces each one it sets).
CONTROLLER_CPU = "1"
CONTROLLER_MEMORY = "4Gi"


class ControllerResources(Resources):
    """The controller pod's CPU and memory, with defaults: a pod without requests is the first one
    evicted when its node runs short. The driver holds the Ray head (its object store lives in
    /dev/shm, which counts against the memory limit), the dataset and one step's batch."""

    cpu: str | None = Field(CONTROLLER_CPU, max_length=32, description="CPU request, e.g. '8' or '500m'.")
    memory: str | None = Field(CONTROLLER_MEMORY, max_length=32, description="Memory request and limit, e.g. '64Gi'.")


class ControllerSpec(ApiModel):
    """The CPU pod running the driver (Ray head, data loader, PPO loop)."""

    resources: ControllerResources = Field(
        default_factory=ControllerResources,
        description=f"CPU and memory of the controller pod (default {CONTROLLER_CPU} CPU, {CONTROLLER_MEMORY}).",
    )
    pool: Pool | None = Field(None, description="Where the controller pod goes.")
    pod_template: JobPodTemplate | None = Field(None, description="Additions to the controller pod.")


class CheckpointSpec(CheckpointConfig):
    """Checkpoint settings plus the volume they live on, or the Secret of their object store."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        *CheckpointConfig.cel_rules,
        CelRule(
            "!has(self.credentialsSecret) || has(self.uri)",
            "credentialsSecret needs checkpoint.uri (it holds the object store's credentials)",
            ".credentialsSecret",
        ),
    )

    volume: VolumeSource | None = Field(
        None,
        description="A Kubernetes volume source (e.g. persistentVolumeClaim) mounted at dir in every pod.",
    )
    credentials_secret: Annotated[str, LONG_NAME] | None = Field(
        None,
        max_length=253,
        description="A Secret in the job's namespace whose keys become environment variables of the pods "
        "that write or read checkpoints (the controller, actor and critic pods): the object store's "
        "credentials as its fsspec backend reads them, e.g. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
        "for s3://. Needs uri.",
    )


def _absolute(required: str, optional: str = "") -> CelRule:
    """In pods, a relative path resolves against the image's working directory, which holds no
    model, data or checkpoint: the trainer would fail at start. The path is `required.optional`;
    the API server's has() tests only the last step, so each optional step gets its own."""
    steps = optional.split(".") if optional else []
    path = ".".join([required, *steps])
    guards = [f"!has(self.{'.'.join([required, *steps[: i + 1]])})" for i in range(len(steps))]
    return CelRule(
        " || ".join([*guards, f"self.{path}.startsWith('/')"]),
        f"{path} must be an absolute path in the pods (on a volume from spec.volumes)",
        f".{path}",
    )


_PATH_RULES = (
    *FETCH_PATH_RULES,
    _absolute("model.path"),
    _absolute("model", "tokenizerPath"),
    CelRule(
        "self.data.trainFiles.all(f, f.startsWith('/'))",
        "data.trainFiles must be absolute paths in the pods (on a volume from spec.volumes)",
        ".data.trainFiles",
    ),
    CelRule(
        "!has(self.data.valFiles) || self.data.valFiles.all(f, f.startsWith('/'))",
        "data.valFiles must be absolute paths in the pods (on a volume from spec.volumes)",
        ".data.valFiles",
    ),
    _absolute("critic", "modelPath"),
    _absolute("reward", "function.path"),
    _absolute("reward", "model.path"),
    *(
        CelRule(
            "!has(self.rollout) || !has(self.rollout.multiTurn) || has(self.rollout.multiTurn.configMap) "
            f"|| !has(self.rollout.multiTurn.{field}) "
            f"|| self.rollout.multiTurn.{field}.startsWith('/')",
            f"rollout.multiTurn.{field} must be an absolute path in the pods, or a key of rollout.multiTurn.configMap",
            f".rollout.multiTurn.{field}",
        )
        for field in ("toolConfigPath", "functionToolPath", "interactionConfigPath")
    ),
    CelRule(
        "!has(self.checkpoint.volume) || self.checkpoint.dir.startsWith('/')",
        "checkpoint.dir must be an absolute path when checkpoint.volume is set (the volume is mounted there)",
        ".checkpoint.dir",
    ),
    # Every job's checkpoint is written by more than one pod: the driver writes its state and the
    # manifest in the controller pod, each actor (and critic) rank its shards in its own pod.
    # In a container's own filesystem each would see only its own part, and a gang restart would
    # find no complete checkpoint: the job would start over without saying why.
    CelRule(
        "has(self.checkpoint.uri) || has(self.checkpoint.volume) || (has(self.volumes) && self.volumes.exists(v,"
        " !(has(v.readOnly) && v.readOnly) && (self.checkpoint.dir == v.mountPath"
        " || self.checkpoint.dir.startsWith(v.mountPath.endsWith('/') ? v.mountPath : v.mountPath + '/'))))",
        "checkpoint.dir must be on storage every pod shares (the controller pod and each actor and critic pod write"
        " parts of every checkpoint; in a container's own filesystem a restart finds none): set checkpoint.volume"
        " (e.g. a ReadWriteMany persistentVolumeClaim), put checkpoint.dir under a writable mountPath of spec.volumes, or"
        " set checkpoint.uri (object storage)",
        ".checkpoint.dir",
    ),
    CelRule(
        "!has(self.volumes) || self.volumes.all(v, !(v.mountPath in " + json.dumps(list(OPERATOR_MOUNT_PATHS)) + ")"
        " && !(has(self.checkpoint.volume) && v.mountPath == self.checkpoint.dir))",
        "volume mountPaths may not be a path the operator mounts: "
        + ", ".join(OPERATOR_MOUNT_PATHS)
        + ", or checkpoint.dir when checkpoint.volume is set",
        ".volumes",
    ),
    CelRule(
        "!has(self.checkpoint.volume) || !(self.checkpoint.dir in " + json.dumps(list(OPERATOR_MOUNT_PATHS)) + ")",
        "checkpoint.dir may not be a path the operator mounts: " + ", ".join(OPERATOR_MOUNT_PATHS),
        ".checkpoint.dir",
    ),
)


def _mounts_name_volumes(template: str, guards: tuple[str, ...]) -> CelRule:
    """A pod-template mount must name a volume the pod has, as the core API requires ("Not
    found" when the StatefulSet is created): the template's own, the job template's (every
    pod gets those), spec.volumes' or the operator's. `guards` are the optional steps to
    the template (the API server's has() tests only the last step)."""
    mounts = f"self.{template}.volumeMounts"
    named = (
        f"m.name in {json.dumps(list(OPERATOR_VOLUMES))}",
        f"(has(self.{template}.volumes) && self.{template}.volumes.exists(v, v.name == m.name))",
        "(has(self.podTemplate) && has(self.podTemplate.volumes) && self.podTemplate.volumes.exists(v, v.name == m.name))",
        "(has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
    )
    checks = [f"!has(self.{step})" for step in (*guards, template, f"{template}.volumeMounts")]
    return CelRule(
        " || ".join([*checks, f"{mounts}.all(m, {' || '.join(named)})"]),
        "each volumeMount must name a volume of the pod: one of this template's volumes, spec.podTemplate.volumes, "
        "spec.volumes or " + ", ".join(OPERATOR_VOLUMES),
        f".{template}.volumeMounts",
    )


_ROLES_WITH_PODS = ("actor", "critic", "reference", "reward", "rollout")
_MOUNT_RULES = (
    _mounts_name_volumes("podTemplate", ()),
    _mounts_name_volumes("controller.podTemplate", ("controller",)),
    *(_mounts_name_volumes(f"roles.{role}.podTemplate", (f"roles.{role}",)) for role in _ROLES_WITH_PODS),
)


def _unless_runtime(rule: CelRule) -> CelRule:
    """A rule that a runtime's template may be what satisfies (its volumes, image): the API
    server skips it for a job with a runtimeRef, whose merged spec the operator checks with
    the rule itself (runtime_merge.resolve) before any child is made."""
    return CelRule(f"has(self.runtimeRef) || ({rule.rule})", rule.message, rule.field_path, rule.reason)


# spec.roles.rollout.replicas in CEL, its default where unset.
_ROLLOUT_REPLICAS = "(has({s}.roles.rollout) && has({s}.roles.rollout.replicas) ? {s}.roles.rollout.replicas : 1)"


class RLJobSpec(TrainerConfig):
    """What to train (the trainer's sections) and how to run it on Kubernetes."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        *TrainerConfig.cel_rules,
        CelRule(
            "!has(self.env) || self.env.all(e, !(e.name in " + json.dumps(list(RESERVED_ENV)) + "))",
            "env may not set a variable the operator manages: " + ", ".join(RESERVED_ENV),
            ".env",
        ),
        CelRule(
            "!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
            "volume names must be unique",
            ".volumes",
        ),
        CelRule(
            "!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.mountPath == v.mountPath))",
            "volume mountPaths must be unique",
            ".volumes",
        ),
        CelRule(
            "has(self.image) || has(self.runtimeRef)",
            "image is required (or a runtimeRef whose runtime sets it)",
            ".image",
        ),
        *(_unless_runtime(rule) if "self.volumes" in rule.rule else rule for rule in _PATH_RULES),
        *(_unless_runtime(rule) for rule in _MOUNT_RULES),
        # Kueue admits a plain-pod group of a fixed size (its pod-group-total-count): a gang
        # cannot grow or shrink in place under it.
        CelRule(
            "!has(self.runPolicy) || !has(self.runPolicy.gang) || self.runPolicy.gang.scheduler != 'kueue' || "
            + _ROLLOUT_REPLICAS.format(s="self")
            + " == "
            + _ROLLOUT_REPLICAS.format(s="oldSelf"),
            "roles.rollout.replicas cannot change while the job runs under runPolicy.gang.scheduler kueue (Kueue "
            "admits a pod group of a fixed size); suspend the job, change it, then resume",
            ".roles.rollout.replicas",
            transition=True,
        ),
    )

    runtime_ref: RuntimeRef | None = Field(
        None,
        description="The RLJobRuntime or ClusterRLJobRuntime this job is written against: its template gives "
        "what the job leaves out (image, pools, pod templates, volumes, run policy); see runtime_merge.",
    )
    model: ModelSpec = Field(description="The policy model.")
    data: DataSpec = Field(description="Training data.")
    image: Annotated[str, IMAGE] | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="Trainer image for every role (required unless the runtime sets it).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy."
    )
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        None, max_length=16, description="Secrets for pulling the image."
    )
    service_account_name: Annotated[str, LONG_NAME] | None = Field(
        None, max_length=253, description="Pods' ServiceAccount."
    )
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpoints.")
    env: list[EnvVar] | None = Field(None, max_length=128, description="Extra environment of every container.")
    volumes: list[PodVolume] | None = Field(
        None, max_length=32, description="Volumes mounted in every trainer pod (where model.path and data live)."
    )
    controller: ControllerSpec = Field(default_factory=ControllerSpec, description="The driver pod.")
    pod_template: JobPodTemplate | None = Field(
        None, description="Additions to every pod of the job (labels, env from Secrets, sidecars, ...)."
    )
    suspend: bool = Field(
        False,
        description="Delete the pods and keep the job; false brings them back. Set by users only: Kueue admits the pods.",
    )
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec, description="Isolate the job's pods with a NetworkPolicy (off by default)."
    )
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Restarts, deadlines, cleanup, gang.")
    fit: FitSpec | None = Field(
        None,
        description="The model's dimensions and the GPU memory for the memory estimate per rank: a job that "
        "cannot fit is held before any pod is created (kubectl rlkube plan shows the estimate).",
    )

    def trainer_config(self) -> TrainerConfig:
        """The trainer's sections of this spec, without what only Kubernetes reads."""
        fields = TrainerConfig.model_fields
        data = {k: v for k, v in self.to_config().items() if k in fields}
        data["checkpoint"].pop("volume", None)
        data["checkpoint"].pop("credentials_secret", None)
        # Where model and data are fetched from: the operator's fetch reads it, the trainer reads path and files.
        for key in FetchSource.model_fields:
            data["model"].pop(key, None)
            data["data"].pop(key, None)
        data["data"].pop("dir", None)
        return TrainerConfig.model_validate(data)


class ObjectMeta(ApiModel):
    """The subset of metadata the models read; the rest passes through."""

    model_config = ConfigDict(**{**ApiModel.model_config, "extra": "allow"})

    name: str | None = Field(None, description="Job name.")
    namespace: str | None = Field(None, description="Namespace.")
    uid: str | None = Field(None, description="Set by the API server.")
    generation: int | None = Field(None, description="Set by the API server.")
    labels: dict[str, str] | None = Field(None, description="Labels.")
    annotations: dict[str, str] | None = Field(None, description="Annotations.")


class RLJob(ApiModel):
    """An RL post-training job."""

    cel_rules = (
        CelRule(
            f"!has(self.metadata.name) || size(self.metadata.name) <= {MAX_NAME_LENGTH}",
            f"metadata.name must be at most {MAX_NAME_LENGTH} characters (child names add '-<role>')",
        ),
        CelRule(
            "!has(self.metadata.name) || self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            "metadata.name must be a DNS-1035 label (a-z, 0-9, '-', starting with a letter)",
        ),
    )

    api_version: Literal["rlkube.dev/v1alpha1"] = Field("rlkube.dev/v1alpha1", description="rlkube.dev/v1alpha1")
    kind: Literal["RLJob"] = Field("RLJob", description="RLJob")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    spec: RLJobSpec = Field(description="The desired job.")
    status: RLJobStatus | None = Field(None, description="Observed state.")
