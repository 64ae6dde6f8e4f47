"""A container's root file system, built inside its private mount namespace.

The root is a tmpfs that mirrors the host's top-level entries through bind
mounts (so the project's virtualenv, /usr and /work look as on the host), with
the pod's own /tmp, /dev/shm, /etc/hosts, /etc/hostname and /etc/resolv.conf and
its volumes mounted on top. A mount target that does not exist on the host (say
/etc/rlkube or /rlkube/checkpoints) is made without touching the host: the
nearest existing directory above it is "exploded", i.e. replaced in this
namespace by a tmpfs whose entries are bind mounts of the original entries, and
the missing directories are created in that tmpfs. Everything here runs in a
mount namespace with private propagation, so nothing leaks to the host.

Runs in the launcher process (see launcher.py): standard library only.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from rlkube_e2e.procnode import linux

# Entries of the host's / that the root does not mirror: /proc is mounted fresh
# for the container's PID namespace and /tmp is the pod's own.
NOT_MIRRORED = frozenset({"proc", "tmp"})
_MAX_SYMLINKS = 40


@dataclass(frozen=True)
class Mount:
    """A bind mount of a host path (file or directory) at `target` inside the container."""

    source: str
    target: str
    readonly: bool = False


def make_private() -> None:
    # Without this, mounts made here would propagate to the host's shared mounts.
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)


def detach_namespace_files() -> None:
    """Unmount the copies of /run/netns/* that a new mount namespace inherits.

    Each copy keeps another pod's network namespace (and so its veth and IP)
    alive for as long as this namespace lives; `ip netns delete` of that pod
    would then leave its address on the bridge.
    """
    for target in _mount_points("nsfs"):
        # An error means it went with a parent detached before it.
        with contextlib.suppress(OSError):
            linux.umount(target)


def mounted_below(directory: Path) -> list[str]:
    """Mount points at or under `directory` in the current mount namespace."""
    prefix = str(directory).rstrip("/") + "/"
    return [point for point in _mount_points(None) if (point + "/").startswith(prefix)]


def _mount_points(fstype: str | None) -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields, _, rest = line.partition(" - ")
            if fstype is None or rest.split(" ", 1)[0] == fstype:
                points.append(_unescape(fields.split(" ")[4]))
    # Deepest first, so a parent is not detached before what is mounted below it.
    return sorted(points, key=len, reverse=True)


def _unescape(path: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


class RootBuilder:
    """Builds the root under `root` (an existing empty directory) in the current mount namespace.

    `stash` is an empty directory used briefly while exploding a directory.
    """

    def __init__(self, root: Path, stash: Path) -> None:
        self.root = root
        self.stash = stash
        # Directories whose content lives in a tmpfs of ours: creating entries there
        # touches nothing on the host.
        self._own: set[Path] = set()

    def mirror_host(self) -> None:
        linux.mount("tmpfs", str(self.root), "tmpfs", linux.MS_NOSUID, "mode=755")
        self._own.add(self.root)
        self._populate(self.root, Path("/"), skip=NOT_MIRRORED)
        for name in NOT_MIRRORED:
            (self.root / name).mkdir(mode=0o755, exist_ok=True)
        (self.root / "tmp").chmod(0o1777)

    def bind(self, mount: Mount) -> None:
        source = Path(mount.source)
        if not source.exists():
            raise FileNotFoundError(f"mount source {source} (for {mount.target}) does not exist")
        target = self.ensure(mount.target, directory=source.is_dir())
        linux.mount(str(source), str(target), None, linux.MS_BIND | linux.MS_REC)
        if mount.readonly:
            # A bind mount is read-only only after a remount (that is how mount(8) does it).
            flags = linux.MS_BIND | linux.MS_REMOUNT | linux.MS_RDONLY
            linux.mount(None, str(target), None, flags)

    def ensure(self, path: str, *, directory: bool) -> Path:
        """The host path of `path` inside the root, created (as a directory or an empty file) if missing."""
        existing, missing = self.resolve(path)
        if not missing:
            if directory != existing.is_dir():
                kind = "directory" if directory else "file"
                raise NotADirectoryError(f"cannot mount a {kind} on {path}: it exists as the other kind")
            return existing
        if not existing.is_dir():
            raise NotADirectoryError(f"cannot create {path}: {existing.relative_to(self.root)} is not a directory")
        if existing not in self._own:
            self._explode(existing)
        current = existing
        for index, name in enumerate(missing):
            current = current / name
            if index < len(missing) - 1 or directory:
                current.mkdir(mode=0o755)
                self._own.add(current)
            else:
                current.touch(mode=0o644)
        return current

    def resolve(self, path: str) -> tuple[Path, list[str]]:
        """Follow `path` inside the root as the container will see it.

        Returns the deepest existing host path and the components still missing.
        Symlinks are followed relative to the root (an absolute link such as
        /var/run -> /run must land in the root, not on the host).
        """
        pending = [part for part in path.split("/") if part not in ("", ".")]
        current = self.root
        hops = 0
        while pending:
            name = pending.pop(0)
            if name == "..":
                if current != self.root:
                    current = current.parent
                continue
            candidate = current / name
            if candidate.is_symlink():
                hops += 1
                if hops > _MAX_SYMLINKS:
                    raise OSError(f"too many symlinks resolving {path}")
                link = os.readlink(candidate)
                if link.startswith("/"):
                    current = self.root
                pending = [part for part in link.split("/") if part not in ("", ".")] + pending
                continue
            if not candidate.exists():
                return current, [name, *pending]
            current = candidate
        return current, []

    def _explode(self, directory: Path) -> None:
        """Replace `directory` (in this namespace only) by a tmpfs that mirrors its entries."""
        info = directory.stat()
        linux.mount(str(directory), str(self.stash), None, linux.MS_BIND | linux.MS_REC)
        try:
            mode = stat.S_IMODE(info.st_mode)
            data = f"mode={mode:o},uid={info.st_uid},gid={info.st_gid}"
            linux.mount("tmpfs", str(directory), "tmpfs", linux.MS_NOSUID, data)
            self._populate(directory, self.stash, skip=frozenset())
        finally:
            linux.umount(str(self.stash))
        self._own.add(directory)

    def _populate(self, target: Path, source: Path, skip: frozenset[str]) -> None:
        for entry in os.scandir(source):
            if entry.name in skip:
                continue
            path = target / entry.name
            try:
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), path)
                elif entry.is_dir(follow_symlinks=False):
                    path.mkdir(mode=0o755)
                    linux.mount(entry.path, str(path), None, linux.MS_BIND | linux.MS_REC)
                else:
                    # Files, sockets and device nodes alike: a bind mount on an empty file.
                    path.touch(mode=0o644)
                    linux.mount(entry.path, str(path), None, linux.MS_BIND)
            except FileNotFoundError:
                continue  # Vanished while we looked (a temporary file).
