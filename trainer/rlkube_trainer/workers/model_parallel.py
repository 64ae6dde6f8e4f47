"""What a training role's rank does differently under tensor or Ulysses sequence parallel
(roles.<role>.tensorParallelSize, ulyssesSequenceParallelSize; `parallel/`): its model split
before FSDP2 shards it, and its samples shared with the ranks of its model-parallel group.

The driver splits a batch over every rank of the role, as for data parallel alone; the ranks of
one model-parallel group (same data coordinate of the mesh) then pool their shares, run the
pooled samples together, and each returns the rows of its own share. So the driver, the
dispatch and the metrics stay as they are, and a layout is a rank-side matter.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.parallel.layout import LayoutError, ParallelLayout
from rlkube_trainer.parallel.mesh import RoleMesh, role_mesh
from rlkube_trainer.parallel.sequence import enable_ulysses
from rlkube_trainer.parallel.tensor import check_tensor_parallel, parallelize_decoder_layers


def mesh_for(device: torch.device, layout: ParallelLayout, fsdp_size: int | None) -> RoleMesh | None:
    """The role's device mesh when it divides its model (a collective over the role's group);
    None when only data parallel, today's path untouched."""
    if layout.only_data_parallel:
        return None
    if layout.pipeline > 1:
        raise LayoutError(
            f"{layout.field('pipelineParallelSize')} {layout.pipeline}: pipeline-parallel training "
            "is not available in this trainer build"
        )
    return role_mesh(device.type, layout, fsdp_size)


def split_model(model: nn.Module, mesh: RoleMesh, packed: bool) -> None:
    """Tensor parallel, then Ulysses, in place, before FSDP2 shards what remains over data."""
    layout = mesh.layout
    if layout.sequence > 1 and packed:
        raise LayoutError(
            f"{layout.field('ulyssesSequenceParallelSize')} {layout.sequence} runs padded batches: "
            "set useRemovePadding false for this role"
        )
    config = next(m.config for m in model.modules() if hasattr(getattr(m, "config", None), "num_attention_heads"))
    layout.check_model(config)
    check_tensor_parallel(model, layout)
    if layout.tensor > 1:
        parallelize_decoder_layers(model, mesh.tp)
    if layout.sequence > 1:
        enable_ulysses(model, mesh.sp.get_group())


def _joined(parts: list[TrainBatch]) -> TrainBatch:
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(TrainBatch):
        values = [getattr(p, f.name) for p in parts]
        if isinstance(values[0], dict):
            fields[f.name] = {k: torch.cat([v[k] for v in values]) for k in values[0]}
        elif isinstance(values[0], torch.Tensor):
            fields[f.name] = torch.cat(values)
        else:
            fields[f.name] = values[0]
    return TrainBatch(**fields)


def pooled(batch: TrainBatch, mesh: RoleMesh) -> tuple[TrainBatch, slice]:
    """The samples of every rank of this rank's model-parallel group, in rank order, and where
    this rank's own lie among them (a collective over the group)."""
    group = mesh.model_parallel.get_group()
    parts: list[TrainBatch | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, batch.to("cpu"), group=group)
    whole = [p for p in parts if p is not None]
    mine = dist.get_rank(group)
    start = sum(len(p) for p in whole[:mine])
    return _joined(whole), slice(start, start + len(batch))
