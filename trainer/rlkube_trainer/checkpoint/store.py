"""Checkpoints that are either complete or invisible, for resume after a crash.

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
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath, locate_like

log = logging.getLogger(__name__)

LATEST = "latest"
MANIFEST = "manifest.json"
COMPLETE = "COMPLETE"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")
_STAGING_DIR = re.compile(r"^\.tmp-step_(\d+)$")
# Keys `commit` writes itself; a caller's manifest may not shadow them.
_RESERVED = frozenset({"format", "step", "time", "unix_time", "files", "sha256"})


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


# --- durable file-system operations -----------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    """Persist a directory's entries (a rename or a new file in it).

    Some file systems (NFS clients, FUSE mounts) refuse fsync on a directory; there the
    server's own rename semantics are all we can get, so the refusal is not an error.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP, errno.EACCES):
            raise
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_tree(root: CheckpointPath) -> None:
    if isinstance(root, ObjectPath):
        return  # an object is durable once its upload has completed
    # Files written by other code (save_pretrained, another process that skipped fsync) are made
    # durable before COMPLETE claims they are there; fsync of an already clean file is cheap.
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            _fsync_file(Path(dirpath) / name)
        _fsync_dir(Path(dirpath))


def _tmp_sibling(path: Path) -> Path:
    # Unique per process and call: two ranks that (wrongly) write the same file never share a tmp.
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def atomic_file(path: CheckpointPath) -> Iterator[BinaryIO]:
    """A file opened for writing that appears at `path` only once the block ends without an
    error, durably: readers see either the old file or the whole new one, never a part.
    In an object store the file is written on local disk (the system's temporary folder) and
    uploaded as one object when the block ends."""
    if isinstance(path, ObjectPath):
        with tempfile.TemporaryDirectory(prefix="rlkube-upload-") as local:
            tmp = Path(local) / path.name
            with open(tmp, "wb") as f:
                yield f
            path.upload(tmp)
        return
    tmp = _tmp_sibling(path)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _write_atomic(path: CheckpointPath, data: bytes) -> None:
    if isinstance(path, ObjectPath):
        path.write_bytes(data)  # one PUT: whole or absent
        return
    with atomic_file(path) as f:
        f.write(data)


def write_atomic(path: CheckpointPath, data: bytes) -> None:
    """`data` at `path`, whole or not at all (a local file durably, an object in one PUT)."""
    _write_atomic(path, data)


def remove_tree(path: CheckpointPath) -> None:
    """Delete a checkpoint dir (or a staging or trash dir): its COMPLETE marker and manifest
    first, so that a deletion cut short never leaves something that looks complete."""
    if isinstance(path, ObjectPath):
        for marker in (COMPLETE, MANIFEST):
            (path / marker).unlink(missing_ok=True)
        path.remove_tree()
        return
    shutil.rmtree(path, ignore_errors=True)


