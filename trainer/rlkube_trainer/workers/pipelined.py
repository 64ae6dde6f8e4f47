"""What a training role's rank does differently under pipeline parallel
(roles.<role>.pipelineParallelSize, virtualPipelineParallelSize; `parallel/pipeline.py`): its
model cut into stages, each stage sharded by FSDP2 over the data ranks as its own root, and its
update's and forward-only passes run by the pipeline's schedule.

The samples are the model-parallel group's pooled ones (`model_parallel.pooled`), so every
stage of a pipeline sees the same mini-batches; the loss of each micro-batch is the role's own
(`output_loss`), weighed by `LossScale` as without a pipeline, and runs on the last stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlkube_api.config import FSDPConfig
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.model.fsdp import DTYPES, shard_with_fsdp2
from rlkube_trainer.model.packing import LossScale
from rlkube_trainer.model.token_scores import position_ids_from_mask
from rlkube_trainer.parallel.layout import LayoutError
from rlkube_trainer.parallel.mesh import RoleMesh
from rlkube_trainer.parallel.pipeline import Pipeline, build_pipeline

Metrics = dict[str, float]
OutputLoss = Callable[[TrainBatch, torch.Tensor, LossScale], tuple[torch.Tensor, Metrics]]


def check_pipelined(mesh: RoleMesh, packed: bool, dynamic_batches: bool, packed_field: str, dynamic_field: str) -> None:
    """Refuse what a pipeline cannot run: the stages' buffers are sized by the first
    micro-batch, so every micro-batch has one shape (no packed rows, no token budgets); and
    stages split further by Ulysses sequence parallel, which no test proves yet (tensor-parallel
    stages are proven: `tests/trainer/test_pipeline_parallel.py`)."""
    pipeline = mesh.layout.field("pipelineParallelSize")
    if mesh.layout.sequence > 1:
        raise LayoutError(
            f"{pipeline} {mesh.layout.pipeline} runs with ulyssesSequenceParallelSize 1 in this trainer "
            "(pipeline × sequence parallel is not proven yet)"
        )
    if packed:
        raise LayoutError(f"{pipeline} {mesh.layout.pipeline} runs padded micro-batches: set {packed_field} false")
    if dynamic_batches:
        raise LayoutError(
            f"{pipeline} {mesh.layout.pipeline} runs micro-batches of one size: set {dynamic_field} false"
        )


def pipeline_of(
    model: nn.Module,
    mesh: RoleMesh,
    head: Callable[[], nn.Module],
    head_names: Sequence[str],
    device: torch.device,
    fsdp: FSDPConfig,
    mixed_precision: bool = True,
) -> Pipeline:
    """`model` (tensor- or sequence-split already) cut into this rank's stages over the mesh's
    "pp" dimension, each stage then sharded by FSDP2 over the data ranks as its own root (the
    schedule calls the stages, never the whole model)."""
    layout = mesh.layout
    pipeline = build_pipeline(
        model, head, head_names, mesh.pp.get_group(), device, layout.virtual_pipeline, layout.role
    )
    param_dtype = DTYPES[fsdp.mixed_precision.param_dtype] if mixed_precision else None
    reduce_dtype = DTYPES[fsdp.mixed_precision.reduce_dtype] if mixed_precision else None
    for stage in pipeline.split.stages:
        shard_with_fsdp2(
            stage,
            mesh.fsdp,
            param_dtype,
            reduce_dtype,
            fsdp.param_offload,
            reshard_after_forward=fsdp.reshard_after_forward,
        )
    return pipeline


def stage_inputs(batch: TrainBatch, device: torch.device) -> dict[str, torch.Tensor]:
    """What every stage's forward takes (DecoderStage.forward)."""
    return {
        "input_ids": batch.input_ids.to(device),
        "attention_mask": batch.attention_mask.to(device),
        "position_ids": position_ids_from_mask(batch.attention_mask).to(device),
        "response_mask": batch.response_mask.to(device),
    }


def backward(
    pipeline: Pipeline, mini: TrainBatch, scale: LossScale, micro_size: int, device: torch.device, loss: OutputLoss
) -> list[Metrics]:
    """A mini-batch's forward and backward through the schedule; each micro-batch's metrics, on
    every rank of the pipeline."""
    metrics: dict[int, Metrics] = {}

    def loss_of_rows(output: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        value, metrics[int(rows[0])] = loss(mini.select(rows.cpu()).to(device), output, scale)
        return value

    pipeline.train(stage_inputs(mini, device), micro_size, loss_of_rows)
    shared: list[Metrics] = pipeline.share([metrics[row] for row in sorted(metrics)])
    return shared


def forward(pipeline: Pipeline, batch: TrainBatch, micro_size: int, device: torch.device, width: int) -> torch.Tensor:
    """The last stage's output for `batch` ([batch, response_length] or [..., width]), on every
    rank of the pipeline, in host memory."""
    shape = (len(batch), batch.response_length, width) if width else (len(batch), batch.response_length)
    like = torch.empty(shape, device=device)
    return pipeline.forward(stage_inputs(batch, device), micro_size, like).cpu()


def every_stage(
    pipeline: Pipeline, own: Iterable[tuple[str, torch.Tensor]], device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every stage's (name, full tensor) on every rank of the pipeline (the rollout engine loads
    the whole model): the ranks' own in turn, each tensor as its rank yields it and broadcast
    over the pipeline group to the others. A collective over the group."""
    group, me = pipeline.group, dist.get_rank(pipeline.group)
    for source in range(pipeline.size):
        items = iter(own) if source == me else iter(())
        while True:
            item = next(items, None) if source == me else None
            box: list[Any] = [None if item is None else (item[0], tuple(item[1].shape), item[1].dtype)]
            dist.broadcast_object_list(box, group=group, group_src=source)
            if box[0] is None:
                break
            name, shape, dtype = box[0]
            tensor = (
                item[1].to(device).contiguous() if item is not None else torch.empty(shape, dtype=dtype, device=device)
            )
            dist.broadcast(tensor, group=group, group_src=source)
            yield name, tensor


def stage_specs(pipeline: Pipeline, own: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor on the meta device) of every stage's weights, in stage-rank order, with their
    full shapes and dtypes (a collective over the pipeline group)."""
    parts: list[Any] = [None] * pipeline.size
    mine = [(name, tuple(t.shape), t.dtype) for name, t in own]
    dist.all_gather_object(parts, mine, group=pipeline.group)
    return [(name, torch.empty(shape, dtype=dtype, device="meta")) for part in parts for name, shape, dtype in part]


def refuse_pipeline(mesh: RoleMesh | None, what: str) -> None:
    """Refuse pipeline stages for a pass that is not run through them (naming the field)."""
    if mesh is not None and mesh.layout.pipeline > 1:
        raise LayoutError(
            f"{mesh.layout.field('pipelineParallelSize')} {mesh.layout.pipeline}: {what} run without pipeline "
            "stages in this trainer; set it to 1 for this role"
        )
