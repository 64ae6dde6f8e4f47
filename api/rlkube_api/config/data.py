"""The data section: training and validation rows, prompt and response lengths."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkube_api.base import ApiModel
from rlkube_api.config.common import MAX_BATCH, FilePath


class DataConfig(ApiModel):
    """Training prompts in verl's row format (data_source, prompt, reward_model.ground_truth, extra_info)."""

    train_files: list[FilePath] = Field(
        min_length=1,
        max_length=256,
        description="Parquet, Arrow or JSON-lines files of training rows.",
    )
    val_files: list[FilePath] = Field(
        default_factory=list,
        max_length=256,
        description="Held-out rows scored every trainer.testFreq steps (same format as trainFiles).",
    )
    val_batch_size: int | None = Field(
        None, ge=1, description="Validation prompts per generate call (default: all in one)."
    )
    prompt_key: str = Field("prompt", description="Column holding the chat-message list (or plain text).")
    reward_fn_key: str = Field("data_source", description="Column passed to the reward function as data_source.")
    ground_truth_key: str = Field(
        "reward_model.ground_truth", description="Dotted path of the ground truth inside a row."
    )
    extra_info_key: str = Field("extra_info", description="Column passed to the reward function as extra_info.")
    max_prompt_length: int = Field(512, ge=1, le=1_048_576, description="Longest prompt, in tokens.")
    max_response_length: int = Field(512, ge=1, le=1_048_576, description="Longest response, in tokens.")
    train_batch_size: int = Field(
        256, ge=1, le=MAX_BATCH, description="Prompts per step (each sampled rollout.n times)."
    )
    truncation: Literal["error", "left", "right"] = Field(
        "error",
        description="A prompt longer than maxPromptLength: error stops with the row named; left/right "
        "drop whole tokens from that side.",
    )
    filter_overlong_prompts: bool = Field(
        False, description="Drop prompts longer than maxPromptLength (and report how many) instead."
    )
    apply_chat_template: bool = Field(True, description="Use the tokenizer's chat template when it has one.")
    shuffle: bool = Field(True, description="Shuffle rows each epoch.")
    seed: int = Field(1, description="Seed of the data order.")
