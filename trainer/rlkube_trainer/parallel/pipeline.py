"""Pipeline parallelism for a training role, with PyTorch's own `torch.distributed.pipelining`.

A Hugging Face decoder-only model (Llama, Qwen2, Qwen3, Mistral) is cut into stages: the
embeddings on the first, the final norm and the role's head (the actor's response scores, the
critic's values, `model/stage_heads.py`) on the last, the decoder layers divided evenly. Each rank
of a pipeline group keeps only its stages' layers (`prune_to_stages`); the modules keep their
names, so a rank's state dict is the full model's, restricted to what it holds.

Without virtual stages a rank holds one stage and the schedule is 1F1B (GPipe when a batch has
fewer micro-batches than stages, which 1F1B cannot order); with `virtualPipelineParallelSize` V
it holds V stages, rank r the stages r, r + P, r + 2P, ... (torch's looped placement), run by
the interleaved 1F1B schedule (looped BFS where the micro-batches do not fill its rounds).

The loss runs on the last stage, inside the schedule: its `loss_fn(output, target)` receives as
target the batch's row indices of the micro-batch (split from `torch.arange(rows)` exactly as
the inputs are split), so the caller's loss reads that micro-batch's own per-token old
log-probs, advantages, returns and masks. Gradients are not scaled by the schedule
(`scale_grads=False`): the caller's loss is already weighed by the micro-batch's share of the
mini-batch, as the non-pipelined gradient accumulation does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from rlkube_trainer.parallel.gradients import clip_grad_norm

# Decoder-only models whose backbone is embed_tokens → layers → norm with a rotary embedding
# module, and whose head's output is used as is: the models a stage can be cut from.
PIPELINED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})

LossOfRows = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class PipelineLayoutError(ValueError):
    """A pipeline layout the model cannot take."""


def stage_layers(num_layers: int, pipeline: int, virtual: int | None, role: str) -> list[range]:
    """The decoder layers of each of the pipeline's P × V stages, in order; refuses a layer count
    that the stages do not divide (uneven stages would leave the slowest one the pace)."""
    stages = pipeline * (virtual or 1)
    if num_layers % stages:
        raise PipelineLayoutError(
            f"roles.{role}.pipelineParallelSize {pipeline} × virtualPipelineParallelSize {virtual or 1} = "
            f"{stages} stages do not divide the model's {num_layers} decoder layers"
        )
    per = num_layers // stages
    return [range(s * per, (s + 1) * per) for s in range(stages)]


def stages_of_rank(pipeline_rank: int, pipeline: int, virtual: int | None) -> list[int]:
    """The stage indices a pipeline rank holds: r, r + P, ... (the looped schedules' placement)."""
    return [pipeline_rank + k * pipeline for k in range(virtual or 1)]


def check_model(config: Any, role: str) -> None:
    """Refuse a model the stage split does not cover (the architecture's name in the message)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in PIPELINED_MODEL_TYPES:
        raise PipelineLayoutError(
            f"roles.{role}.pipelineParallelSize > 1 covers {sorted(PIPELINED_MODEL_TYPES)} decoder models; "
            f"the model is {model_type!r}"
        )


class DecoderStage(nn.Module):
    """One stage: [embeddings] → its decoder layers → [final norm → head]. `forward` takes the
    token ids (first stage) or the previous stage's hidden states, and the micro-batch's
    attention mask, positions and token ids as keyword arguments (every stage gets those: the
    layers' attention masks and rotary embeddings are made from them on each stage, and the
    head reads the token ids and the response mask)."""

    def __init__(
        self,
        backbone: nn.Module,
        layers: dict[int, nn.Module],
        first: bool,
        head: nn.Module | None,
    ) -> None:
        super().__init__()
        self.config: Any = backbone.config
        self.embed_tokens: nn.Module | None = cast(nn.Module, backbone.embed_tokens) if first else None
        # The original indices as names: the stage's parameter names are the backbone's.
        self.layers = nn.ModuleDict({str(i): layer for i, layer in layers.items()})
        types: list[str] | None = getattr(backbone.config, "layer_types", None)
        self.layer_types: list[str] = [types[i] if types else "full_attention" for i in layers]
        self.rotary_emb = cast(nn.Module, backbone.rotary_emb)
        self.norm: nn.Module | None = cast(nn.Module, backbone.norm) if head is not None else None
        self.head = head

    def forward(
        self,
        inputs: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        input_ids: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask  # noqa: PLC0415

        hidden = self.embed_tokens(inputs) if self.embed_tokens is not None else inputs
        masks: dict[str, Any] = {}
        for kind in set(self.layer_types):
            make = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
            masks[kind] = make(
                config=self.config,
                inputs_embeds=hidden,
                attention_mask=attention_mask,
                past_key_values=None,
                position_ids=position_ids,
            )
        position_embeddings = self.rotary_emb(hidden, position_ids)
        for kind, layer in zip(self.layer_types, self.layers.values(), strict=True):
            hidden = layer(
                hidden,
                attention_mask=masks[kind],
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                use_cache=False,
            )
        if self.head is None:
            return hidden
        assert self.norm is not None
        output: torch.Tensor = self.head(self.norm(hidden), input_ids, response_mask)
        return output


def backbone_of(model: nn.Module) -> nn.Module:
    """The decoder stack: a causal LM's `.model`, the critic's `.backbone`."""
    for name in ("backbone", "model"):
        inner = getattr(model, name, None)
        if isinstance(inner, nn.Module) and hasattr(inner, "layers"):
            return inner
    raise PipelineLayoutError(f"{type(model).__name__} has no decoder stack (.model or .backbone) to cut")


@dataclass
class StageSplit:
    """What one pipeline rank holds: its stages (in schedule order) and their indices."""

    stages: list[DecoderStage]
    indices: list[int]
    num_stages: int

    @property
    def first(self) -> bool:
        return 0 in self.indices

    @property
    def last(self) -> bool:
        return self.num_stages - 1 in self.indices


def split_stages(
    model: nn.Module,
    head: Callable[[], nn.Module],
    pipeline_rank: int,
    pipeline: int,
    virtual: int | None,
    role: str,
    head_names: Sequence[str],
) -> StageSplit:
    """Cuts `model` into this rank's stages and drops from it what the rank does not hold: the
    other stages' decoder layers, the embeddings off the first stage, the final norm and the
    head modules named `head_names` (the LM head, the value head) off the last. `head` makes the
    last stage's head (called only where this rank holds it)."""
    check_model(model.config if hasattr(model, "config") else backbone_of(model).config, role)
    backbone = backbone_of(model)
    decoder = cast(nn.ModuleList, backbone.layers)
    ranges = stage_layers(len(decoder), pipeline, virtual, role)
    indices = stages_of_rank(pipeline_rank, pipeline, virtual)
    last_index = len(ranges) - 1
    last_head = head() if last_index in indices else None
    stages = [
        DecoderStage(
            backbone,
            {i: decoder[i] for i in ranges[s]},
            first=s == 0,
            head=last_head if s == last_index else None,
        )
        for s in indices
    ]
    prune_to_stages(
        model, backbone, [i for s in indices for i in ranges[s]], 0 in indices, last_index in indices, head_names
    )
    return StageSplit(stages, indices, len(ranges))


def prune_to_stages(
    model: nn.Module, backbone: nn.Module, layers: list[int], first: bool, last: bool, head_names: Sequence[str]
) -> None:
    """Keeps in `model` only the modules this rank's stages hold, under their own names."""
    decoder = cast(nn.ModuleList, backbone.layers)
    backbone.layers = nn.ModuleDict({str(i): decoder[i] for i in layers})
    # None, not deleted: the module's forward and state dict then simply skip it.
    dropped = [*([] if first else ["embed_tokens"]), *([] if last else ["norm"])]
    for name in dropped:
        setattr(backbone, name, None)
    for name in [] if last else head_names:
        setattr(model, name, None)


def tied_embedding(model: nn.Module) -> bool:
    """Whether the LM head shares the embeddings' weight (tie_word_embeddings)."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "tie_word_embeddings", False)) and hasattr(model, "lm_head")


@dataclass
class Pipeline:
    """A role's pipeline on this rank: its stages, the pipeline group, and the schedules run
    over them. `train` runs a mini-batch's micro-batches forward and backward (the loss on the
    last stage), `forward` runs them forward only; both hand every rank of the group the last
    stage's results."""

    split: StageSplit
    group: dist.ProcessGroup
    device: torch.device
    virtual: int | None = None
    # The module whose `weight` is the tied embedding, where this rank holds it: the
    # embeddings on the first stage, the LM head on the last (looked up at each use: FSDP2
    # replaces the parameter by its sharded one). Every rank of the group knows whether the
    # model ties them (`tied_everywhere`): the ranks between add zeros to the gradients' sum.
    tied_owner: nn.Module | None = None
    tied_everywhere: bool = False
    _tied_shape: tuple[int, ...] | None = None
    _schedules: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    _loss: LossOfRows | None = None

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def last_rank(self) -> int:
        """The group rank that holds the last stage."""
        return (self.split.num_stages - 1) % self.size

    def parameters(self) -> list[nn.Parameter]:
        seen: dict[int, nn.Parameter] = {}
        for stage in self.split.stages:
            for p in stage.parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    def _loss_fn(self, output: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        assert self._loss is not None
        return self._loss(output, rows)

    def _schedule(self, train: bool, micro_batches: int, shape: tuple[int, ...]) -> Any:
        """The schedule for micro-batches of this shape (the stages' buffers are sized by the
        first micro-batch, so a new shape gets new stages); kept for the next call alike."""
        key = (train, micro_batches, shape)
        if key not in self._schedules:
            self._schedules = {k: v for k, v in self._schedules.items() if k[0] != train}
            self._schedules[key] = self._build(train, micro_batches)
        return self._schedules[key]

    def _build(self, train: bool, micro_batches: int) -> Any:
        from torch.distributed import pipelining  # noqa: PLC0415

        stages: list[pipelining.stage._PipelineStageBase] = [
            pipelining.PipelineStage(stage, index, self.split.num_stages, self.device, group=self.group)
            for stage, index in zip(self.split.stages, self.split.indices, strict=True)
        ]
        loss_fn = self._loss_fn if train else None
        if len(stages) > 1:
            rounds = max(1, micro_batches // self.size)
            looped = pipelining.ScheduleInterleaved1F1B if micro_batches % rounds == 0 else pipelining.ScheduleLoopedBFS
            return looped(stages, micro_batches, loss_fn=loss_fn, scale_grads=False)
        single = pipelining.Schedule1F1B if micro_batches >= self.size else pipelining.ScheduleGPipe
        return single(stages[0], micro_batches, loss_fn=loss_fn, scale_grads=False)

    def _step(self, train: bool, inputs: dict[str, torch.Tensor], micro_size: int, **step: Any) -> Any:
        rows = inputs["input_ids"].shape[0]
        size = micro_batch_rows(rows, micro_size)
        count = rows // size
        schedule = self._schedule(
            train, count, (size, *inputs["input_ids"].shape[1:], *inputs["response_mask"].shape[1:])
        )
        args = (inputs["input_ids"],) if self.split.first else ()
        return schedule.step(*args, **inputs, **step)

    def train(self, inputs: dict[str, torch.Tensor], micro_size: int, loss: LossOfRows) -> None:
        """Forward and backward of a mini-batch in micro-batches of about `micro_size` rows;
        `loss(output, rows)` is the weighed loss of the micro-batch of those rows of the batch
        (run on the last stage). The gradients accumulate in the stages' parameters, the tied
        embedding's summed over its two copies."""
        self._loss = loss
        rows = torch.arange(inputs["input_ids"].shape[0], device=self.device)
        try:
            self._step(True, inputs, micro_size, target=rows if self.split.last else None, return_outputs=False)
        finally:
            self._loss = None
        self._sum_tied_gradients()

    @torch.no_grad()
    def forward(self, inputs: dict[str, torch.Tensor], micro_size: int, like: torch.Tensor) -> torch.Tensor:
        """The last stage's output for the whole batch, on every rank of the group (`like`: a
        tensor of the output's shape and dtype, which the other ranks receive into)."""
        output = self._step(False, inputs, micro_size)
        result = output.detach().to(like.dtype).contiguous() if self.split.last else torch.empty_like(like)
        dist.broadcast(result, group=self.group, group_src=self.last_rank)
        return result

    def share(self, value: Any) -> Any:
        """An object made on the last stage (the loss's metrics), on every rank of the group."""
        box = [value]
        dist.broadcast_object_list(box, group=self.group, group_src=self.last_rank)
        return box[0]

    def _sum_tied_gradients(self) -> None:
        """The LM head tied to the embeddings: its copy on the last stage and the embeddings' on
        the first each have part of the gradient; both get the sum, so that they step alike. The
        ranks between them add zeros (one all-reduce over the group, no second group to form)."""
        if not self.tied_everywhere:
            return
        weight = self.tied
        local: torch.Tensor | None = None
        if weight is not None:
            if weight.grad is None:  # no gradient reached this copy in this mini-batch
                weight.grad = torch.zeros_like(weight)
            grad = weight.grad
            local = grad.to_local() if hasattr(grad, "to_local") else grad
        if self._tied_shape is None:  # the local shard's shape, from the first stage, once
            box: list[Any] = [tuple(local.shape) if local is not None else None]
            dist.broadcast_object_list(box, group=self.group, group_src=0)
            self._tied_shape = box[0]
        assert self._tied_shape is not None
        dist.all_reduce(
            local if local is not None else torch.zeros(self._tied_shape, device=self.device), group=self.group
        )

    @property
    def tied(self) -> nn.Parameter | None:
        return None if self.tied_owner is None else cast(nn.Parameter, self.tied_owner.weight)

    def clip_grad_norm(self, parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
        """`nn.utils.clip_grad_norm_` over the whole model: the norm of this rank's gradients (over
        each of their meshes, `gradients.clip_grad_norm`), combined across the group with the tied
        embedding counted once (on the first stage), then every gradient scaled by one number."""
        params = list(parameters)
        counted = [p for p in params if not (self.tied is not None and p is self.tied and not self.split.first)]
        local = float(clip_grad_norm(counted, math.inf))
        squared = torch.tensor([local**2], dtype=torch.float64, device=self.device)
        dist.all_reduce(squared, group=self.group)
        norm = torch.tensor(math.sqrt(float(squared)))
        coefficient = max_norm / (float(norm) + 1e-6)
        if coefficient < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coefficient)
        return norm


def micro_batch_rows(rows: int, wanted: int) -> int:
    """The micro-batch size the pipeline runs: the largest divisor of the batch's rows not above
    the configured size (every micro-batch must have one shape, the stages' buffers are sized
    by the first; the gradient does not depend on the cut, `packing.LossScale`)."""
    wanted = max(1, min(wanted, rows))
    return next(size for size in range(wanted, 0, -1) if rows % size == 0)


def build_pipeline(
    model: nn.Module,
    head: Callable[[], nn.Module],
    head_names: Sequence[str],
    group: dist.ProcessGroup,
    device: torch.device,
    virtual: int | None,
    role: str,
) -> Pipeline:
    """This rank's part of `model` as pipeline stages over `group` (the role's "pp" mesh
    dimension; a collective over it); `model` keeps only what the rank holds."""
    embeddings = cast(nn.Embedding, backbone_of(model).embed_tokens)
    head_module = getattr(model, "lm_head", None)
    # A frozen tied weight (a LoRA base) has no gradient to share.
    tied = (
        tied_embedding(model)
        and head_module is not None
        and head_module.weight is embeddings.weight
        and embeddings.weight.requires_grad
    )
    split = split_stages(model, head, dist.get_rank(group), dist.get_world_size(group), virtual, role, head_names)
    owner: nn.Module | None = None
    if tied and split.first:
        owner = embeddings
    elif tied and split.last:
        owner = head_module
    return Pipeline(split, group, device, virtual, owner, tied)
