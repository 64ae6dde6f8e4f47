"""A training role's parallel layout: which ranks form each tensor-, pipeline-, sequence- and
data-parallel group, and which pod holds each rank. A pure function of the role's declared sizes,
read by the operator (status, the StatefulSet's layout annotation, the memory estimate) and by
the trainer (the device mesh it builds), so both agree on every group.

The ranks of a role's world are laid out on one device mesh of shape (pp, dp, sp, tp), row-major:
pipeline outermost, tensor parallel innermost. Rank r = ((p·dp + d)·sp + s)·tp + t. With tp
innermost a tensor-parallel group is tp consecutive ranks, and since admission makes tp divide a
pod's GPUs, one pod's (so one node's) GPUs; pipeline stages are the outermost blocks, so
consecutive stages sit on different pods once a stage fills a pod. This is the order
`torch.distributed.device_mesh.init_device_mesh(device, (pp, dp, sp, tp))` numbers its ranks in.
Without GPUs each pod is one rank and every group spans pods.

Every group is formed inside the role's one torch.distributed world (the operator's rendezvous:
MASTER_ADDR, WORLD_SIZE, the pod index): each rank computes the same groups from this layout and
creates them with `new_group`, so no rendezvous beyond the role's is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Literal

Dim = Literal["pp", "dp", "sp", "tp"]
# Outermost first: the device mesh's dimension names, in the trainer's order.
MESH_DIMS: tuple[Dim, ...] = ("pp", "dp", "sp", "tp")


@dataclass(frozen=True)
class ParallelLayout:
    """The ranks of one role (world_size of them, procs_per_pod to a pod) on its device mesh."""

    world_size: int
    procs_per_pod: int = 1
    tp: int = 1
    pp: int = 1
    sp: int = 1
    vpp: int | None = None

    def __post_init__(self) -> None:
        if self.world_size % (self.tp * self.pp * self.sp):
            raise ValueError(
                f"tensor × pipeline × sequence parallel ({self.tp} × {self.pp} × {self.sp}) does not divide "
                f"the role's {self.world_size} ranks"
            )

    @property
    def dp(self) -> int:
        """The data-parallel factor: model replicas, each sharded by FSDP2 over its data-parallel group."""
        return self.world_size // (self.tp * self.pp * self.sp)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.pp, self.dp, self.sp, self.tp)

    def size(self, dim: Dim) -> int:
        return self.shape[MESH_DIMS.index(dim)]

    def coords(self, rank: int) -> dict[Dim, int]:
        """The rank's index along each mesh dimension."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the role's {self.world_size} ranks")
        out: dict[Dim, int] = {}
        rest = rank
        for dim in reversed(MESH_DIMS):
            out[dim] = rest % self.size(dim)
            rest //= self.size(dim)
        return out

    def rank_at(self, coords: dict[Dim, int]) -> int:
        rank = 0
        for dim in MESH_DIMS:
            rank = rank * self.size(dim) + coords[dim]
        return rank

    def group_of(self, dim: Dim, rank: int) -> tuple[int, ...]:
        """The ranks that differ from `rank` only along `dim`, in order along it."""
        at = self.coords(rank)
        return tuple(self.rank_at({**at, dim: i}) for i in range(self.size(dim)))

    def groups(self, dim: Dim) -> list[tuple[int, ...]]:
        """Every group along `dim`: each rank is in exactly one."""
        others = [d for d in MESH_DIMS if d != dim]
        out = []
        for index in product(*(range(self.size(d)) for d in others)):
            out.append(self.group_of(dim, self.rank_at({**dict(zip(others, index, strict=True)), dim: 0})))
        return out

    def pod_of(self, rank: int) -> int:
        """The pod (StatefulSet ordinal) holding the rank."""
        return rank // self.procs_per_pod

    def pods_of(self, group: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted({self.pod_of(r) for r in group}))

    @property
    def stages_per_pod(self) -> float:
        """Pipeline stages one pod holds (below 1: a stage spans pods)."""
        return self.procs_per_pod / (self.world_size // self.pp)

    def describe(self) -> str:
        """The layout as `kubectl rlkube` and the status write it, e.g. tp2×pp2×dp2 (factors of 1 left
        out but dp; virtual stages as pp2v2)."""
        parts = [f"tp{self.tp}"] if self.tp > 1 else []
        if self.pp > 1:
            parts.append(f"pp{self.pp}" + (f"v{self.vpp}" if self.vpp else ""))
        if self.sp > 1:
            parts.append(f"sp{self.sp}")
        parts.append(f"dp{self.dp}")
        return "×".join(parts)
