"""Masked reductions over ``[batch, response_len]`` tensors and per-group statistics.

``mask`` is 1 on the tokens that count (the response) and 0 elsewhere; masked-out entries never
contribute, even when they hold inf or NaN (log-probs of padding).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

__all__ = [
    "IndexLike",
    "group_ids",
    "group_onehot",
    "group_stats",
    "keep_mixed_groups",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]

IndexLike = Sequence[Hashable] | npt.NDArray[Any] | torch.Tensor


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x*mask`` (over ``dim``, or everything); masked-out entries never contribute, even NaN/inf."""
    # torch.where first: padding may hold inf/NaN (e.g. log-probs of pad tokens) and 0*inf = NaN.
    valid = torch.where(mask.bool(), x, torch.zeros_like(x)) * mask.to(x.dtype)
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(x*mask) / sum(mask)`` (over ``dim``, or everything); 0 where the mask is empty."""
    denom = mask.to(x.dtype)
    denom = denom.sum() if dim is None else denom.sum(dim=dim)
    # Exact division when the mask is non-empty (no +eps as in verl), and 0 rather than NaN when empty.
    safe = torch.where(denom == 0, torch.ones_like(denom), denom)
    return masked_sum(x, mask, dim) / safe


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries; with ``unbiased`` the n/(n-1) Bessel correction (needs n >= 2)."""
    centered = x - masked_mean(x, mask)
    variance = masked_mean(centered**2, mask)
    if unbiased:
        n = float(mask.to(x.dtype).sum().item())
        if n < 2:
            raise ValueError(f"unbiased masked_var needs at least 2 masked-in entries, got {n:g}")
        variance = variance * (n / (n - 1))
    return variance


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)``, masked mean, unbiased var; ``shift_mean=False`` keeps the mean."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) / torch.sqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def group_ids(index: IndexLike, batch_size: int) -> list[Hashable]:
    """Prompt ids as plain hashable Python values, one per row."""
    # Tensor elements hash by identity, so go through tolist() to group by value.
    keys: list[Hashable] = index.tolist() if isinstance(index, torch.Tensor | np.ndarray) else list(index)
    if len(keys) != batch_size:
        raise ValueError(f"index has {len(keys)} entries but the batch has {batch_size} rows")
    return keys


def group_onehot(index: IndexLike, batch_size: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row → group number ``[batch]``, one-hot ``[batch, groups]`` in ``like``'s dtype and device)."""
    keys = group_ids(index, batch_size)
    ids: dict[Hashable, int] = {}
    gid = torch.tensor([ids.setdefault(k, len(ids)) for k in keys], dtype=torch.long, device=like.device)
    # A [batch, groups] one-hot matmul is deterministic, unlike scatter/index_add on GPU.
    onehot = torch.nn.functional.one_hot(gid, num_classes=len(ids)).to(like.dtype)
    return gid, onehot


def group_stats(scores: torch.Tensor, index: IndexLike) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (group size, group mean, unbiased group std) of 1-D ``scores`` grouped by ``index``."""
    gid, onehot = group_onehot(index, scores.shape[0], scores)
    count = onehot.sum(dim=0)
    mean = (scores @ onehot) / count
    sq_dev = ((scores - mean[gid]) ** 2) @ onehot
    std = torch.sqrt(sq_dev / torch.clamp(count - 1, min=1))
    return count[gid], mean[gid], std[gid]


def keep_mixed_groups(metric: Sequence[float], index: IndexLike) -> list[bool]:
    """DAPO's dynamic-sampling filter: per sample, whether its group (samples sharing an
    ``index``) is kept. A group is kept when its metric values differ (population std > 0),
    or when it has a single sample; a group that all scores alike gives a group estimator
    zero advantage everywhere."""
    ids = group_ids(index, len(metric))
    values: dict[Hashable, list[float]] = {}
    for group, value in zip(ids, metric, strict=True):
        values.setdefault(group, []).append(float(value))
    keep = {group: len(v) == 1 or float(np.std(v)) > 0 for group, v in values.items()}
    return [keep[group] for group in ids]
