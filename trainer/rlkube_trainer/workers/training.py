"""What actor and critic share: the model spread over the role's group, the optimizer and
its schedule, checkpoint state, and PPO's update loop, written once.

An update is PPO's: `ppo_epochs` passes over the batch in mini-batches (one optimizer step
each), every mini-batch in micro-batches whose gradients accumulate: a fixed number of
samples each, or as many as fit a token budget (`MicroBatching`). Each micro-batch's loss is
weighed (`packing.LossScale`) so that a mini-batch's gradient is that of its loss aggregated
over the whole mini-batch, however it is cut. A subclass says only what the loss of one
micro-batch is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import resource
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from rlkube_api.config import FSDPConfig, OptimConfig, Strategy
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.model.fsdp import DTYPES, average_gradients, device_mesh, is_sharded, shard_with_fsdp2, world_size
from rlkube_trainer.model.packing import LossScale, token_bins
from rlkube_trainer.parallel.gradients import clip_grad_norm
from rlkube_trainer.parallel.layout import LayoutError, ParallelLayout
from rlkube_trainer.parallel.mesh import RoleMesh
from rlkube_trainer.workers.model_parallel import pooled, split_model

Metrics = dict[str, float]
log = logging.getLogger("rlkube.trainer")


@dataclass(frozen=True)
class Placement:
    """Where a role's model lives on this rank: the device, the size of the FSDP2 groups it is
    sharded within (roles.<role>.fsdp_size; None: the role's whole group), the seed its new
    weights (adapters, a value head) and its shuffles start from, and how its ranks divide the
    model (tensor, pipeline, Ulysses sequence parallel; data parallel alone by default)."""

    device: torch.device
    fsdp_size: int | None
    seed: int
    layout: ParallelLayout = dataclasses.field(default_factory=ParallelLayout)


def uses_fsdp2(device: torch.device, strategy: Strategy) -> bool:
    """FSDP2 where asked for, and by default on GPU (one rank too: its mixed precision is what
    computes in bf16 over fp32 master weights); full replicas otherwise. Without a process
    group (in this process on CPU) the model stays as it is."""
    if not dist.is_initialized():
        return False
    return strategy == "fsdp2" or (strategy == "auto" and device.type == "cuda")


def distribute(
    model: nn.Module,
    device: torch.device,
    strategy: Strategy,
    fsdp_size: int | None = None,
    fsdp: FSDPConfig | None = None,
    mixed_precision: bool = True,
    mesh: RoleMesh | None = None,
    packed: bool = False,
) -> nn.Module:
    """FSDP2 (HSDP with `fsdp_size`, offload and mixed precision as `fsdp` says) or full replicas
    across the role group (fsdp.py). A model-parallel `mesh` splits the model first
    (model_parallel.split_model), then FSDP2 shards it over the mesh's data × sequence ranks."""
    if mesh is not None:
        if strategy == "replicate":
            raise LayoutError(
                f"{mesh.layout.field('tensorParallelSize')} / ulyssesSequenceParallelSize above 1 run "
                "under FSDP2: the role's strategy replicate cannot carry them (use fsdp2 or auto)"
            )
        split_model(model, mesh, packed)
    elif not uses_fsdp2(device, strategy):
        return model
    fsdp = fsdp or FSDPConfig()
    param_dtype = reduce_dtype = None
    if mixed_precision:
        param_dtype = DTYPES[fsdp.mixed_precision.param_dtype]
        reduce_dtype = DTYPES[fsdp.mixed_precision.reduce_dtype]
    return shard_with_fsdp2(
        model,
        device_mesh(device, fsdp_size) if mesh is None else mesh.fsdp,
        param_dtype,
        reduce_dtype,
        fsdp.param_offload,
        reshard_after_forward=fsdp.reshard_after_forward,
    )


def load_distributed(
    load: Callable[[], nn.Module],
    skeleton: Callable[[], nn.Module],
    device: torch.device,
    strategy: Strategy,
    fsdp_size: int | None = None,
    fsdp: FSDPConfig | None = None,
    mixed_precision: bool = True,
    prepare: Callable[[nn.Module], object] | None = None,
    mesh: RoleMesh | None = None,
    packed: bool = False,
) -> nn.Module:
    """A role's model, spread over its group as `distribute` does, loaded without a full copy
    per rank where it is sharded: rank 0 alone reads the checkpoint (`load`, into host memory);
    every rank builds the architecture on the meta device (`skeleton`), shards it, and receives
    its shard of each tensor from rank 0, one tensor at a time. A full copy per rank remains
    for replicas, one rank, and parameter offload (whose shards live in host memory).
    `prepare` runs on the model before sharding (gradient checkpointing, freezing). `mesh` and
    `packed` as in `distribute`."""
    fsdp = fsdp or FSDPConfig()
    started = time.perf_counter()
    sharded = uses_fsdp2(device, strategy) or mesh is not None
    if not sharded or world_size() == 1 or fsdp.param_offload:
        model = load().to(device)
        if prepare is not None:
            prepare(model)
        model = distribute(model, device, strategy, fsdp_size, fsdp, mixed_precision, mesh, packed)
        _report_load(model, device, "every rank read the checkpoint", started)
        return model
    full = load() if dist.get_rank() == 0 else None
    with torch.device("meta"):
        model = skeleton()
    if prepare is not None:
        prepare(model)
    model = distribute(model, device, strategy, fsdp_size, fsdp, mixed_precision, mesh, packed)
    model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full.state_dict() if full is not None else {}, options=options)
    # Buffers are not in the state dict when non-persistent (rotary frequencies): from rank 0 too.
    for name, buffer in model.named_buffers():
        if full is not None:
            buffer.copy_(full.get_buffer(name))
        dist.broadcast(buffer, src=0)
    del full
    _report_load(model, device, "rank 0 read the checkpoint, the others received their shards", started)
    return model


