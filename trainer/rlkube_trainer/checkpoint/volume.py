"""The volume a run writes to (checkpoints, metrics, exports): a write that fails for lack of
space or quota becomes `StorageFull`, naming the volume (its mount point) and the file, and a
JSON-lines row is appended whole or not at all.

A full volume is its own failure (ExitCode.STORAGE_FULL), not an unexpected error or a lost
rank: restarting the gang at once frees nothing, and the user must be told which volume to
grow or clean. The error is often not an OSError by the time it reaches the driver: torch.save
raises a RuntimeError whose context is the OSError, and a rank's error arrives as Ray's task
error; so the whole chain (`__cause__`, `__context__`, Ray's `cause`) is searched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath

# The errors that mean "no room": the file system is full, or the writer's quota is spent.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class StorageFull(RuntimeError):
    """A write that failed because its volume has no space (or quota) left."""

    def __init__(self, message: str, volume: str = "", path: str = "") -> None:
        super().__init__(message)
        self.volume, self.path = volume, path

    def __reduce__(self) -> tuple[type[StorageFull], tuple[str, str, str]]:
        # Pickled whole (a rank's error crosses to the driver through Ray).
        return (type(self), (str(self), self.volume, self.path))


def _chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and what it wraps: `raise ... from`, the error being handled, Ray's cause."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for inner in (current.__cause__, current.__context__, getattr(current, "cause", None)):
            if isinstance(inner, BaseException):
                todo.append(inner)


def no_space_error(error: BaseException) -> OSError | StorageFull | None:
    """The out-of-space error in `error`'s chain: a StorageFull, or an OSError with ENOSPC or
    EDQUOT; None if the chain holds neither."""
    for current in _chain(error):
        if isinstance(current, StorageFull):
            return current
        if isinstance(current, OSError) and current.errno in NO_SPACE_ERRNOS:
            return current
    return None


def mount_point(path: CheckpointPath | str) -> Path:
    """The mount point of the file system `path` is (or would be) on."""
    current = Path(os.path.abspath(str(path)))
    while not current.exists() and current != current.parent:
        current = current.parent
    while not os.path.ismount(current) and current != current.parent:
        current = current.parent
    return current


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} TiB"


def storage_full(error: OSError | StorageFull, path: CheckpointPath | str) -> StorageFull:
    """The StorageFull for `error` met writing `path`: which volume, how full, which file."""
    if isinstance(error, StorageFull):
        return error
    # An object-store write is staged in the local temporary folder: that is what filled up.
    staged = isinstance(path, ObjectPath)
    volume = mount_point(tempfile.gettempdir() if staged else path)
    room = ""
    with contextlib.suppress(OSError):
        stats = os.statvfs(volume)
        room = f" ({_size(stats.f_bavail * stats.f_frsize)} free of {_size(stats.f_blocks * stats.f_frsize)})"
    what = "disk quota exceeded" if error.errno == errno.EDQUOT else "no space left"
    message = (
        f"{what} on the volume mounted at {volume}{room} writing {path}"
        f"{' (staged there before its upload)' if staged else ''}: {error.strerror or error}; "
        "free space there or grow the volume, then run the job again: it resumes from its last complete checkpoint"
    )
    return StorageFull(message, str(volume), str(path))


@contextlib.contextmanager
def writing_to(path: CheckpointPath | str) -> Iterator[None]:
    """A block that writes to `path`: an out-of-space error in it is raised as StorageFull
    naming the volume and the file (the OSError's own, else `path`); an error that holds a
    StorageFull already passes unchanged."""
    try:
        yield
    except Exception as error:
        found = no_space_error(error)
        if found is None or isinstance(found, StorageFull):
            raise  # not for lack of space, or already named (a rank's, kept with its rank)
        raise storage_full(found, getattr(found, "filename", None) or path) from error


def append_row(path: Path, line: str) -> None:
    """Appends `line` and a newline to `path` whole or not at all: one write to a file opened
    for appending, and on a failure (the volume full mid-row) the file is cut back to its size
    before, so a reader never meets a torn last row. Out of space raises StorageFull."""
    data = (line.rstrip("\n") + "\n").encode()
    with writing_to(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            before = os.fstat(fd).st_size
            try:
                written = os.write(fd, data)
                if written != len(data):
                    # A short write: the file system took part of the row (it is full).
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, before)
                raise
        finally:
            os.close(fd)
