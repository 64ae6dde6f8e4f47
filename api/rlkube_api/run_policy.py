"""spec.runPolicy: restarts, deadlines, cleanup, gang scheduling and the pod failure policy, with
the field names of Kubernetes Jobs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.kube_syntax import LONG_NAME


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
