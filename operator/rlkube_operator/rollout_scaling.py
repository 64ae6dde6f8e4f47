"""Elastic rollout capacity: separate rollout pods scale while the job runs.

Patching `spec.roles.rollout.replicas` changes only the rollout StatefulSet's replicas (and a
PodGroup's minMember); the attempt, the other roles' pods and `restartCount` stay. The
StatefulSet adds or removes the highest ordinals; the driver finds the new engines among its
Ray nodes and stops using the removed ones (trainer/rlkube_trainer/cluster/elastic_rollout.py).

What the status function needs to tell a scaling from a failure, as pure functions:
- a rollout pod at or past the wanted replicas was removed on purpose: its end (a SIGTERM's
  exit code, a Failed phase) is no failure of the gang;
- a rollout pod that was not in the gang when it last ran is a new engine if the gang never had
  its ordinal (`new_engine`); at an ordinal the gang had, its StatefulSet replaced one that died
  (maybe while no operator watched), and the gang restarts as for any other role; the ordinals
  the gang has are counted up to the first gap, since a scale-up's pods come in no order
  (`gang_rollout_replicas`);
- while new rollout pods start, the job stays Running (the gang trains meanwhile).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlkube_api.rljob import RLJob, RLJobStatus, RoleStatus
from rlkube_operator.observed import PodView
from rlkube_operator.plan import Event

ROLLOUT = "rollout"
ROLLOUT_SCALED = "RolloutScaled"


def _elastic(placement: str, tensor_parallel_size: int) -> bool:
    return placement == "separate" and tensor_parallel_size == 1


def elastic_rollout(job: RLJob) -> bool:
    """Whether the job's rollout scales in place (the API refuses a change otherwise): separate
    rollout pods whose engines are one process each."""
    rollout = job.spec.roles.rollout
    return _elastic(rollout.placement, rollout.tensor_parallel_size)


def scaled_away(job: RLJob, pod: PodView) -> bool:
    """A rollout pod the spec no longer asks for: the StatefulSet removes it on purpose."""
    if pod.role != ROLLOUT or not elastic_rollout(job) or pod.index is None:
        return False
    return pod.index >= job.spec.roles.rollout.replicas


def scaled_away_in_spec(spec: Mapping[str, Any], role: str, index: int | None) -> bool:
    """`scaled_away` from the RLJob's stored spec (camelCase, defaults applied by the API
    server), for the pod watch, which has no parsed job at hand."""
    rollout = (spec.get("roles") or {}).get(ROLLOUT) or {}
    elastic = _elastic(str(rollout.get("placement", "colocated")), int(rollout.get("tensorParallelSize", 1)))
    if role != ROLLOUT or not elastic or index is None:
        return False
    return index >= int(rollout.get("replicas", 1))


def gang_rollout_replicas(job: RLJob, gang: list[PodView], recorded: int | None) -> int | None:
    """What the status records with a running gang's pods (`status.gangRolloutReplicas`): the
    rollout ordinals it has, 0 up to the first one missing, and never fewer than it had on
    record (`recorded`), bounded by the wanted replicas (a pod past them is on its way out).

    Up to the first gap, because a scale-up's pods come in no order (the StatefulSet creates
    them in parallel): with 0 and 2 present, ordinal 1 is still to come as a new engine. Never
    fewer than on record, because a member deleted unseen leaves a gap too: the pod its
    StatefulSet puts there is a replacement. None for a rollout that does not scale in place."""
    if not elastic_rollout(job):
        return None
    present = {pod.index for pod in gang if pod.role == ROLLOUT and pod.index is not None}
    prefix = 0
    while prefix in present:
        prefix += 1
    return min(max(prefix, recorded or 0), job.spec.roles.rollout.replicas)


def new_engine(job: RLJob, prev: RLJobStatus, pod: PodView) -> bool:
    """A rollout pod outside the gang that a scale-up added: its ordinal is one the gang did not
    have. Below that, the StatefulSet recreated a member that died (a replacement, not a new
    engine), whether or not the operator saw it go."""
    if pod.role != ROLLOUT or not elastic_rollout(job) or pod.index is None:
        return False
    known = prev.gang_rollout_replicas
    if known is None:  # a status written before the gang's rollout ordinals were recorded
        before = prev.roles.get(ROLLOUT)
        known = before.replicas if before is not None else job.spec.roles.rollout.replicas
    return pod.index >= known


def rollout_scaled(job: RLJob, prev: RLJobStatus) -> Event | None:
    """The Event for a change of rollout replicas since the last status: the status records the
    wanted replicas (`status.roles.rollout.replicas`), so each change is told once."""
    before = prev.roles.get(ROLLOUT)
    if before is None or prev.state is None or not elastic_rollout(job):
        return None
    wanted = job.spec.roles.rollout.replicas
    if before.replicas == wanted:
        return None
    way = "adds" if wanted > before.replicas else "removes"
    return Event(
        "Normal",
        ROLLOUT_SCALED,
        f"rollout replicas {before.replicas} -> {wanted}: the rollout StatefulSet {way} pods; the gang keeps running",
    )


def rollout_starting(roles: Mapping[str, RoleStatus]) -> bool:
    """Every role but the rollout has its pods ready and the rollout at least one: what is
    missing are rollout pods still starting (a scale-up), which the gang trains without."""
    rollout = roles.get(ROLLOUT)
    if rollout is None or rollout.ready < 1:
        return False
    return all(status.ready >= status.replicas for name, status in roles.items() if name != ROLLOUT)
