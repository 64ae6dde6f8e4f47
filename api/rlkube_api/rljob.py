"""The RLJob custom resource (rlkube.dev/v1alpha1): the trainer's configuration
plus what Kubernetes needs (image, pools, run policy), and the status the
operator reports.
"""

from __future__ import annotations

import json
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.config import CheckpointConfig, TrainerConfig
from rlkube_api.kube_syntax import ENV_NAME_PATTERN, IMAGE, LONG_NAME, SHORT_NAME
from rlkube_api.pod_template import (
    OPERATOR_MOUNT_PATHS,
    OPERATOR_VOLUMES,
    RESERVED_ENV,
    JobPodTemplate,
    LocalObjectReference,
)
from rlkube_api.roles import Pool, Resources
from rlkube_api.volumes import VolumeSource

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


class GangPolicy(ApiModel):
    """Gang scheduling: all pods of the job start together or not at all."""

    scheduler: Literal["volcano", "coscheduling", "kueue"] = Field(
        description="volcano (PodGroup), coscheduling (scheduler-plugins PodGroup) or kueue (every pod of an attempt "
        "joins one Kueue pod group, so Kueue's pod integration admits the whole gang or none of it; the pods wait "
        "behind Kueue's admission gate meanwhile, with no pending timeout)."
    )
    # Kueue reads the queue from a label on the pods, so there it is a label value too.
    cel_rules = (
        CelRule(
            "self.scheduler != 'kueue' || !has(self.queue) || size(self.queue) <= 63",
            "queue must be at most 63 characters with kueue (it becomes the label kueue.x-k8s.io/queue-name)",
            ".queue",
        ),
    )

    queue: Annotated[str, LONG_NAME] | None = Field(
        None,
        max_length=253,
        description="Volcano queue, or Kueue LocalQueue (the pods' kueue.x-k8s.io/queue-name label; without it, "
        "the namespace's default LocalQueue, if any).",
    )
    priority_class_name: Annotated[str, LONG_NAME] | None = Field(
        None, max_length=253, description="PriorityClass of the gang."
    )
    scheduler_name: Annotated[str, LONG_NAME] | None = Field(
        None, max_length=253, description="Pods' schedulerName (default: volcano, scheduler-plugins-scheduler)."
    )
    schedule_timeout_seconds: int = Field(
        600, ge=1, description="How long the gang may wait for all its pods to be placed."
    )


class PodFailurePolicyOnExitCodes(ApiModel):
    """Matches a failed container by its exit code (as Kubernetes Jobs' onExitCodes)."""

    cel_rules = (
        CelRule(
            "self.operator != 'In' || !self.values.exists(v, v == 0)",
            "values must not contain 0 with operator In (exit code 0 is not a failure)",
            ".values",
        ),
    )

    operator: Literal["In", "NotIn"] = Field(description="In: the exit code is one of values; NotIn: it is none.")
    values: list[Annotated[int, Field(ge=0, le=255)]] = Field(
        min_length=1, max_length=255, description="Exit codes (0-255)."
    )


class PodFailurePolicyOnPodCondition(ApiModel):
    """Matches a failed pod by a condition it carries, e.g. DisruptionTarget (preempted, evicted,
    its node gone)."""

    type: str = Field(
        min_length=1,
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Pod condition type, e.g. DisruptionTarget.",
    )
    status: Literal["True", "False", "Unknown"] = Field("True", description="Condition status to match.")


class PodFailurePolicyRule(ApiModel):
    """One rule: what a matching pod failure does to the job."""

    cel_rules = (
        CelRule(
            "has(self.onExitCodes) != has(self.onPodConditions)",
            "exactly one of onExitCodes and onPodConditions must be set",
        ),
    )

    action: Literal["FailJob", "Ignore", "Count"] = Field(
        description="FailJob: Failed at once, no restart; Ignore: restart the gang without counting it against "
        "backoffLimit; Count: restart the gang, counted (the default for failures no rule matches)."
    )
    on_exit_codes: PodFailurePolicyOnExitCodes | None = Field(None, description="Match by the exit code.")
    on_pod_conditions: list[PodFailurePolicyOnPodCondition] | None = Field(
        None, min_length=1, max_length=20, description="Match by a pod condition (any of these)."
    )


