"""The trainer section: loop length, validation, logging, devices and the trainer mode."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.config.asynchronous import TrainerV1Config

Logger = Literal["console", "tensorboard", "mlflow", "wandb"]


def _console_only() -> list[Logger]:
    return ["console"]


class TrainerSection(ApiModel):
    """Loop length, logging and devices."""

    # 0 would be a modulo by zero in the loop; "never" is spelled -1.
    cel_rules = (
        CelRule("self.saveFreq != 0", "saveFreq must be positive, or -1 (only at the end)", ".saveFreq"),
        CelRule("self.testFreq != 0", "testFreq must be positive, or -1 (never)", ".testFreq"),
    )

    total_training_steps: int | None = Field(None, ge=1, description="Steps to run (default: from totalEpochs).")
    total_epochs: int = Field(1, ge=1, description="Epochs over the training data.")
    save_freq: int = Field(-1, ge=-1, description="Checkpoint every N steps (-1: only at the end).")
    test_freq: int = Field(
        -1, ge=-1, description="Validate on data.valFiles every N steps and after the last (-1: never)."
    )
    val_before_train: bool = Field(True, description="Validate before the first step (when valFiles are set).")
    val_only: bool = Field(False, description="Only validate (the initial or resumed model), then stop.")
    log_val_generations: int = Field(
        0,
        ge=0,
        description="Write this many prompt/response/score rows per validation to validation_generations.jsonl.",
    )
    seed: int = Field(42, description="Seed of model init, sampling and dropout.")
    logger: list[Logger] = Field(
        default_factory=_console_only,
        max_length=4,
        description="Where metrics go: console, tensorboard, mlflow ($MLFLOW_TRACKING_URI, else a file store "
        "in the checkpoint directory), wandb (offline unless $WANDB_API_KEY is set).",
    )
    project_name: str = Field("rlkube", description="Groups runs in the loggers.")
    experiment_name: str = Field("default", description="Names this run in the loggers.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto picks cuda when present.")
    nccl_timeout: int = Field(
        300,
        ge=10,
        le=86400,
        description="Seconds a collective (NCCL on GPU, gloo on CPU) waits for its peers before it fails, in the "
        "role groups and the weight-sync group (verl's actor_rollout_ref.nccl_timeout). A dead peer then ends "
        "the run, and the gang restarts, this soon.",
    )
    v1: TrainerV1Config = Field(
        default_factory=TrainerV1Config, description="Trainer mode (sync or asynchronous) and staleness bound."
    )
