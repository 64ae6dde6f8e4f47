"""When the status is written: a transition at once, counts and messages at most every
COUNTS_WRITE_INTERVAL, so that a gang whose pods turn ready one after another costs one write."""

from __future__ import annotations

from rlkube_api.rljob import RLJobStatus, RoleStatus

# A status change that is only counts and messages (not a transition) waits at most this
# long after the job's previous status write, collecting what happens meanwhile.
COUNTS_WRITE_INTERVAL = 1.0


def is_transition(prev: RLJobStatus, new: RLJobStatus) -> bool:
    """Whether `new` differs from `prev` in more than role counts and condition messages: a
    state, a condition's status or reason, the restart count, the driver's progress, times,
    a role's wanted replicas.
    Those are written at once; counts and messages alone may wait a moment, so that a gang
    whose pods turn ready one after another costs one status write, not one per pod."""

    def essentials(status: RLJobStatus) -> RLJobStatus:
        conditions = [c.model_copy(update={"message": "", "last_transition_time": ""}) for c in status.conditions]
        # The wanted replicas are kept: a rollout scaling is written at once (its Event is told once).
        wanted = {name: RoleStatus(replicas=role.replicas, layout=role.layout) for name, role in status.roles.items()}
        return status.model_copy(update={"roles": wanted, "conditions": conditions})

    return essentials(prev) != essentials(new)


def status_write_delay(prev: RLJobStatus, new: RLJobStatus, since_last_write: float, interval: float) -> float | None:
    """When to write `new` over `prev`: None (nothing changed), 0 (now: a transition, or the
    job's last write is `interval` seconds old), or the seconds left until then."""
    if new == prev:
        return None
    if is_transition(prev, new) or since_last_write >= interval:
        return 0.0
    return interval - since_last_write
