"""What a failed pod means for its job, as Kubernetes Jobs' podFailurePolicy decides it:
the user's rules first (spec.runPolicy.podFailurePolicy), then rlkube's defaults, and a
failure that no rule matches counts against backoffLimit. Pure.

The defaults:
- a permanent trainer exit code (`exit_codes.EXIT_CLASSES`: configuration, data, tracker
  missing, checkpoint, out of memory, generation budget; any role): the job fails at once
  with the class's reason; running it again cannot help;
- a pod with the DisruptionTarget condition (preempted, evicted, deleted with its node) or
  evicted by its kubelet: the gang restarts without counting it against backoffLimit.
An OOMKilled container counts, with OOMKilled as the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rlkube_api.exit_codes import EXIT_CLASSES
from rlkube_api.rljob import (
    PodFailurePolicy,
    PodFailurePolicyOnExitCodes,
    PodFailurePolicyOnPodCondition,
    PodFailurePolicyRule,
)
from rlkube_operator.observed import DISRUPTION_TARGET, PodView


class FailureAction(StrEnum):
    FAIL_JOB = "FailJob"
    IGNORE = "Ignore"
    COUNT = "Count"


# When several pods failed in one pass, the gravest verdict decides.
_GRAVITY = {FailureAction.FAIL_JOB: 0, FailureAction.COUNT: 1, FailureAction.IGNORE: 2}


@dataclass(frozen=True)
class Verdict:
    action: FailureAction
    # The condition's reason: the job's Failed (FailJob) or Restarting condition.
    reason: str
    # Why, for the condition's message.
    why: str


# A failure no rule matched, or one the operator only saw as a replaced pod: counted.
COUNTED = Verdict(FailureAction.COUNT, "PodFailed", "")

DEFAULT_RULES: tuple[tuple[PodFailurePolicyRule, Verdict], ...] = (
    *(
        (
            PodFailurePolicyRule(
                action="FailJob", on_exit_codes=PodFailurePolicyOnExitCodes(operator="In", values=[int(c.code)])
            ),
            Verdict(
                FailureAction.FAIL_JOB,
                c.reason,
                f"exit code {int(c.code)} ({c.code.name}): {c.meaning}; permanent, not restarted",
            ),
        )
        for c in EXIT_CLASSES
        if c.permanent
    ),
    (
        PodFailurePolicyRule(
            action="Ignore", on_pod_conditions=[PodFailurePolicyOnPodCondition(type=DISRUPTION_TARGET)]
        ),
        Verdict(
            FailureAction.IGNORE,
            "PodDisrupted",
            "the pod was disrupted (preempted, evicted or its node lost); not counted against backoffLimit",
        ),
    ),
)


def matches(rule: PodFailurePolicyRule, pod: PodView) -> bool:
    if rule.on_exit_codes is not None:
        if pod.terminated is None or pod.terminated[0] == 0:
            return False
        inside = pod.terminated[0] in rule.on_exit_codes.values
        return inside if rule.on_exit_codes.operator == "In" else not inside
    return any((c.type, c.status) in pod.conditions for c in rule.on_pod_conditions or [])


def classify(pod: PodView, policy: PodFailurePolicy | None) -> Verdict:
    """The first rule that matches `pod` (the user's, then the defaults); else Count."""
    for index, rule in enumerate(policy.rules if policy is not None else []):
        if matches(rule, pod):
            action = FailureAction(rule.action)
            counted = {FailureAction.IGNORE: "not counted against backoffLimit", FailureAction.COUNT: "counted"}
            why = f"spec.runPolicy.podFailurePolicy.rules[{index}] ({rule.action}) matched"
            if action in counted:
                why += f"; {counted[action]}"
            return Verdict(action, "PodFailurePolicy", why)
    for rule, verdict in DEFAULT_RULES:
        if matches(rule, pod):
            return verdict
    if pod.terminated is not None and pod.terminated[1] == "OOMKilled":
        return Verdict(FailureAction.COUNT, "OOMKilled", "the container ran out of memory (OOMKilled)")
    return COUNTED


def gravest(verdicts: list[tuple[PodView, Verdict]]) -> tuple[PodView, Verdict]:
    """The pod whose verdict decides the pass: FailJob over Count over Ignore, first seen first."""
    return min(verdicts, key=lambda pv: _GRAVITY[pv[1].action])
