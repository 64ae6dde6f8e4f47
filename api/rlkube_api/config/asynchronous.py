"""trainer.v1 (sync or one-step-off asynchronous training, the staleness bound) and
async_training (partial rollouts)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkube_api.base import ApiModel


class ColocateAsyncConfig(ApiModel):
    """trainer.v1.colocate_async (verl 0.9.1)."""

    # verl allows fractional warmups (1.5 batches); the one-step-off schedule generates exactly one
    # batch ahead, so only 1 is accepted (the bounds refuse others by this field's name).
    num_warmup_batches: float = Field(
        1.0, ge=1, le=1, description="Batches generated before the first update; only 1 is supported."
    )


class SeparateAsyncConfig(ApiModel):
    """trainer.v1.separate_async (verl 0.9.1)."""

    num_warmup_batches: float = Field(
        1.0, ge=1, le=1, description="Batches generated before the first update; only 1 is supported."
    )
    parameter_sync_step: int = Field(
        4,
        ge=1,
        description="Updates between weight pushes into the rollout engines (rlkube: a push every N "
        "full-batch updates, or earlier when the staleness bound needs it; verl splits one global step "
        "into N local updates).",
    )


class SamplerConfig(ApiModel):
    """trainer.v1.sampler: the staleness bound of asynchronous modes (verl 0.9.1; no effect in sync)."""

    max_off_policy_threshold: int | None = Field(
        8,
        ge=1,
        description="Most weight versions a trained sample may lag the actor by (span = version trained "
        "at - version generated with + 1); null: no bound.",
    )
    max_off_policy_strategy: Literal["drop", "wait"] = Field(
        "drop",
        description="drop: discard samples past the bound (training/off_policy/evicted_samples); wait: "
        "delay generation so none exceeds it.",
    )


class AsyncTrainingConfig(ApiModel):
    """async_training (verl 0.9.1's fully-async recipe): of its keys rlkube reads partial_rollout;
    the others are refused by name by `rlkube-trainer convert`."""

    partial_rollout: bool = Field(
        False,
        description="Partial rollouts: a weight push interrupts the generation in flight at a step boundary; "
        "unfinished samples resume from their tokens with the new weights, each token recording its weight "
        "version. Needs an asynchronous trainer.v1.trainerMode, rollout.name vllm, no rollout.multiTurn and, "
        "with the rollout colocated, roles.rollout.tensorParallelSize 1. verl: on in its v1 async modes, "
        "default true in its fully-async recipe; rlkube: off by default.",
    )


class TrainerV1Config(ApiModel):
    """verl 0.9.1's trainer.v1: synchronous or one-step-off asynchronous training."""

    trainer_mode: Literal["sync", "colocate_async", "separate_async"] = Field(
        "sync",
        description="sync: generate then update; colocate_async: the next batch generates in the actor's "
        "engine while the actor updates; separate_async: the same with separate rollout pods.",
    )
    colocate_async: ColocateAsyncConfig = Field(default_factory=ColocateAsyncConfig, description="colocate_async.")
    separate_async: SeparateAsyncConfig = Field(default_factory=SeparateAsyncConfig, description="separate_async.")
    sampler: SamplerConfig = Field(default_factory=SamplerConfig, description="Staleness bound (async modes).")