class PodFailurePolicy(ApiModel):
    """Rules for pod failures, as Kubernetes Jobs' podFailurePolicy: the first rule that matches
    decides; after the user's rules come rlkube's defaults (the trainer's configuration error,
    exit code 78: FailJob; a DisruptionTarget condition: Ignore); anything else counts."""

    rules: list[PodFailurePolicyRule] = Field(max_length=20, description="Tried in order; the first match decides.")


class RunPolicy(ApiModel):
    """Restarts, deadlines and cleanup, with the field names of Kubernetes Jobs."""

    backoff_limit: int = Field(3, ge=0, le=1000, description="Gang restarts before the job is Failed.")
    active_deadline_seconds: int | None = Field(
        None, ge=1, description="Seconds from start after which the job is Failed (DeadlineExceeded)."
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Seconds after Succeeded/Failed before children are deleted."
    )
    pending_timeout_seconds: int = Field(
        300,
        ge=1,
        description="How long a job waits for its pods to start: then a ConfigMap, Secret or claim they name still "
        "missing, pods that cannot be created (a missing ServiceAccount, a quota), a bad image or a volume that "
        "cannot be mounted fails it; no node that fits sets Unschedulable.",
    )
    termination_grace_period_seconds: int = Field(
        120,
        ge=0,
        le=86400,
        description="Seconds every pod gets between SIGTERM and SIGKILL (its terminationGracePeriodSeconds; "
        "the operator gives a restarted gang's running pods as much): the trainer finishes the step in "
        "progress and saves a checkpoint of it in that time. Longer than a step plus a save, or the step "
        "is lost (the previous checkpoint stays).",
    )
    gang: GangPolicy | None = Field(None, description="Gang scheduling (none by default).")
    pod_failure_policy: PodFailurePolicy | None = Field(
        None, description="How pod failures are treated, by exit code or pod condition (before rlkube's defaults)."
    )


