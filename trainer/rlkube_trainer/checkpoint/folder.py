"""A checkpoint folder: its layout, what makes one complete, and finding and deleting them.

A complete checkpoint is a `step_N/` dir holding a COMPLETE marker, a readable manifest.json and
every file the manifest lists with its recorded size; `.tmp-step_N/` dirs are being written (or
were left by a crash) and the `latest` file names the newest complete one. How the folders are
written and committed is manager.py's.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath

log = logging.getLogger(__name__)

LATEST = "latest"
MANIFEST = "manifest.json"
COMPLETE = "COMPLETE"
STEP_DIR = re.compile(r"^step_(\d+)$")
STAGING_DIR = re.compile(r"^\.tmp-step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: incomplete, missing, or unreadable."""


def step_dir_name(step: int) -> str:
    # Zero-padded so that `ls` sorts like the steps; parsing never relies on the width.
    return f"step_{step:06d}"


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its training step and its directory."""

    step: int
    path: CheckpointPath

    def manifest(self) -> dict[str, Any]:
        return _read_manifest(self.path)

    def file(self, relative: str) -> CheckpointPath:
        """The path of one part, e.g. `checkpoint.file("actor/rank_0.pt")`."""
        return self.path / relative


def _read_manifest(path: CheckpointPath) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint {path}: cannot read {MANIFEST}: {error}") from error
    if not isinstance(manifest, dict) or not isinstance(manifest.get("step"), int):
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} has no integer 'step'")
    return manifest


def check_complete(path: CheckpointPath) -> Checkpoint:
    """The checkpoint at `path`, or CheckpointError saying why it is not a complete one.

    Complete means: the COMPLETE marker, a readable manifest, and every file the manifest lists
    present with its recorded size. The size check catches copies and renames that were not
    atomic (object-store FUSE mounts copy a renamed dir file by file) and files lost since.
    """
    # An object store has no empty prefixes: the COMPLETE marker's absence says it all.
    if not isinstance(path, ObjectPath) and not path.is_dir():
        raise CheckpointError(f"checkpoint {path}: no such directory")
    if not (path / COMPLETE).is_file():
        if isinstance(path, ObjectPath) and not path.is_dir():
            raise CheckpointError(f"checkpoint {path}: no such directory")
        raise CheckpointError(f"checkpoint {path}: incomplete (no {COMPLETE} marker; the save did not finish)")
    manifest = _read_manifest(path)
    files = manifest.get("files", {})
    if not isinstance(files, dict):
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} 'files' is not a mapping")
    listed = object_sizes(path)
    for relative, size in files.items():
        try:
            actual = listed[relative] if listed is not None else (path / relative).stat().st_size
        except (OSError, KeyError):
            raise CheckpointError(f"checkpoint {path}: {relative} listed in {MANIFEST} is missing") from None
        if actual != size:
            raise CheckpointError(f"checkpoint {path}: {relative} has {actual} bytes, {MANIFEST} says {size}")
    return Checkpoint(step=int(manifest["step"]), path=path)


def object_sizes(path: CheckpointPath) -> dict[str, int] | None:
    """Every object's size under an object-store prefix in one listing (asking object by object
    costs a request each); None for a local dir, where a stat is cheap."""
    return path.files() if isinstance(path, ObjectPath) else None


def is_complete(path: CheckpointPath) -> Checkpoint | None:
    """The checkpoint at `path` if complete, else None (why not is logged at debug level)."""
    try:
        return check_complete(path)
    except CheckpointError as error:
        log.debug("%s", error)
        return None


def listed_files(staging: CheckpointPath) -> dict[str, int]:
    """Each file of a checkpoint being committed (relative path: size); `.name.tmp-*` files
    are a writer's unfinished atomic write, not part of the checkpoint."""
    if isinstance(staging, ObjectPath):
        return {
            relative: size
            for relative, size in sorted(staging.files().items())
            if not relative.rsplit("/", 1)[-1].startswith(".")
        }
    return {
        p.relative_to(staging).as_posix(): p.stat().st_size
        for p in sorted(staging.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def remove_tree(path: CheckpointPath) -> None:
    """Delete a checkpoint dir (or a staging or trash dir): its COMPLETE marker and manifest
    first, so that a deletion cut short never leaves something that looks complete."""
    if isinstance(path, ObjectPath):
        for marker in (COMPLETE, MANIFEST):
            (path / marker).unlink(missing_ok=True)
        path.remove_tree()
        return
    shutil.rmtree(path, ignore_errors=True)


def entries(root: CheckpointPath) -> Iterator[CheckpointPath]:
    """The dirs under a checkpoint root: checkpoints, staging and trash dirs (none if the root
    does not exist yet)."""
    if isinstance(root, ObjectPath):
        yield from root.dirs()
        return
    try:
        yield from (p for p in root.iterdir() if p.is_dir())
    except FileNotFoundError:
        return


def complete_checkpoints(root: CheckpointPath) -> list[Checkpoint]:
    """The complete `step_*` dirs under `root`, unordered (staging dirs never match)."""
    found = []
    for entry in entries(root):
        if STEP_DIR.match(entry.name):
            checkpoint = is_complete(entry)
            if checkpoint is not None:
                found.append(checkpoint)
    return found