def _report_load(model: nn.Module, device: torch.device, how: str, started: float) -> None:
    peak_host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    gpu = f", GPU peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if device.type == "cuda" else ""
    log.info(
        "loaded %s in %.1f s (%s): host peak %.1f GiB%s",
        type(model).__name__,
        time.perf_counter() - started,
        how,
        peak_host,
        gpu,
    )


def autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on GPU; plain fp32 on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


HOST = torch.device("cpu")


@torch.no_grad()
def move_optimizer_state(optimizer: torch.optim.Optimizer, to_host: bool) -> int:
    """Moves the optimizer state that lives beside its parameter (AdamW's moments, DTensor
    shards under FSDP2) to host memory, or back to its parameter's device; returns the bytes
    moved. The step count stays where torch keeps it (on the CPU unless the optimizer is fused
    or capturable). From a GPU the host copies land in pinned memory (non-blocking copies to
    the CPU allocate it), and the host waits for them: a checkpoint may read them next. With
    paramOffload the parameters, and so the state, are in host memory already: nothing moves."""
    moved = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            where = HOST if to_host else param.device
            for key, value in state.items():
                if key == "step" or not isinstance(value, torch.Tensor) or value.device == where:
                    continue
                state[key] = value.to(where, non_blocking=True)
                moved += value.numel() * value.element_size()
    if moved and to_host and torch.cuda.is_available():
        torch.cuda.synchronize()
    return moved


