"""Gradient clipping over parameters that live on different meshes: under tensor parallel with
FSDP2 the split projections are DTensors over (data, tensor) while the embeddings and norms are
over data alone, and torch's clip_grad_norm_ stacks their norms, which DTensor refuses across
meshes. Each mesh's norm is computed as a DTensor and made whole, then they combine."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch
from torch import nn


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """The total 2-norm of the gradients (every rank gets the same), after scaling them to at most
    `max_norm` (torch's clip_grad_norm_)."""
    params = [p for p in parameters if p.grad is not None]
    by_mesh: dict[object, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        assert p.grad is not None
        by_mesh[getattr(p.grad, "device_mesh", None)].append(p.grad)
    norms = []
    for grads in by_mesh.values():
        norm = nn.utils.get_total_norm(grads)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.tensor(0.0)
    coefficient = max_norm / (float(total) + 1e-6)
    if coefficient < 1.0:
        for p in params:
            assert p.grad is not None
            p.grad.mul_(coefficient)  # a Python number: DTensor grads of any mesh take it
    return total
