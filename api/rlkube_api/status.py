"""The RLJob's status, as the operator's status function computes it and the driver reports
progress into it."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from rlkube_api.base import ApiModel
from rlkube_api.runtime_ref import RuntimeSnapshot

ConditionType = Literal[
    "Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "Unschedulable", "Initialized"
]
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
    layout: str | None = Field(
        None,
        description="How the role's ranks divide its model, e.g. tp2×pp2×dp2 (tensor, pipeline (v: virtual "
        "stages), Ulysses sequence and data parallel; factors of 1 but dp left out). For the rollout: GPUs per "
        "engine (tp) and engines (dp).",
    )


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
    runtime: RuntimeSnapshot | None = Field(
        None, description="The runtime (spec.runtimeRef) as first resolved; the job keeps using this copy."
    )
