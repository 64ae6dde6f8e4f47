"""Partial rollouts in the asynchronous schedule (`async_training.partial_rollout`): a weight
push pauses the generation in flight at a step boundary, loads the new weights and resumes it
(verl 0.9.1's CheckpointEngineManager.update_weights: abort, sync, resume), and the batch's
per-token weight versions become verl's `training/off_policy/trajectory_*` metrics.

The samples' splice is `rollout/partial.py`; the engines carry it out
(`rollout/vllm/resumable.py`). Ranks that are Ray actors take the pause and the resume on a
thread of their own while `generate` runs on another (ray_group.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from rlkube_api.config import TrainerConfig
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.loop.async_training.staleness import trajectory_metrics


@runtime_checkable
class Interruptible(Protocol):
    """A rollout whose engines can pause a generation in flight (dispatch.py's rollouts)."""

    def pause_generation(self) -> None: ...

    def resume_generation(self, weight_version: int) -> None: ...


def interruptible_rollout(config: TrainerConfig, rollout: object) -> Interruptible | None:
    """The rollout to pause around weight pushes, or None without partial rollouts."""
    if not config.async_training.partial_rollout:
        return None
    if not isinstance(rollout, Interruptible):
        raise TypeError(f"async_training.partial_rollout: {type(rollout).__name__} cannot pause generation")
    return rollout


def push_into_generation(rollout: Interruptible, sync_weights: Callable[[], int], held: int, pushed: int) -> int:
    """Pause the generation in flight (if any) at a step boundary, push weights, resume with
    them as version `pushed`; on a failed push, resume it at the version still `held` (the
    run ends with the push's error, after the generation finishes)."""
    rollout.pause_generation()
    try:
        synced = sync_weights()
    except BaseException:
        rollout.resume_generation(held)
        raise
    rollout.resume_generation(pushed)
    return synced


def token_version_metrics(batch: TrainBatch, current_version: int, begun: int) -> dict[str, float]:
    """verl's trajectory span and staleness metrics from the weight version of every response
    token (`batch.token_versions`, -1 on padding); a sample with no token counts as generated
    with the version its generation began with."""
    if batch.token_versions is None:
        raise ValueError("the batch has no token_versions")
    real = batch.token_versions >= 0
    has_tokens = real.any(dim=1)
    big = torch.iinfo(torch.long).max
    oldest = torch.where(real, batch.token_versions, big).min(dim=1).values
    newest = torch.where(real, batch.token_versions, -1).max(dim=1).values
    oldest = torch.where(has_tokens, oldest, begun)
    newest = torch.where(has_tokens, newest, begun)
    return trajectory_metrics(current_version, oldest.tolist(), newest.tolist())
