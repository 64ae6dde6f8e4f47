"""The final actor as a Hugging Face model directory, written atomically."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from rlkube_trainer.checkpoint.store import fsync_tree, replace_dir


def export_hf(
    model: Any,
    tokenizer: Any | None,
    path: Path,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    also: Callable[[Path], None] | None = None,
) -> Path:
    """`save_pretrained` the model (and tokenizer) into `path`, atomically.

    Everything is written into a staging dir next to `path` and renamed into place, so `path`
    is either the previous export or the whole new one, loadable with
    `AutoModelForCausalLM.from_pretrained(path)`. `state_dict` is for sharded (FSDP) models:
    the full state dict gathered on the exporting rank, saved with the unsharded model's config
    (and a LoRA model's merged weights). `also` writes more into the staging dir (the adapter).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".tmp-{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        staging.mkdir()
        kwargs: dict[str, Any] = {"safe_serialization": True}
        if state_dict is not None:
            kwargs["state_dict"] = dict(state_dict)
        model.save_pretrained(staging, **kwargs)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if also is not None:
            also(staging)
        fsync_tree(staging)
        replace_dir(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path
