"""Images imported once and shared by every real node: a containerd root, cached by its images.

`ctr images import` of the trainer image takes about 155 s of a 2-core machine per node (a
3.7 GB archive verified, copied and unpacked into about 7.5 GB of files), and every test
session and demo started its nodes with it. Instead the archives are imported once into a
store, a containerd root kept in the cache and keyed by the archives (whose names carry their
own inputs' hash) and containerd's version; a node's root starts as hard links to the store's
files (`cp --link`: seconds, no space). That is safe because containerd never writes an
imported blob or an unpacked layer in place: a container writes to an overlay upper dir of
its own, a new blob or snapshot gets a new file in the node's own directories. Only the two
bolt databases are written in place, so each node gets copies of those.

A store whose archives are gone (`images._drop_superseded` removes an image's old archives) is
deleted when the next store is made, so the cache holds about one trainer image's unpacked
files for each set of images in use.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rlkube_e2e import processes
from rlkube_e2e.binaries import cache_dir
from rlkube_e2e.components import Component
from rlkube_e2e.errors import ClusterError
from rlkube_e2e.polling import WaitTimedOut, poll_until

# containerd's CRI plugin keeps the kubelet's images in this namespace.
K8S_NAMESPACE = "k8s.io"
# The files containerd writes in place: every node gets its own copy.
DATABASES = ("io.containerd.metadata.v1.bolt/meta.db", "io.containerd.snapshotter.v1.overlayfs/metadata.db")
# Bump when the store's layout or making changes, so old stores are not used.
STORE_FORMAT = "1"
_SOCKET = "/run/containerd/containerd.sock"  # in the builder's own mount namespace
_ARCHIVES = "archives.txt"


class ImageStoreError(ClusterError):
    """An image could not be imported into the store; the message names it and the log."""


def stores_dir() -> Path:
    return cache_dir() / "node-images"


def store_key(archives: tuple[Path, ...], containerd_version: str) -> str:
    text = "\n".join([STORE_FORMAT, containerd_version, *sorted(a.name for a in archives)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def containerd_version(containerd: Path) -> str:
    result = subprocess.run([str(containerd), "--version"], capture_output=True, text=True, check=True)
    return result.stdout.strip()


def ensure_store(archives: tuple[Path, ...], containerd: Path, ctr: Path, log: Callable[[str], None] = print) -> Path:
    """The containerd root holding `archives` in namespace k8s.io, imported now if no store
    holds them yet. Returns the root, for `seed_root`."""
    for archive in archives:
        if not archive.is_file():
            raise ImageStoreError(f"image archive {archive} not found; run `make images`")
    store = stores_dir() / store_key(archives, containerd_version(containerd))
    with _locked(stores_dir() / ".lock"):
        if (store / _ARCHIVES).is_file():
            return store / "root"
        _prune(keep=store)
        started = time.monotonic()
        log(f"node image store: importing {', '.join(a.name for a in archives)} once (minutes for a trainer image)")
        _build(store, archives, containerd, ctr, log)
        log(f"node image store: {store} made in {time.monotonic() - started:.0f} s")
    return store / "root"


def seed_root(store_root: Path, root: Path) -> None:
    """A node's containerd root as hard links to the store's files, databases copied."""
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["cp", "-a", "--link", str(store_root), str(root)], capture_output=True, check=False)
    if result.returncode != 0:
        # Another filesystem than the cache's: a full copy (slower, the same result).
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["cp", "-a", str(store_root), str(root)], check=True)
    for database in DATABASES:
        linked = root / database
        if linked.exists():
            copied = linked.with_name(linked.name + ".copy")
            shutil.copy2(linked, copied)
            os.replace(copied, linked)  # the node's own inode from now on


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder at a time: two test sessions starting together share the import."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _prune(keep: Path) -> None:
    """Remove stores whose archives are no longer all present (superseded images), and
    half-made ones (a builder that died)."""
    for store in stores_dir().iterdir():
        if not store.is_dir() or store == keep:
            continue
        listed = store / _ARCHIVES
        if not listed.is_file() or not all(Path(line).is_file() for line in listed.read_text().splitlines()):
            shutil.rmtree(store, ignore_errors=True)


def _build(store: Path, archives: tuple[Path, ...], containerd: Path, ctr: Path, log: Callable[[str], None]) -> None:
    work = store.with_name(store.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    for directory in ("root", "state", "run", "logs"):
        (work / directory).mkdir(parents=True)
    config = work / "config.toml"
    config.write_text(_config(work))
    # A mount namespace of its own, its /run private: the layers' unpack mounts and the socket
    # vanish with the process. No CRI plugin: nothing here runs pods (a node's CRI plugin
    # finds the images in namespace k8s.io when it starts).
    setup = f'mount --bind {work / "run"} /run && exec "$@"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", setup, "rlkube-store"]
    component = Component("containerd", Path(argv[0]), [*argv[1:], str(containerd), f"--config={config}"])
    handle = processes.spawn(component, work / "logs" / "containerd.log", work, die_with_parent=True)
    enter = ["nsenter", f"--target={handle.pid}", "--mount", "--", str(ctr), f"--address={_SOCKET}"]
    try:
        _wait_serving(enter, handle, work)
        for archive in archives:
            log(f"  imported {archive.name} in {import_archive(enter, archive):.1f} s")
    finally:
        processes.stop(handle.pid, str(containerd), handle, timeout=30)
    shutil.rmtree(work / "state")
    shutil.rmtree(work / "run")
    (work / _ARCHIVES).write_text("".join(f"{a}\n" for a in archives))
    shutil.rmtree(store, ignore_errors=True)
    work.rename(store)


def import_archive(ctr: list[str], archive: Path) -> float:
    """`ctr images import` of an OCI archive into namespace k8s.io through the command line
    `ctr` (which says how to reach that containerd); returns the seconds it took."""
    started = time.monotonic()
    result = subprocess.run(
        [*ctr, "-n", K8S_NAMESPACE, "images", "import", str(archive)],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if result.returncode != 0:
        raise ImageStoreError(f"importing {archive} failed: {result.stderr.strip()[-400:]}")
    return time.monotonic() - started


def _wait_serving(enter: list[str], handle: subprocess.Popen[bytes], work: Path, timeout: float = 60.0) -> None:
    """Until `ctr version` answers. A look that times out (a busy machine) is "not yet"; the
    store's containerd exiting ends the wait at once."""

    def serving() -> bool:
        code = handle.poll()
        if code is not None:
            line = processes.log_error(work / "logs" / "containerd.log")
            raise ImageStoreError(f"the node image store's containerd exited with code {code}: {line}")
        return subprocess.run([*enter, "version"], capture_output=True, check=False, timeout=10).returncode == 0

    try:
        poll_until(serving, "the node image store's containerd to serve", timeout=timeout)
    except WaitTimedOut as error:
        raise ImageStoreError(f"{error}; log in {work / 'logs'}") from None


def _config(work: Path) -> str:
    return "\n".join(
        [
            "version = 2",
            f'root = "{work / "root"}"',
            f'state = "{work / "state"}"',
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
            "",
            "[grpc]",
            f'  address = "{_SOCKET}"',
            "",
            "[ttrpc]",
            f'  address = "{_SOCKET}.ttrpc"',
            "",
        ]
    )