def build_optimizer(params: Iterator[nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        list(params), lr=optim.lr, betas=(optim.betas[0], optim.betas[1]), weight_decay=optim.weight_decay
    )


def lr_factor(optim: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """Linear warmup from 0, then constant or cosine down to min_lr_ratio (verl's schedules)."""
    warmup = optim.lr_warmup_steps or int(optim.lr_warmup_steps_ratio * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        if optim.warmup_style == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def mini_batches(
    batch: TrainBatch, size: int, shuffle: bool, generator: torch.Generator, data_ranks: int | None = None
) -> list[TrainBatch]:
    """Mini-batches of this rank's shard: the configured size is global, split across the
    group's `data_ranks` (every rank when data parallel alone)."""
    size = max(1, size // (data_ranks or world_size()))
    order = torch.randperm(len(batch), generator=generator) if shuffle else torch.arange(len(batch))
    return [batch.select(order[i : i + size]) for i in range(0, len(batch), size)]


@dataclass(frozen=True)
class MicroBatching:
    """How a rank cuts its batch into micro-batches: `size` samples each, or (with
    `token_budget`, verl's use_dynamic_bsz) as many samples as fit that many real tokens, the
    same number of micro-batches on every rank of the group. `budget_field` names the budget in
    errors."""

    size: int
    token_budget: int | None = None
    budget_field: str = ""

    def groups(self, batch: TrainBatch) -> list[torch.Tensor]:
        """The sample indices of each micro-batch (a collective over the group when dynamic)."""
        if self.token_budget is None:
            return [torch.arange(i, min(i + self.size, len(batch))) for i in range(0, len(batch), self.size)]
        lengths = [int(n) for n in batch.attention_mask.sum(-1)]
        return [torch.tensor(g) for g in token_bins(lengths, self.token_budget, self.budget_field)]

    def map(self, batch: TrainBatch, fn: Callable[[TrainBatch], torch.Tensor]) -> torch.Tensor:
        """`fn` on each micro-batch, its rows put back in the batch's order."""
        groups = self.groups(batch)
        parts = torch.cat([fn(batch.select(g)) for g in groups])
        out = torch.empty_like(parts)
        out[torch.cat(groups)] = parts
        return out


def mean_metrics(values: dict[str, list[float]]) -> Metrics:
    return {k: sum(v) / len(v) for k, v in values.items() if v}


class Trainable:
    """A role with an optimizer. Subclasses set `model` and the loop's sizes before calling
    `__init__`, and define `micro_batch_loss`.

    Only the parameters that require a gradient train: with LoRA (rlkube_trainer.model.lora) the
    adapters (and the critic's value head), while the frozen base stays out of the optimizer,
    the gradient clipping and the checkpoints (which then hold the adapter and its optimizer
    state; the base is read from model.path again at resume).

    With `offload_optimizer` (fsdpConfig.optimizerOffload, verl's optimizer_offload) the
    optimizer state waits in host memory between updates: it returns to the parameters'
    device just before an update's first optimizer step and leaves after the update, so the
    rollout engine generates, and the weights sync, without it on the GPU."""

    model: nn.Module
    prefix: str  # the metrics' namespace: "actor" or "critic"
    ppo_epochs: int
    samples_per_mini_batch: int
    micro_batching: MicroBatching
    shuffle: bool
    # The model-parallel mesh when the role's layout divides the model (model_parallel.py).
    mesh: RoleMesh | None = None

    def __init__(
        self,
        optim: OptimConfig,
        total_steps: int,
        grad_clip: float,
        device: torch.device,
        seed: int,
        offload_optimizer: bool = False,
    ) -> None:
        self.device = device
        self.grad_clip = grad_clip
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        # Some parameters frozen (a LoRA base): checkpoints hold only those that train.
        self.frozen_base = len(self.trainable) < len(list(self.model.parameters()))
        self.optimizer = build_optimizer(iter(self.trainable), optim)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(optim, total_steps))
        self.generator = torch.Generator().manual_seed(seed)
        self.offload_optimizer = offload_optimizer
        # Where the optimizer state is meant to be now: True between updates when offloaded.
        self.optimizer_state_on_host = False

    def forward_only(self, batch: TrainBatch, fn: Callable[[TrainBatch], torch.Tensor]) -> torch.Tensor:
        """`fn` over `batch` pooled with the rank's model-parallel group; this rank's rows."""
        if self.mesh is None:
            return fn(batch)
        whole, own = pooled(batch, self.mesh)
        return fn(whole)[own]

    def micro_batch_loss(self, micro: TrainBatch, scale: LossScale) -> tuple[torch.Tensor, Metrics]:
        """What one micro-batch (already on the device) adds to the mini-batch's loss, weighed by
        `scale`, and its metrics (the micro-batch's own, unweighed)."""
        raise NotImplementedError

    def update(self, batch: TrainBatch) -> Metrics:
        """PPO epochs over mini-batches of micro-batches; returns the mean of each metric."""
        self.model.train()
        stats: dict[str, list[float]] = defaultdict(list)
        data_ranks, copies = None, 1
        if self.mesh is not None:
            batch, _ = pooled(batch, self.mesh)
            data_ranks, copies = self.mesh.layout.data, self.mesh.layout.model_parallel
        for _ in range(self.ppo_epochs):
            for mini in mini_batches(batch, self.samples_per_mini_batch, self.shuffle, self.generator, data_ranks):
                scale = LossScale.of(mini.response_mask, copies)
                for group in self.micro_batching.groups(mini):
                    loss, metrics = self.micro_batch_loss(mini.select(group).to(self.device), scale)
                    torch.autograd.backward(loss)
                    for key, value in metrics.items():
                        stats[key].append(value)
                stats[f"{self.prefix}/grad_norm"].append(self._optimizer_step())
        stats[f"{self.prefix}/lr"].append(float(self.scheduler.get_last_lr()[0]))
        self.scheduler.step()
        self._offload_optimizer_state()
        return mean_metrics(stats)

    def _optimizer_step(self) -> float:
        average_gradients(self.model)
        clip = nn.utils.clip_grad_norm_ if self.mesh is None else clip_grad_norm
        norm = clip(self.trainable, self.grad_clip)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if math.isfinite(grad_norm):
            self._load_optimizer_state()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _offload_optimizer_state(self) -> None:
        if self.offload_optimizer:
            moved = move_optimizer_state(self.optimizer, to_host=True)
            self.optimizer_state_on_host = True
            if moved:
                log.debug("%s: %d bytes of optimizer state to host memory", self.prefix, moved)

    def _load_optimizer_state(self) -> None:
        if self.optimizer_state_on_host:
            move_optimizer_state(self.optimizer, to_host=False)
            self.optimizer_state_on_host = False

    # --- checkpoint state ------------------------------------------------------------------------
    # With offload the state is saved from host memory; loading puts it beside the parameters
    # (torch's Optimizer.load_state_dict), so it is offloaded again after.
    def _model_state(self) -> dict[str, Any]:
        state = self.model.state_dict()
        if not self.frozen_base:
            return state
        trains = {name for name, p in self.model.named_parameters() if p.requires_grad}
        return {name: value for name, value in state.items() if name in trains}

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self._model_state(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing, unexpected = self.model.load_state_dict(state["model"], strict=not self.frozen_base)
        trains = {name for name, p in self.model.named_parameters() if p.requires_grad}
        if unexpected or trains & set(missing):
            raise ValueError(
                f"{self.prefix} checkpoint does not fit the model (LoRA settings changed?): "
                f"missing {sorted(trains & set(missing))[:5]}, unexpected {sorted(unexpected)[:5]}"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        self._offload_optimizer_state()

    # A sharded model's parameters and optimizer state are DTensors: they go through
    # torch.distributed.checkpoint (checkpoint.state.save_sharded), the rest stays per rank.
    @property
    def sharded(self) -> bool:
        return is_sharded(self.model)

    def sharded_state_dict(self) -> dict[str, Any]:
        options = StateDictOptions(ignore_frozen_params=self.frozen_base)
        model, optimizer = get_state_dict(self.model, self.optimizer, options=options)
        if self.frozen_base:
            # A tied head (lm_head sharing the frozen embedding) is listed under its own name
            # even so: only what trains is kept.
            trains = {name for name, p in self.model.named_parameters() if p.requires_grad}
            model = {name: value for name, value in model.items() if name in trains}
        # Before the first step get_state_dict makes the (zero) state where the parameters are.
        self._offload_optimizer_state()
        return {"model": model, "optimizer": optimizer}

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=StateDictOptions(strict=not self.frozen_base),
        )
        self._offload_optimizer_state()

    def load_full_state_dict(self, state: dict[str, Any]) -> None:
        """What `state_dict` saved on full replicas, into this run's shards (resumed with FSDP2
        from a checkpoint of unsharded ranks: another world size, or one rank on CPU)."""
        names = [name for name, _ in self.model.named_parameters()]
        optimizer = state["optimizer"]
        # torch's Optimizer.state_dict names a parameter by its index in param_groups (the model's
        # order, build_optimizer); torch.distributed.checkpoint's form names it by its FQN.
        by_name: dict[str, Any] = {
            "state": {names[int(index)]: value for index, value in optimizer["state"].items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in optimizer["param_groups"]],
        }
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=by_name,
            options=StateDictOptions(full_state_dict=True),
        )
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        self._offload_optimizer_state()

    def local_state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict(), "generator": self.generator.get_state()}

    def load_local_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
