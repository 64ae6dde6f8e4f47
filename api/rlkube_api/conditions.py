"""The RLJob's states and condition types as enums, for code that decides or reads them.

Their values are the wire strings of `status.JobState` and `status.ConditionType`; a
member's `.value` has the matching literal type, so it goes straight into the status
model. Plain strings read back from the API server compare equal to the members.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """status.state: a summary of the conditions."""

    PENDING = "Pending"
    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"

    @property
    def terminal(self) -> bool:
        return self in (State.SUCCEEDED, State.FAILED)


class ConditionType(StrEnum):
    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    UNSCHEDULABLE = "Unschedulable"
    INITIALIZED = "Initialized"


def state_of(value: str | None) -> State | None:
    """A status.state as read back (a plain string, or None before the first write)."""
    return None if value is None else State(value)


def is_terminal(state: str | None) -> bool:
    """Whether a job in `state` (as read from its status, or None) has finished."""
    found = state_of(state)
    return found is not None and found.terminal
