"""Loading the roles' models: the tokenizer, any Hugging Face causal LM (weights or only its
architecture, for FSDP2 to fill), the model directory staged in shared memory, and what is
applied to a loaded model before training (liger-kernel's kernels, compiled decoder layers).

Kept apart from the forward passes (`token_scores.py`, `value_head.py`): loading needs the
checkpoint on disk and runs once per role, the forwards run every step on whatever was loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

SHM = Path("/dev/shm")


def shm_copy(path: str, root: Path = SHM) -> str:
    """model.use_shm: the model directory copied once per host into shared memory, where every
    role and engine of the host then reads it (host RAM, not the volume). Ranks of one host
    copy concurrently into their own staging dir; the first rename wins, the others drop theirs."""
    source = Path(path).resolve()
    target = root / f"rlkube-model-{source.name}-{hashlib.sha256(str(source).encode()).hexdigest()[:12]}"
    if target.is_dir():
        return str(target)
    staging = target.with_name(f".{target.name}-{os.getpid()}")
    shutil.copytree(source, staging, dirs_exist_ok=True)
    try:
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another rank's copy got there first
    return str(target)


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    if not Path(path).is_dir():
        # Checked first: transformers reports a missing local directory as a malformed hub repo id.
        raise FileNotFoundError(f"tokenizer {path!r}: no such directory (a Hugging Face model directory is needed)")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    path: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, trust_remote_code: bool = False
) -> PreTrainedModel:
    if not (Path(path) / "config.json").exists():
        raise FileNotFoundError(f"model.path {path!r}: no config.json there (a Hugging Face model directory is needed)")
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code
    )
    model.config.use_cache = False  # training forwards never reuse a KV cache
    model.to(device)  # type: ignore[arg-type]  # transformers' decorated .to() confuses mypy
    return model


def causal_lm_skeleton(
    path: str, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False
) -> PreTrainedModel:
    """The architecture of the checkpoint at `path` without its weights: call it under
    `torch.device("meta")` to allocate nothing (workers.training.load_distributed)."""
    config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    config.use_cache = False
    model: PreTrainedModel = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        config, dtype=dtype, trust_remote_code=trust_remote_code
    )
    return model


def apply_liger(model: nn.Module) -> None:
    """model.use_liger (verl's key): liger-kernel's Triton RMSNorm, SwiGLU MLP and rotary embedding
    on this model instance, as verl's use_liger applies them. liger's fused linear cross-entropy and
    its cross-entropy are not used: the log-probs come from `token_scores.chunked_scores` either
    way. liger's rotary patch replaces the function of the model's transformers module, for every
    model of that type in the process."""
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance  # type: ignore[import-not-found]  # noqa: PLC0415
    except ImportError as exc:
        raise RuntimeError("model.useLiger needs the liger-kernel package in the trainer's image") from exc
    _apply_liger_kernel_to_instance(
        model=model, rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False
    )


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's decoder layers (Hugging Face names their classes *DecoderLayer; FSDP2's
    per-layer units keep the suffix), in order."""
    return [module for module in model.modules() if type(module).__name__.endswith("DecoderLayer")]


# Dynamo caches a compiled frame per code object, and every decoder layer runs the same one: its
# guards then hold a few entries per micro-batch shape (static, then dynamic). torch's default (8)
# sends the layers to eager once exceeded, silently; 64 leaves room for packing's varying lengths.
COMPILE_CACHE_SIZE = 64


def compile_decoder_layers(model: nn.Module) -> int:
    """actor/ref/critic.compile_decoder_layers: each decoder layer's forward compiled (lazily, at
    its first call) in place of the eager one. The module's __call__ stays eager, and with it the
    hooks FSDP2 registers on the layer (all-gather before, reshard after) and gradient
    checkpointing's wrapper. Returns how many layers were compiled."""
    import torch._dynamo  # noqa: PLC0415  (only where the setting is on)

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, COMPILE_CACHE_SIZE)
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = torch.compile(layer.forward)  # this instance only: its class keeps the eager one
    return len(layers)
