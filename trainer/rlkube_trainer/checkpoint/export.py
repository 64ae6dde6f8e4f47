"""The final actor as a Hugging Face model directory, written atomically (in an object store:
written locally, then uploaded file by file)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from rlkube_trainer.checkpoint.durable import fsync_tree, replace_dir
from rlkube_trainer.checkpoint.folder import remove_tree
from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath
from rlkube_trainer.checkpoint.volume import writing_to


def export_hf(
    model: Any,
    tokenizer: Any | None,
    path: CheckpointPath,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    also: Callable[[Path], None] | None = None,
) -> CheckpointPath:
    """`save_pretrained` the model (and tokenizer) into `path`, atomically.

    Everything is written into a staging dir next to `path` and renamed into place, so `path`
    is either the previous export or the whole new one, loadable with
    `AutoModelForCausalLM.from_pretrained(path)`. `state_dict` is for sharded (FSDP) models:
    the full state dict gathered on the exporting rank, saved with the unsharded model's config
    (and a LoRA model's merged weights). `also` writes more into the staging dir (the adapter).

    In an object store there is no rename: the export is written on local disk, the old one's
    objects deleted and the new files uploaded, config.json last (a reader that finds it finds
    the weights too; one that reads during the upload may see no model, never a mixed one
    whose config names missing weights). Inside a checkpoint (exportHf: every_save) the
    checkpoint's own manifest and marker cover it.
    """
    if isinstance(path, ObjectPath):
        with tempfile.TemporaryDirectory(prefix="rlkube-export-") as local:
            export_hf(model, tokenizer, Path(local) / path.name, state_dict, also)
            upload_tree(Path(local) / path.name, path)
        return path
    path = Path(path)
    with writing_to(path):
        _export_local(model, tokenizer, path, state_dict, also)
    return path


def _export_local(
    model: Any,
    tokenizer: Any | None,
    path: Path,
    state_dict: Mapping[str, torch.Tensor] | None,
    also: Callable[[Path], None] | None,
) -> None:
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


def upload_tree(local: Path, remote: ObjectPath, last: str = "config.json") -> None:
    """The files under `local` as objects under `remote`, replacing what was there; `last`
    (a file that says the rest is there) uploaded after every other file."""
    remove_tree(remote)
    files = sorted(p for p in local.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.relative_to(local).as_posix() == last)
    for file in files:
        (remote / file.relative_to(local).as_posix()).upload(file)
