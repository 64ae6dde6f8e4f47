"""Rollout engines: generate responses for the trainer and take its weight updates.

Engines are imported lazily by `build_rollout_engine`, so choosing "hf" never imports vLLM (whose
import is slow and changes process-wide state).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rlkube_api.config import TrainerConfig
from rlkube_trainer.rollout import partial
from rlkube_trainer.rollout.base import (
    FinishReason,
    RolloutBatch,
    RolloutEngine,
    RolloutSample,
    SamplingConfig,
)

if TYPE_CHECKING:
    import torch

ENGINE_NAMES = ("vllm", "hf")

__all__ = [
    "ENGINE_NAMES",
    "FinishReason",
    "RolloutBatch",
    "RolloutEngine",
    "RolloutSample",
    "SamplingConfig",
    "build_engine",
    "build_rollout_engine",
    "partial",
]


def build_rollout_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Start the rollout engine `name` ("vllm" or "hf"); kwargs go to its constructor.

    See `VLLMRolloutEngine` and `HFRolloutEngine` for the arguments each takes.
    """
    # Imported here, not at the top: importing vllm is slow and sets process-wide state.
    if name == "vllm":
        from rlkube_trainer.rollout.vllm.engine import VLLMRolloutEngine  # noqa: PLC0415

        return VLLMRolloutEngine(**kwargs)
    if name == "hf":
        from rlkube_trainer.rollout.hf_engine import HFRolloutEngine  # noqa: PLC0415

        return HFRolloutEngine(**kwargs)
    raise ValueError(f"unknown rollout engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")


def build_engine(config: TrainerConfig, device: torch.device, tensor_parallel_size: int = 1) -> RolloutEngine:
    """The rollout engine a trainer config asks for, on `device` (the driver's in-process
    engine, a colocated actor rank's, or a separate rollout worker's). With
    `tensor_parallel_size` > 1 this rank is one of the engine's ranks: every rank of the
    engine calls this, on an initialised torch.distributed group whose consecutive ranks
    form the engines (vLLM's external launcher), and then calls generate with the same prompts."""
    name, arguments = engine_arguments(config, device, tensor_parallel_size)
    return build_rollout_engine(name, **arguments)


def engine_arguments(
    config: TrainerConfig, device: torch.device, tensor_parallel_size: int = 1
) -> tuple[str, dict[str, Any]]:
    """The engine `build_engine` starts and its constructor's arguments, without starting it
    (the effective settings report them; workers/settings.py)."""
    rollout = config.rollout
    on_cpu = device.type == "cpu"
    dtype = rollout.dtype if rollout.dtype != "auto" else ("float32" if on_cpu else "bfloat16")
    common = {"model_path": config.model.path, "device": device.type, "dtype": dtype}
    if rollout.name == "hf":
        if tensor_parallel_size > 1:
            raise ValueError(
                f"roles.rollout.tensorParallelSize is {tensor_parallel_size}, but rollout.name 'hf' runs "
                "one engine per process: use the vllm engine, or tensorParallelSize 1"
            )
        return "hf", common
    parallel: dict[str, Any] = {}
    if tensor_parallel_size > 1:
        parallel = {"tensor_parallel_size": tensor_parallel_size, "distributed_executor_backend": "external_launcher"}
    kv_cache: dict[str, int] = {}
    if on_cpu:
        # On CPU vLLM reads gpu_memory_utilization against free RAM minus this whole
        # process; a fixed KV budget (the same fraction of total RAM) is predictable.
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        kv_cache["kv_cache_memory_bytes"] = int(rollout.gpu_memory_utilization * total)
    return "vllm", dict(
        **common,
        **kv_cache,
        **parallel,
        seed=config.trainer.seed,
        # One seed per generate call (the step's), not one per request: vLLM then samples the
        # whole batch with one kernel per decode step instead of one per seeded request (-1.7 ms
        # of an 18.8 ms step at 512 sequences on an H200, docs/benchmarks.md). A step still
        # samples the same on a rerun or resume: its engines get the same prompts, split the
        # same way, with the same seed.
        seed_mode="batch",
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        max_model_len=config.data.max_prompt_length + config.data.max_response_length,
        enforce_eager=rollout.enforce_eager or on_cpu,
        enable_sleep_mode=bool(rollout.free_cache_engine) and not on_cpu,
        enable_prefix_caching=rollout.enable_prefix_caching,
        max_num_seqs=rollout.max_num_seqs,
        max_num_batched_tokens=rollout.max_num_batched_tokens,
        partial_rollout=config.async_training.partial_rollout,
    )
