"""Checkpoint roots in an object store (`checkpoint.uri: s3://bucket/prefix`, and gs://, az://),
through obstore's fsspec filesystem,, behind the few pathlib methods the checkpoint modules use.

An object store has no directories and no rename: a "directory" is a key prefix, and an
object appears whole when its upload completes (one PUT, or the completion of a multipart
upload) or not at all. manager.py therefore writes a checkpoint's parts in place under
`step_N/` and its manifest and COMPLETE marker last; a prefix without them is never resumed
from. `ObjectPath` gives the store the same calls it makes on a local `Path` (`/`, `name`,
`is_file`, `stat().st_size`, `read_text`, `iterdir`, `glob`, ...), so the commit and
verification logic is one code for both.

Credentials come from the environment, as each backend reads it (for S3: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION; in a cluster from the Secret that
`checkpoint.credentialsSecret` names); `checkpoint.endpointUrl` points S3 at an S3-compatible
server.
"""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

import fsspec
from fsspec import AbstractFileSystem
from obstore.fsspec import SUPPORTED_PROTOCOLS, register

# Backends this trainer knows how to point at a server of its own (endpointUrl).
S3_PROTOCOLS = ("s3", "s3a")


class ObjectStoreError(RuntimeError):
    """An object-store location that cannot be used (no backend for its scheme, bad URL)."""


def is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def storage_options(url: str, endpoint_url: str | None) -> dict[str, Any]:
    """The fsspec filesystem's options for `url` (obstore's FsspecStore): for S3, the server's
    address where given; credentials and region come from the environment."""
    protocol = url.split("://", 1)[0]
    options: dict[str, Any] = {}
    if protocol in S3_PROTOCOLS and endpoint_url:
        options["config"] = {"endpoint": endpoint_url}
        if endpoint_url.startswith("http://"):
            options["client_options"] = {"allow_http": True}
    return options


_REGISTERED: set[str] = set()


def filesystem(url: str, options: Mapping[str, Any]) -> AbstractFileSystem:
    """obstore's fsspec filesystem for `url`'s scheme, registered with fsspec so that torch's
    fsspec checkpoint writer (sharded state) opens the same one."""
    protocol = url.split("://", 1)[0]
    if protocol not in SUPPORTED_PROTOCOLS or protocol in ("file", "memory", "http", "https"):
        raise ObjectStoreError(f"checkpoint location {url}: no object-store backend for {protocol}://")
    if protocol not in _REGISTERED:  # once: each registration makes a new class (no instance reuse)
        register(protocol)
        _REGISTERED.add(protocol)
    fs: AbstractFileSystem = fsspec.filesystem(protocol, **options)
    return fs


@dataclass(frozen=True)
class _Stat:
    st_size: int


class ObjectPath:
    """A key or key prefix in an object store, with the pathlib calls the checkpoint modules make."""

    def __init__(
        self, url: str, options: Mapping[str, Any] | None = None, fs: AbstractFileSystem | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.options: dict[str, Any] = dict(options or {})
        self.fs = fs if fs is not None else filesystem(self.url, self.options)
        self.protocol, self.key = self.url.split("://", 1)

    # -- pure path operations --

    def _at(self, key: str) -> ObjectPath:
        return ObjectPath(f"{self.protocol}://{key}", self.options, self.fs)

    def __truediv__(self, name: str) -> ObjectPath:
        return self._at(posixpath.join(self.key, name))

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"ObjectPath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __lt__(self, other: ObjectPath) -> bool:
        return self.url < other.url

    @property
    def name(self) -> str:
        return posixpath.basename(self.key)

    @property
    def parent(self) -> ObjectPath:
        return self._at(posixpath.dirname(self.key))

    def relative_to(self, other: ObjectPath) -> PurePosixPath:
        return PurePosixPath(self.key).relative_to(other.key)

    def is_absolute(self) -> bool:
        return True

    def with_name(self, name: str) -> ObjectPath:
        return self.parent / name

    # -- reading --

    def exists(self) -> bool:
        return bool(self.fs.exists(self.key))

    def is_file(self) -> bool:
        return bool(self.fs.isfile(self.key))

    def is_dir(self) -> bool:
        return bool(self.fs.isdir(self.key))

    def stat(self) -> _Stat:
        # FileNotFoundError (an OSError) where there is no such object, as Path.stat.
        return _Stat(int(self.fs.size(self.key)))

    def read_bytes(self) -> bytes:
        data: bytes = self.fs.cat_file(self.key)
        return data

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def open(self, mode: str = "rb") -> IO[bytes]:
        handle: IO[bytes] = self.fs.open(self.key, mode)
        return handle

    def iterdir(self) -> Iterator[ObjectPath]:
        try:
            names = self.fs.ls(self.key, detail=False)
        except FileNotFoundError:
            return
        for key in names:
            if key.rstrip("/") != self.key:
                yield self._at(key.rstrip("/"))

    def dirs(self) -> Iterator[ObjectPath]:
        """The sub-prefixes ("directories") right under this one, in one listing."""
        try:
            entries = self.fs.ls(self.key, detail=True)
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.get("type") == "directory":
                yield self._at(entry["name"].rstrip("/"))

    def files(self) -> dict[str, int]:
        """Every object under this prefix: its key relative to it, and its size (one listing)."""
        found = self.fs.find(self.key, detail=True)
        prefix = self.key + "/"
        return {
            key[len(prefix) :]: int(info["size"])
            for key, info in found.items()
            if key.startswith(prefix) and info.get("type") != "directory"
        }

    def glob(self, pattern: str) -> Iterator[ObjectPath]:
        for key in self.fs.glob(posixpath.join(self.key, pattern)):
            yield self._at(key.rstrip("/"))

    # -- writing --

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to create: a prefix exists once an object is under it."""

    def write_bytes(self, data: bytes) -> None:
        """One PUT: the object is the whole of `data` or is not there."""
        self.fs.pipe_file(self.key, data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def upload(self, local: Path) -> None:
        """A local file as this object, whole or not at all (a multipart upload is completed
        only after its last part)."""
        self.fs.put_file(str(local), self.key)

    def download(self, local: Path) -> None:
        self.fs.get_file(self.key, str(local))

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def remove_tree(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.key, recursive=True)


# A checkpoint location: a local folder (a mounted volume) or an object-store prefix.
CheckpointPath = Path | ObjectPath


def relative(path: CheckpointPath, root: CheckpointPath) -> str:
    """`path` relative to `root` (both local, or both in the same object store), POSIX style."""
    if isinstance(path, ObjectPath) and isinstance(root, ObjectPath):
        return path.relative_to(root).as_posix()
    if isinstance(path, Path) and isinstance(root, Path):
        return path.relative_to(root).as_posix()
    raise ValueError(f"{path} is not under {root}")


def locate(location: str | Path, endpoint_url: str | None = None) -> CheckpointPath:
    """`location` as the store's path type: a URL with a scheme is an object-store prefix,
    anything else a local path."""
    text = str(location)
    if is_url(text):
        return ObjectPath(text, storage_options(text, endpoint_url))
    return Path(text.removeprefix("file://"))


def locate_like(location: str, like: CheckpointPath) -> CheckpointPath:
    """`location` (e.g. resumeFrom) with the same server and options as `like`."""
    if is_url(location) and isinstance(like, ObjectPath):
        return ObjectPath(location, like.options)
    return locate(location)
