"""A training role's optimizer: AdamW, its learning-rate schedule (verl's warmup and decay), and
its state moved to host memory between updates (fsdpConfig.optimizerOffload)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

from rlkube_api.config import OptimConfig

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
