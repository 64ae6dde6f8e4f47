"""A training role's ranks as one DeviceMesh, named by what each dimension divides:

    ("pp", "dp_replicate", "dp_shard", "sp", "tp")      outermost to innermost

so a tensor-parallel group is consecutive ranks (kept inside one node, where the links are
fastest), then a sequence-parallel group, then data parallel, with pipeline stages outermost.
Three flattened dimensions are named as well: "mp" (pp × sp × tp, the ranks that run the same
samples), "dp" (dp_replicate × dp_shard, the ranks that see
different samples) and "fsdp" (dp_shard × sp, what FSDP2 shards over: the ranks of a Ulysses
group hold different tokens of the same samples, so FSDP2 averages their gradients as verl's
FSDP does over its Ulysses groups). Without fsdpSize dp_replicate is 1; with it FSDP2 shards
within groups of fsdpSize ranks and replicates across them (HSDP).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from rlkube_trainer.parallel.layout import ParallelLayout

DIMS = ("pp", "dp_replicate", "dp_shard", "sp", "tp")


@dataclass(frozen=True)
class RoleMesh:
    """One role's mesh and the sub-meshes each engine works on."""

    mesh: DeviceMesh
    layout: ParallelLayout
    dp: DeviceMesh  # the ranks that see different samples (flattened dp_replicate × dp_shard)
    fsdp: DeviceMesh  # what FSDP2 shards over: 1-D, or 2-D (dp_replicate, fsdp) for HSDP
    model_parallel: DeviceMesh  # the ranks that run the same samples (flattened pp × sp × tp)

    @property
    def tp(self) -> DeviceMesh:
        return self.mesh["tp"]

    @property
    def sp(self) -> DeviceMesh:
        return self.mesh["sp"]

    @property
    def pp(self) -> DeviceMesh:
        return self.mesh["pp"]

    def rank_in(self, dim: str) -> int:
        return self.mesh.get_local_rank(dim)


def role_mesh(device_type: str, layout: ParallelLayout, fsdp_size: int | None = None) -> RoleMesh:
    """The mesh of `layout` over the role's default process group (a collective: every rank
    of the role calls it). `fsdp_size` (already checked by ParallelLayout.of) sets HSDP."""
    shard = layout.data * layout.sequence
    dp_shard = layout.data if fsdp_size is None else fsdp_size // layout.sequence
    replicate = layout.data // dp_shard
    assert replicate * dp_shard * layout.sequence == shard
    mesh = init_device_mesh(
        device_type,
        (layout.pipeline, replicate, dp_shard, layout.sequence, layout.tensor),
        mesh_dim_names=DIMS,
    )
    dp = mesh["dp_replicate", "dp_shard"]._flatten("dp")
    fsdp = mesh["dp_shard", "sp"]._flatten("fsdp")
    if replicate > 1:
        fsdp = mesh["dp_replicate", "fsdp"]
    model_parallel = mesh["pp", "sp", "tp"]._flatten("mp")
    return RoleMesh(mesh, layout, dp, fsdp, model_parallel)
