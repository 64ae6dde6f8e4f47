"""The driver's handle on a group's ranks: call a method on every rank (or some), with
arguments per rank, and collect the results in rank order. Two implementations of one
interface: `LocalRankGroup` (the ranks are objects in this process: `--in-process`,
tests, benchmarks) and `RayRankGroup` (ray_group.py: a Ray actor per rank, in pods and
`rlkube-trainer run`). Everything above it (dispatch.py, the driver) is the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlkube_api.placement import Role
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.workers.rank import Rank


class RankLost(RuntimeError):
    """A rank of a group died or stopped answering."""

    def __init__(self, group: str, rank: int, cause: str) -> None:
        self.group, self.rank = group, rank
        super().__init__(f"role {group} rank {rank} failed: {cause}")


@dataclass
class Pending:
    """Calls submitted to some ranks of a group; `RankGroup.wait` collects them."""

    ranks: list[int]
    handles: list[Any] = field(default_factory=list)
    # The rank method called, for the error that names a failed call.
    method: str = ""


def split(n: int, k: int) -> list[slice]:
    """n items over k ranks: contiguous slices, the first n % k one longer."""
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    out, start = [], 0
    for size in sizes:
        out.append(slice(start, start + size))
        start += size
    return out


class RankGroup:
    """What both implementations share; they define `size`, `submit` and `wait`."""

    role: Role

    def __len__(self) -> int:
        raise NotImplementedError

    def submit(self, method: str, args: Sequence[tuple[Any, ...]], ranks: Sequence[int] | None = None) -> Pending:
        """Starts `method(*args[i])` on rank `ranks[i]` (default: every rank in order)."""
        raise NotImplementedError

    def wait(self, pending: Pending) -> list[Any]:
        """The results in the order submitted; a failed rank raises."""
        raise NotImplementedError

    def done(self, pending: Pending) -> bool:
        """Whether every call of `pending` has finished (`wait` then returns at once)."""
        raise NotImplementedError

    def only(self, rank: int) -> RankGroup:
        """Rank `rank` alone, as a group of one (an elastic rollout engine)."""
        raise NotImplementedError

    def call_all(self, method: str, *args: Any) -> list[Any]:
        return self.wait(self.submit(method, [args] * len(self)))

    def call(self, rank: int, method: str, *args: Any) -> Any:
        return self.wait(self.submit(method, [args], [rank]))[0]

    def map_batch(self, method: str, batch: TrainBatch) -> list[Any]:
        """Data parallel: rank i gets the i-th contiguous slice of the batch."""
        return self.wait(self.submit(method, [(batch.select(s),) for s in split(len(batch), len(self))]))


class LocalRankGroup(RankGroup):
    """The ranks are objects in this process (one, in practice: two ranks of one
    torch.distributed group cannot share a process). Calls run when submitted."""

    def __init__(self, role: Role, ranks: list[Rank]) -> None:
        self.role = role
        self.ranks = ranks

    def __len__(self) -> int:
        return len(self.ranks)

    def submit(self, method: str, args: Sequence[tuple[Any, ...]], ranks: Sequence[int] | None = None) -> Pending:
        ranks = list(ranks) if ranks is not None else list(range(len(args)))
        results = [getattr(self.ranks[r], method)(*a) for r, a in zip(ranks, args, strict=True)]
        return Pending(ranks, results)

    def wait(self, pending: Pending) -> list[Any]:
        return list(pending.handles)

    def done(self, pending: Pending) -> bool:
        return True

    def only(self, rank: int) -> RankGroup:
        return LocalRankGroup(self.role, [self.ranks[rank]])
