"""The rollout section: sampling and engine settings (where rollout runs is roles.rollout)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkube_api.base import ApiModel
from rlkube_api.config.harness import HarnessConfig
from rlkube_api.config.multi_turn import MultiTurnConfig


class ValidationSampling(ApiModel):
    """How validation samples (verl's rollout.val_kwargs); greedy by default."""

    n: int = Field(
        1, ge=1, le=1024, alias="samplesPerPrompt", description="Samples per validation prompt (best/worst/maj@N)."
    )
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling (-1 = off).")
    do_sample: bool = Field(False, description="Sample; false decodes greedily whatever the temperature.")


class RolloutConfig(ApiModel):
    """Sampling and engine settings (where rollout runs is roles.rollout)."""

    name: Literal["vllm", "hf"] = Field("vllm", description="Engine: vllm, or hf generate as a fallback.")
    # verl's key is `n`; on the wire it is spelled out because Kubernetes' YAML
    # parser reads a bare `n:` key as the boolean false.
    n: int = Field(
        1, ge=1, le=1024, alias="samplesPerPrompt", description="Samples per prompt (grpo and rloo need 2 or more)."
    )
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling (-1 = off).")
    ignore_eos: bool = Field(False, description="Generate maxResponseLength tokens regardless of EOS.")
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="Fraction of GPU memory (host RAM on CPU) vLLM may take."
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="Engine dtype.")
    enforce_eager: bool = Field(False, description="Disable CUDA graphs / compilation.")
    # Unset: the trainer mode's default, filled in by TrainerConfig (a bool once validated).
    free_cache_engine: bool | None = Field(
        None,
        description="Colocated: release the engine's memory while the actor trains. Unset: true, except in "
        "trainer.v1.trainerMode colocate_async, where the engine generates while the actor trains (false).",
    )
    calculate_log_probs: bool = Field(
        False,
        description="Also return the engine's log-probs of sampled tokens and report how far they are from "
        "the actor's (training/rollout_probs_diff_*); costs rollout speed.",
    )
    update_weights_bucket_megabytes: int = Field(
        512,
        ge=1,
        description="Weight sync, in MiB of full tensors: colocated, each bucket is one gather from the "
        "FSDP shards and reaches the engine before the next (its extra GPU memory: about twice this, or "
        "twice the largest tensor); separate, each is one broadcast. verl's default is 2048.",
    )
    enable_prefix_caching: bool = Field(
        True,
        description="vLLM's prefix caching: the samples of a prompt share its prefill. Off saves the "
        "engine's per-step block hashing.",
    )
    max_num_seqs: int | None = Field(
        None, ge=1, description="Most sequences the engine schedules in one step (vLLM's default when unset)."
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Most tokens the engine schedules in one step (vLLM's default when unset)."
    )
    layered_summon: bool = Field(
        False,
        description="Weight sync gathers the policy for the engine at most one decoder layer at a time (each "
        "bucket capped at one layer's full tensors, whatever updateWeightsBucketMegabytes says): the least extra "
        "GPU memory, the most collectives (verl's rollout.layered_summon).",
    )
    val_kwargs: ValidationSampling = Field(
        default_factory=ValidationSampling, description="Sampling during validation."
    )
    multi_turn: MultiTurnConfig = Field(
        default_factory=MultiTurnConfig,
        description="Multi-turn episodes with tool calls, in training and validation alike.",
    )
    harness: HarnessConfig | None = Field(
        None,
        description="An agent harness (a program of the user's, one process per episode) drives the rollout "
        "through an OpenAI-compatible endpoint, in training and validation alike; unset: the trainer generates.",
    )
