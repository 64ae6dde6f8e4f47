"""The off-policy buffer: generated groups tagged with the weight version that produced them,
handed to the update only within verl 0.9.1's staleness bound (`trainer.v1.sampler`).

Versions count weight updates: version v is the policy after v updates. A group generated with
version v and trained when the actor is at version c has verl's span `c - v + 1` (1 is
on-policy; verl's `global_steps - prompt_global_steps + 1`) and staleness `c - v` (verl's
`training/off_policy/trajectory_staleness`). The bound: no group is trained with a span above
`max_off_policy_threshold`.

- `drop`: finished groups whose span exceeds the threshold are discarded and counted
  (verl's ReplayBufferAsync._stale_terminal_keys and its `training/off_policy/evicted_samples*`).
- `wait` (dropless): a batch is refused while a group still outstanding after it would exceed
  the threshold at the next version (verl blocks sampling while an in-flight prompt has reached
  the threshold, so it finishes and is trained instead of dropped). Because the version only
  advances by taking a batch, every outstanding group stays within the bound.

Pure bookkeeping: no threads, no clocks; the schedule decides when to call it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

T = TypeVar("T")
Strategy = Literal["drop", "wait"]
STRATEGIES: tuple[Strategy, ...] = ("drop", "wait")


def span_of(version: int, current_version: int) -> int:
    """How many weight versions a group spans when trained now (verl's trajectory span)."""
    return current_version - version + 1


@dataclass(frozen=True)
class Tagged(Generic[T]):
    item: T
    version: int  # the weight version the rollout held when it generated this group


@dataclass
class Taken(Generic[T]):
    """A training batch and what the buffer did to hand it out."""

    groups: list[Tagged[T]]
    dropped: list[Tagged[T]] = field(default_factory=list)

    def metrics(self, current_version: int) -> dict[str, float]:
        """verl 0.9.1's `training/off_policy/*` names for this batch (trainer_base and replay_buffer)."""
        out: dict[str, float] = {}
        if self.groups:
            # Each group as one trajectory of one version; with partial rollouts the caller has
            # the versions of every token and reports `trajectory_metrics` of its samples instead.
            versions = [g.version for g in self.groups]
            out |= trajectory_metrics(current_version, versions, versions)
        out["training/off_policy/evicted_samples"] = float(len(self.dropped))
        if self.dropped:
            spans = [span_of(g.version, current_version) for g in self.dropped]
            out |= _summary("training/off_policy/evicted_samples_staleness", spans)
        return out


def trajectory_metrics(current_version: int, oldest: list[int], newest: list[int]) -> dict[str, float]:
    """verl 0.9.1's `training/off_policy/trajectory_*` (trainer_base) for trajectories trained at
    the actor's `current_version`, each generated with weights from `oldest` to `newest` (equal
    without partial rollouts): spans `newest - oldest + 1`; staleness `current - newest` (the
    freshest weights used, verl's primary metric) and worst `current - oldest`."""
    if len(oldest) != len(newest) or not oldest:
        raise ValueError(f"one oldest and one newest version per trajectory, got {len(oldest)} and {len(newest)}")
    out: dict[str, float] = {}
    for name, values in (
        ("trajectory_spans", [n - o + 1 for o, n in zip(oldest, newest, strict=True)]),
        ("trajectory_staleness", [current_version - n for n in newest]),
        ("trajectory_staleness_worst", [current_version - o for o in oldest]),
    ):
        out |= _summary(f"training/off_policy/{name}", values)
    return out


def _summary(prefix: str, values: list[int]) -> dict[str, float]:
    return {
        f"{prefix}/mean": sum(values) / len(values),
        f"{prefix}/max": float(max(values)),
        f"{prefix}/min": float(min(values)),
    }


class OffPolicyBuffer(Generic[T]):
    """Finished groups, oldest first, and the versions of the generations still in flight."""

    def __init__(self, threshold: int | None, strategy: Strategy = "drop") -> None:
        if threshold is not None and threshold < 1:
            raise ValueError(f"max_off_policy_threshold must be at least 1 (or null), got {threshold}")
        if strategy not in STRATEGIES:
            raise ValueError(f"max_off_policy_strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.threshold = threshold
        self.strategy: Strategy = strategy
        self.finished: deque[Tagged[T]] = deque()
        self.in_flight: list[int] = []  # versions of generations started and not yet put
        self.dropped: list[Tagged[T]] = []  # discarded since the last batch handed out

    def __len__(self) -> int:
        return len(self.finished)

    def begin(self, version: int) -> None:
        """A generation with weights `version` started (its groups arrive by `put`)."""
        self.in_flight.append(version)

    def may_begin(self, version: int, earliest_version: int) -> bool:
        """Whether a generation with weights `version`, whose groups can be trained at the
        actor's `earliest_version` at the soonest, would be within the bound there."""
        return not self._too_stale(version, earliest_version)

    def put(self, groups: list[T], version: int) -> None:
        """The groups of a generation begun with `version` finished."""
        if version in self.in_flight:
            self.in_flight.remove(version)
        self.finished.extend(Tagged(g, version) for g in groups)

    def ready(self, n: int, current_version: int) -> bool:
        """Whether `take(n, current_version)` would hand out a batch."""
        if self.strategy == "drop" or self.threshold is None:
            fresh = sum(1 for g in self.finished if not self._too_stale(g.version, current_version))
            return fresh >= n
        if len(self.finished) < n:
            return False
        order = self._oldest_first()
        if any(self._too_stale(g.version, current_version) for g in order[:n]):
            return False  # only a producer that began too late could cause this; never hand it out
        # wait: after this batch the version advances; nothing left behind may then exceed the bound.
        left = [g.version for g in order[n:]] + self.in_flight
        return all(not self._too_stale(v, current_version + 1) for v in left)

    def take(self, n: int, current_version: int) -> Taken[T] | None:
        """The oldest `n` groups within the bound for an update of the actor at
        `current_version`, or None when the strategy says not yet (the caller waits for more)."""
        if self.strategy == "drop" and self.threshold is not None:
            kept = [g for g in self.finished if not self._too_stale(g.version, current_version)]
            dropped = [g for g in self.finished if self._too_stale(g.version, current_version)]
            self.finished = deque(kept)
            # Drops are final; they are reported with the batch eventually handed out.
            self.dropped.extend(dropped)
        if not self.ready(n, current_version):
            return None
        order = self._oldest_first()
        groups, self.finished = order[:n], deque(order[n:])
        dropped, self.dropped = self.dropped, []
        assert all(not self._too_stale(g.version, current_version) for g in groups), "staleness bound broken"
        return Taken(groups, dropped)

    def _oldest_first(self) -> list[Tagged[T]]:
        # Stable: within a version, arrival order (generations can finish out of order).
        return sorted(self.finished, key=lambda g: g.version)

    def _too_stale(self, version: int, current_version: int) -> bool:
        return self.threshold is not None and span_of(version, current_version) > self.threshold
