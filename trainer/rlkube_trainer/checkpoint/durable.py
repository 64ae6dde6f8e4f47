"""Durable file-system primitives the checkpoint protocol is built from: a file that appears whole
or not at all (``atomic_file``, ``write_atomic``), fsync of a written tree (``fsync_tree``) and a
directory rename that replaces an existing one (``replace_dir``).

Each works on a local path and, where the operation means something there, on an object-store
path (objectstore.ObjectPath), where an object is durable and whole once its upload completes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath


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


def write_atomic(path: CheckpointPath, data: bytes) -> None:
    """`data` at `path`, whole or not at all (a local file durably, an object in one PUT)."""
    if isinstance(path, ObjectPath):
        path.write_bytes(data)  # one PUT: whole or absent
        return
    with atomic_file(path) as f:
        f.write(data)


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