class NetworkPolicySpec(ApiModel):
    """An optional NetworkPolicy around the job's pods: only the job's own pods reach them,
    and the monitoring namespace only the driver's metrics port."""

    # The operator applies its children and never prunes one the spec stops asking for.
    cel_rules = (CelRule("self.enabled == oldSelf.enabled", "enabled is immutable", ".enabled", transition=True),)

    enabled: bool = Field(False, description="Create the NetworkPolicy (needs a network plugin that enforces them).")
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
        *_PATH_RULES,
        *_MOUNT_RULES,
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

    image: Annotated[str, IMAGE] = Field(
        min_length=1,
        max_length=1024,
        description="Trainer image for every role.",
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

    def trainer_config(self) -> TrainerConfig:
        """The trainer's sections of this spec, without what only Kubernetes reads."""
        fields = TrainerConfig.model_fields
        data = {k: v for k, v in self.to_config().items() if k in fields}
        data["checkpoint"].pop("volume", None)
        data["checkpoint"].pop("credentials_secret", None)
        return TrainerConfig.model_validate(data)


# --- status -------------------------------------------------------------------------------------

ConditionType = Literal["Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "Unschedulable"]
JobState = Literal["Pending", "Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]


class Condition(ApiModel):
    """A metav1.Condition."""

    type: str = Field(description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="The spec generation this was set from.")


class RoleStatus(ApiModel):
    """Pod counts of one role."""

    replicas: int = Field(0, description="Desired pods.")
    active: int = Field(0, description="Pods not finished.")
    ready: int = Field(0, description="Pods Ready.")
    succeeded: int = Field(0, description="Pods Succeeded.")
    failed: int = Field(0, description="Pods Failed.")


class Progress(ApiModel):
    """Training progress as reported by the driver."""

    step: int = Field(0, description="Last completed step.")
    total_steps: int | None = Field(None, description="Steps in the run.")
    reward_mean: float | None = Field(None, description="Mean score of the last step.")
    tokens_per_second_per_gpu: float | None = Field(
        None, alias="tokensPerSecondPerGPU", description="perf/throughput of the last step."
    )
    last_checkpoint_step: int | None = Field(None, description="Step of the latest complete checkpoint.")
    val_score: float | None = Field(
        None,
        description="Latest validation score: val-core/<dataSource>/<acc or reward>/mean@N, averaged over "
        "data sources.",
    )
    val_step: int | None = Field(None, description="The step the latest validation score was measured at.")
    percent_done: float | None = Field(None, ge=0, le=100, description="step / totalSteps, in percent.")
    estimated_completion_time: str | None = Field(
        None,
        description="When the last step should end (RFC 3339): the steps left at this attempt's mean step "
        "time so far (checkpoints and validation included).",
    )
    time_remaining: str | None = Field(
        None,
        description="The time left when the driver last reported, as kubectl prints durations (3m20s, 2h5m): "
        "from estimatedCompletionTime; absent once the job has ended.",
    )
    rollout_weight_version: int | None = Field(
        None,
        ge=0,
        description="Asynchronous trainer modes: the actor weight version (updates done) the rollout engines "
        "held at the last step; step minus this is how far generation lags the actor.",
    )
    staleness: int | None = Field(
        None,
        ge=0,
        description="Asynchronous trainer modes: the most weight versions any sample of the last step was "
        "behind the actor when trained (training/off_policy/trajectory_staleness/max).",
    )
    updated_at: str | None = Field(None, description="When the driver last reported (RFC 3339).")
    attempt: int | None = Field(
        None,
        ge=0,
        description="The gang attempt (restartCount) whose driver made this report: after a restart the job "
        "stays Restarting until the new gang's first report.",
    )

    # `kubectl get` prints numbers as stored; these are for reading (the exact values are
    # in the driver's metrics), so they are stored rounded. Digits after the point:
    _DISPLAY_DIGITS: ClassVar[dict[str, int]] = {
        "reward_mean": 4,
        "val_score": 4,
        "tokens_per_second_per_gpu": 1,
        "percent_done": 1,
    }

    @field_validator("reward_mean", "val_score", "tokens_per_second_per_gpu", "percent_done")
    @classmethod
    def _round_for_display(cls, value: float | None, info: ValidationInfo) -> float | None:
        return None if value is None else round(value, cls._DISPLAY_DIGITS[str(info.field_name)])


class RLJobStatus(ApiModel):
    """Observed state, computed by the operator's status function."""

    state: JobState | None = Field(None, description="Summary of the conditions.")
    conditions: list[Condition] = Field(default_factory=list, description="Created, Running, ... conditions.")
    roles: dict[str, RoleStatus] = Field(default_factory=dict, description="Pods per role.")
    progress: Progress | None = Field(None, description="Reported by the trainer's driver.")
    restart_count: int = Field(0, description="Gang restarts so far (the current attempt).")
    uncounted_restarts: int | None = Field(
        None,
        description="Of those, restarts that did not count against backoffLimit (preemption, eviction, node "
        "loss, Ignore rules).",
    )
    start_time: str | None = Field(None, description="When the job first ran.")
    completion_time: str | None = Field(None, description="When the job finished.")
    observed_generation: int | None = Field(None, description="The spec generation last reconciled.")
    gang_pod_uids: list[str] | None = Field(
        None,
        max_length=4096,
        description="UIDs of the pods of the running gang: a pod not among them replaced one that died.",
    )
    gang_rollout_replicas: int | None = Field(
        None,
        ge=0,
        description="Rollout pods the running gang had (ordinals below it), for a rollout that scales in place: "
        "a rollout pod not in gangPodUids at an ordinal below it replaced one that died; at or past it, a "
        "scale-up added it.",
    )


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