def replace_dir(src: Path, dst: Path) -> None:
    """Rename directory `src` to `dst`, replacing an existing `dst`.

    rename(2) cannot replace a non-empty directory, so an old `dst` is first renamed aside and
    deleted afterwards; between the two renames `dst` does not exist, which readers treat like a
    checkpoint that is not there (they fall back), never like a partial one.
    """
    trash = None
    if dst.exists():
        trash = dst.with_name(f".trash-{dst.name}-{uuid.uuid4().hex[:8]}")
        os.rename(dst, trash)
    os.rename(src, dst)
    _fsync_dir(dst.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


# --- manifest and completeness ----------------------------------------------------------------


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
    listed = _sizes(path)
    for relative, size in files.items():
        try:
            actual = listed[relative] if listed is not None else (path / relative).stat().st_size
        except (OSError, KeyError):
            raise CheckpointError(f"checkpoint {path}: {relative} listed in {MANIFEST} is missing") from None
        if actual != size:
            raise CheckpointError(f"checkpoint {path}: {relative} has {actual} bytes, {MANIFEST} says {size}")
    return Checkpoint(step=int(manifest["step"]), path=path)


@dataclass(frozen=True)
class Written:
    """A file a writer wrote into the staging dir, as the writer saw it."""

    size: int
    sha256: str
    writer: str  # who wrote it, for the error when the coordinator does not see it: "actor rank 1"


def _sizes(path: CheckpointPath) -> dict[str, int] | None:
    """Every object's size under an object-store prefix in one listing (asking object by object
    costs a request each); None for a local dir, where a stat is cheap."""
    return path.files() if isinstance(path, ObjectPath) else None


def written(staging: CheckpointPath, relative: Iterable[str], writer: str) -> dict[str, Written]:
    """What a writer reports after saving `relative` (paths under `staging`)."""
    out = {}
    for name in relative:
        path = staging / name
        out[name] = Written(path.stat().st_size, sha256_of(path), writer)
    return out


def sha256_of(path: CheckpointPath) -> str:
    if isinstance(path, ObjectPath):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
        return digest.hexdigest()
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_checksum(checkpoint: CheckpointPath, relative: str) -> None:
    """The part `relative` of a committed checkpoint has the SHA-256 its writer reported
    (a file changed since, with its size kept: a bad disk, a partial copy); a checkpoint
    without checksums (written before them, or by a test) is not checked."""
    try:
        recorded = json.loads((checkpoint / MANIFEST).read_text()).get("sha256", {}).get(relative)
    except (OSError, ValueError):
        return
    if recorded is not None and sha256_of(checkpoint / relative) != recorded:
        raise CheckpointError(f"checkpoint {checkpoint}: {relative} is not what its writer wrote (SHA-256 differs)")


def check_written(staging: CheckpointPath, expected: Mapping[str, Written]) -> None:
    """Every file the writers reported is in `staging` with the size they wrote, as seen here;
    CheckpointError naming the first writer and file that are not (all of them, listed)."""
    problems = []
    listed = _sizes(staging)
    for relative, record in sorted(expected.items()):
        try:
            size = listed[relative] if listed is not None else (staging / relative).stat().st_size
        except (OSError, KeyError):
            problems.append(f"{record.writer} wrote {relative}, which is not there")
            continue
        if size != record.size:
            problems.append(f"{record.writer} wrote {relative} with {record.size} bytes, {size} are there")
    if problems:
        hint = (
            " (the object store lost or never received them)"
            if isinstance(staging, ObjectPath)
            else ". Every pod that writes checkpoints must mount the same volume at checkpoint.dir "
            "(set checkpoint.volume to a ReadWriteMany volume, or checkpoint.uri to an object store)"
        )
        raise CheckpointError(
            f"checkpoint {staging} is not committed, the previous one stays the latest: " + "; ".join(problems) + hint
        )


def _is_complete(path: CheckpointPath) -> Checkpoint | None:
    try:
        return check_complete(path)
    except CheckpointError as error:
        log.debug("%s", error)
        return None


def _listed_files(staging: CheckpointPath) -> dict[str, int]:
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


@dataclass(frozen=True)
class Retention:
    """How many complete checkpoints to keep: `max_to_keep`, or per part (verl's
    max_actor_ckpt_to_keep / max_critic_ckpt_to_keep) where set. One checkpoint holds every
    part and is resumed whole, so the number kept is the largest limit of the parts it holds:
    no part loses a checkpoint its own limit keeps."""

    max_to_keep: int
    per_part: Mapping[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, limit in {"max_to_keep": self.max_to_keep, **self.per_part}.items():
            if limit is not None and limit < 1:
                raise ValueError(f"checkpoints to keep ({name}) must be at least 1, got {limit}")

    def kept(self, parts: Iterable[str]) -> int:
        limits = [self.per_part.get(part) or self.max_to_keep for part in parts if part in self.per_part]
        return max(limits, default=self.max_to_keep)


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
        files = _listed_files(staging)
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
        _write_atomic(staging / MANIFEST, data)
        fsync_tree(staging)
        # COMPLETE last inside the dir: whoever sees it sees the manifest and the parts too.
        _write_atomic(staging / COMPLETE, b"")
        final = self.root / step_dir_name(step)
        if not self.in_place:
            assert isinstance(staging, Path) and isinstance(final, Path)
            replace_dir(staging, final)
        # The marker only after the rename, so it never names a dir that is not there yet.
        _write_atomic(self.root / LATEST, (final.name + "\n").encode())
        self._prune(keep=final, step=step)
        return final

    def _prune(self, keep: CheckpointPath, step: int) -> None:
        """Delete complete checkpoints beyond the retention and stale staging/trash dirs.

        The one just written always stays, and nothing is deleted unless it checks complete (a
        part lost since the rename): older checkpoints are then all there is to resume from.
        Dirs of newer steps (left by a run that was resumed from an older checkpoint) are not
        "oldest" and are left alone.
        """
        try:
            manifest = check_complete(keep).manifest()
        except CheckpointError as error:
            log.error("not deleting older checkpoints: the new one is not complete: %s", error)
            return
        parts = {relative.split("/")[0] for relative in manifest.get("files", {})}
        kept = self.retention.kept(parts)
        complete = [c for c in self._step_dirs() if c.step <= step and c.path != keep]
        complete.sort(key=lambda c: c.step, reverse=True)
        for old in complete[kept - 1 :]:
            log.info("deleting checkpoint %s (keeping %d)", old.path, kept)
            remove_tree(old.path)
        for entry in self._entries():
            match = _STAGING_DIR.match(entry.name)
            if (match and int(match.group(1)) < step) or entry.name.startswith(".trash-"):
                log.info("deleting stale %s", entry)
                remove_tree(entry)

    # -- reading --

    def _entries(self) -> Iterator[CheckpointPath]:
        if isinstance(self.root, ObjectPath):
            yield from self.root.dirs()
            return
        try:
            yield from (p for p in self.root.iterdir() if p.is_dir())
        except FileNotFoundError:
            return

    def _step_dirs(self) -> list[Checkpoint]:
        """The complete `step_*` dirs, unordered (staging dirs never match)."""
        found = []
        for entry in self._entries():
            if _STEP_DIR.match(entry.name):
                checkpoint = _is_complete(entry)
                if checkpoint is not None:
                    found.append(checkpoint)
        return found

    def checkpoints(self) -> list[Checkpoint]:
        """Every complete checkpoint under the root, oldest first."""
        return sorted(self._step_dirs(), key=lambda c: c.step)

    def latest(self) -> Checkpoint | None:
        """The checkpoint the `latest` marker names if complete, else the newest complete one."""
        marker = self.root / LATEST
        with contextlib.suppress(OSError, UnicodeDecodeError):
            name = marker.read_text().strip()
            # Only a plain step dir name: a corrupt marker must not lead outside the root.
            if _STEP_DIR.match(name):
                checkpoint = _is_complete(self.root / name)
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
            if (path / LATEST).exists() or any(_STEP_DIR.match(p.name) for p in path.glob("step_*")):
                hint = f" (it looks like a checkpoint root; name one of its step_* dirs, e.g. {path}/step_000100)"
            raise CheckpointError(f"{key} path {path} is not a complete checkpoint: {error}{hint}") from error
