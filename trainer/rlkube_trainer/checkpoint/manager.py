"""Checkpoints that are either complete or invisible, for resume after a crash: the folder
protocol, run by CheckpointManager.

Layout under the checkpoint root (`checkpoint.dir`, in a cluster a volume mounted at the
same path in every pod)::

    root/
      latest                 "step_000040": written last, atomically, after the rename
      step_000020/           complete checkpoints: manifest.json + COMPLETE + the parts
      step_000040/
        actor/rank_0.pt      one file per writer (actor ranks, critic ranks, the driver)
        critic/rank_0.pt
        driver.pt
        manifest.json
        COMPLETE
      .tmp-step_000060/      a checkpoint being written (or left by a crash): never resumed from

The protocol, with one coordinator (the driver) and any number of writers:

1. the coordinator calls `staging(step)`, which creates an empty `.tmp-step_N/`, and hands its
   path to the writers (the path is the same in every pod);
2. each writer saves its own file(s) with `save_torch` (each file atomic and fsynced) and
   reports back what it wrote (`written`: each file's size and SHA-256);
3. once all writers are done the coordinator calls `commit(step, manifest, expected)`: every file
   a writer reported must be there with its size, seen from the coordinator (a writer whose pod
   does not mount the same volume wrote into its own file system: the commit fails naming the
   writer and the file, and the previous checkpoint stays the latest); then manifest.json (every
   file's size, the writers' checksums) and COMPLETE go into the staging dir, everything is
   fsynced, the dir is
   renamed to `step_N/` and only then the `latest` marker is replaced; old checkpoints beyond
   the retention (`Retention`) and stale staging dirs are deleted last, and only once the new
   checkpoint checks complete: the only complete checkpoint is never deleted.

A crash anywhere before the rename leaves only a `.tmp-*` dir, which nothing resumes from; a
crash between the rename and the marker leaves the marker at the previous checkpoint, which is
still complete (deletion comes after the marker). `latest()` trusts the marker only if the dir
it names is complete and otherwise falls back to the newest complete `step_*` dir.

In an object store (`checkpoint.uri`, objectstore.py) there is no rename: the writers write
their parts straight under `step_N/`, the coordinator checks them (the same `check_written`)
and writes manifest.json, then COMPLETE, then `latest`. Each object appears whole or not at
all, so a save cut anywhere (a crash, the server gone) leaves a `step_N/` without COMPLETE,
which nothing resumes from; the next save of that step deletes it first. Deleting a checkpoint
deletes its COMPLETE marker first, so a half-deleted one is never taken for complete.

Only the coordinator may call `staging` and `commit`; writers only write below the path they
were given. Two coordinators on one root are not supported (the operator runs one driver).

The pieces the protocol is built from live beside it: the atomic, fsynced writes in durable.py,
what a checkpoint folder holds and when it is complete in folder.py, the writers' reports and
checksums in integrity.py, and what is kept in retention.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlkube_trainer.checkpoint.durable import fsync_tree, replace_dir, write_atomic
from rlkube_trainer.checkpoint.folder import (
    COMPLETE,
    LATEST,
    MANIFEST,
    STEP_DIR,
    Checkpoint,
    CheckpointError,
    check_complete,
    complete_checkpoints,
    is_complete,
    listed_files,
    remove_tree,
    step_dir_name,
)
from rlkube_trainer.checkpoint.integrity import Written, check_written
from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath, locate_like
from rlkube_trainer.checkpoint.retention import Retention, prune

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# Keys `commit` writes itself; a caller's manifest may not shadow them.
_RESERVED = frozenset({"format", "step", "time", "unix_time", "files", "sha256"})


class CheckpointManager:
    """Writes, finds and prunes the checkpoints under one root: a local directory, or an
    object-store prefix (objectstore.ObjectPath)."""

    def __init__(self, root: CheckpointPath | str, max_to_keep: int | Retention) -> None:
        self.root: CheckpointPath = root if isinstance(root, ObjectPath) else Path(root)
        self.retention = max_to_keep if isinstance(max_to_keep, Retention) else Retention(max_to_keep)
        # No rename in an object store: a checkpoint is written in place, its marker last.
        self.in_place = isinstance(self.root, ObjectPath)

    # -- writing --

    def staging_path(self, step: int) -> CheckpointPath:
        """Where step `step` is being written; no side effects (writers may call this)."""
        if self.in_place:
            return self.root / step_dir_name(step)
        return self.root / f".tmp-{step_dir_name(step)}"

    def staging(self, step: int) -> CheckpointPath:
        """An empty staging dir for step `step`, for the coordinator to hand to the writers.

        A dir left by an earlier attempt at the same step is removed first: its files may be from
        a different trajectory (the run crashed and resumed from an older checkpoint). In an object
        store that is the step's own prefix, complete or not: its marker goes first.
        """
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        path = self.staging_path(step)
        if isinstance(path, ObjectPath):
            remove_tree(path)
            return path
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def commit(
        self, step: int, manifest: Mapping[str, Any] | None = None, expected: Mapping[str, Written] | None = None
    ) -> CheckpointPath:
        """Seal step `step`'s staging dir as a complete checkpoint and point `latest` at it.

        `manifest` is the caller's description (parts written, config, metrics), stored in
        manifest.json next to the step, the time and each file's size. `expected`: what the
        writers reported (`written`), checked to be there first (`check_written`) and their
        checksums kept in the manifest. Call only after every writer has finished.
        """
        staging = self.staging_path(step)
        if not self.in_place and not staging.is_dir():
            raise CheckpointError(f"commit of step {step}: no staging dir {staging} (call staging() first)")
        expected = expected or {}
        check_written(staging, expected)
        extra = dict(manifest or {})
        shadowed = _RESERVED & extra.keys()
        if shadowed:
            raise ValueError(f"manifest keys {sorted(shadowed)} are reserved")
        for leftover in (staging / COMPLETE, staging / MANIFEST):
            leftover.unlink(missing_ok=True)
        files = listed_files(staging)
        now = time.time()
        content = {
            "format": FORMAT_VERSION,
            "step": step,
            "time": datetime.fromtimestamp(now, UTC).isoformat(),
            "unix_time": now,
            "files": files,
            "sha256": {relative: record.sha256 for relative, record in sorted(expected.items())},
            **extra,
        }
        # Serialise before touching anything, so a non-JSON manifest fails without side effects.
        data = json.dumps(content, indent=2, sort_keys=True).encode()
        write_atomic(staging / MANIFEST, data)
        fsync_tree(staging)
        # COMPLETE last inside the dir: whoever sees it sees the manifest and the parts too.
        write_atomic(staging / COMPLETE, b"")
        final = self.root / step_dir_name(step)
        if not self.in_place:
            assert isinstance(staging, Path) and isinstance(final, Path)
            replace_dir(staging, final)
        # The marker only after the rename, so it never names a dir that is not there yet.
        write_atomic(self.root / LATEST, (final.name + "\n").encode())
        prune(self.root, self.retention, keep=final, step=step)
        return final

    # -- reading --

    def checkpoints(self) -> list[Checkpoint]:
        """Every complete checkpoint under the root, oldest first."""
        return sorted(complete_checkpoints(self.root), key=lambda c: c.step)

    def latest(self) -> Checkpoint | None:
        """The checkpoint the `latest` marker names if complete, else the newest complete one."""
        marker = self.root / LATEST
        with contextlib.suppress(OSError, UnicodeDecodeError):
            name = marker.read_text().strip()
            # Only a plain step dir name: a corrupt marker must not lead outside the root.
            if STEP_DIR.match(name):
                checkpoint = is_complete(self.root / name)
                if checkpoint is not None:
                    return checkpoint
            log.warning("checkpoint marker %s names %r, not a complete checkpoint; using the newest one", marker, name)
        complete = self.checkpoints()
        return complete[-1] if complete else None

    def resolve(self, resume: str, resume_from: str | None = None) -> Checkpoint | None:
        """The checkpoint `checkpoint.resume` asks for: None to start fresh.

        "disable" never resumes, "auto" resumes from latest() if there is one, else from
        `resume_from` (another run's checkpoint, or its root's latest) if given; an absolute path
        must be a complete checkpoint (an explicit request that cannot be honoured is an error,
        not a silent fresh start).
        """
        if resume == "disable":
            return None
        if resume == "auto":
            own = self.latest()
            if own is not None or resume_from is None:
                return own
            # A checkpoint root: its latest complete checkpoint (a step dir holds no step dirs).
            seed = CheckpointManager(locate_like(resume_from, self.root), self.retention).latest()
            return seed if seed is not None else self._explicit(resume_from, "resumeFrom")
        return self._explicit(resume, "resume")

    def _explicit(self, resume: str, key: str) -> Checkpoint:
        path = locate_like(resume, self.root)
        if not path.is_absolute():
            raise CheckpointError(
                f"{key} {resume!r}: must be 'auto', 'disable', an absolute checkpoint path or an object-store URL"
            )
        try:
            return check_complete(path)
        except CheckpointError as error:
            hint = ""
            if (path / LATEST).exists() or any(STEP_DIR.match(p.name) for p in path.glob("step_*")):
                hint = f" (it looks like a checkpoint root; name one of its step_* dirs, e.g. {path}/step_000100)"
            raise CheckpointError(f"{key} path {path} is not a complete checkpoint: {error}{hint}") from error
