"""The project's container images, built here from its own Dockerfiles.

No image registry is reachable from these machines, so the base image the
Dockerfiles default to (`python:3.11.11-slim-bookworm`) is replaced by a stand-in
made with mmdebstrap from Debian's mirror, passed in as the `BASE` build argument.
Images are built with buildah into a store of their own under
`$RLKUBE_CACHE/images/` and written out as OCI archives there, one per cache key:
a hash of every input (the Dockerfile and its target, the lock files and project
files it copies, the base's key). `ensure_image` builds only when no archive has
the key; the archive is what `ctr -n k8s.io images import` takes.

    python -m rlkube_e2e.images build [base operator trainer-cpu]
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlkube_e2e.binaries import cache_dir

REPO = Path(__file__).resolve().parents[2]
# The Debian packages a fresh machine needs for image builds (the Makefile's
# `images-sysdeps` installs them when missing).
TOOLS = ("buildah", "mmdebstrap")
# Debian's CA bundle: this machine's egress re-signs TLS with a CA only the host
# bundle holds, so `pip install` inside a build needs it. Mounted for the build's
# RUN steps only, never written into an image.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Repository path for the images built here; the tag is the cache key.
REPOSITORY = "localhost/rlkube"

# The stand-in for python:3.11.11-slim-bookworm: the same Debian release, its
# python3 (3.11.2) with pip at the paths the public image has them
# (/usr/local/bin/python, python3, pip, pip3), and pip free to install into the
# system Python as it is there (Debian's EXTERNALLY-MANAGED marker removed).
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-pip", "ca-certificates")
BASE_HOOKS = (
    'rm -f "$1"/usr/lib/python3.*/EXTERNALLY-MANAGED',
    'for name in python python3; do ln -sf /usr/bin/python3 "$1/usr/local/bin/$name"; done',
    'for name in pip pip3; do ln -sf /usr/bin/pip3 "$1/usr/local/bin/$name"; done',
)
BASE_CONFIG = (
    "--env",
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "--env",
    "LANG=C.UTF-8",
    "--cmd",
    "python3",
)


@dataclass(frozen=True)
class DockerfileImage:
    """An image built from one of the project's Dockerfiles on top of the local base."""

    dockerfile: str
    target: str | None


IMAGES: dict[str, DockerfileImage] = {
    "operator": DockerfileImage("Dockerfile.operator", None),
    "trainer-cpu": DockerfileImage("Dockerfile.trainer", "cpu"),
}
NAMES = ("base", *IMAGES)


@dataclass(frozen=True)
class ImageArchive:
    """A built image: an OCI archive file and the reference pods use for it."""

    name: str
    key: str
    path: Path
    ref: str


class ImageError(RuntimeError):
    """An image could not be built; the message says which step and why."""


def images_dir() -> Path:
    return cache_dir() / "images"


def _storage_options() -> list[str]:
    # A buildah store of the project's own: nothing it writes mixes with other users'.
    root = images_dir() / "storage"
    return ["--root", str(root / "root"), "--runroot", str(root / "run")]


def _archive(name: str, key: str) -> ImageArchive:
    return ImageArchive(name, key, images_dir() / f"{name}-{key}.oci.tar", f"{REPOSITORY}/{name}:{key}")


# --- cache keys ---------------------------------------------------------------------------------


def _hash_parts(parts: Iterator[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:16]


def base_key() -> str:
    """The base's key: everything mmdebstrap and buildah are told to make it."""
    spec = [BASE_SUITE, *BASE_PACKAGES, *BASE_HOOKS, *BASE_CONFIG]
    return _hash_parts(part.encode() for part in ["base", *spec])


def _ignored(relative: str, patterns: Sequence[str]) -> bool:
    parts = relative.split("/")
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatch(part, pattern[3:]) for part in parts):
                return True
        elif fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(parts[0], pattern):
            return True
    return False


def dockerignore_patterns(repo: Path = REPO) -> list[str]:
    lines = (repo / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def copied_sources(dockerfile: Path) -> list[str]:
    """The build-context paths a Dockerfile's COPY instructions name (not `--from` ones)."""
    sources: list[str] = []
    # One instruction per logical line: a trailing backslash continues it on the next.
    for line in re.sub(r"\\\n", " ", dockerfile.read_text()).splitlines():
        words = shlex.split(line.strip(), comments=True) if line.strip().upper().startswith("COPY") else []
        if not words or any(word.startswith("--from") for word in words):
            continue
        sources += [word for word in words[1:-1] if not word.startswith("--")]
    return sources


def context_files(dockerfile: Path, repo: Path = REPO) -> list[Path]:
    """Every file of the build context that the Dockerfile copies into an image."""
    patterns = dockerignore_patterns(repo)
    files: set[Path] = set()
    for source in copied_sources(dockerfile):
        path = repo / source
        if not path.exists():
            raise ImageError(f"{dockerfile.name}: COPY {source}: no such path in {repo}")
        candidates = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        files |= {p for p in candidates if not _ignored(p.relative_to(repo).as_posix(), patterns)}
    return sorted(files)


def image_key(name: str, repo: Path = REPO) -> str:
    """A hash of every input of the image: the base's key, the Dockerfile, its target and
    every file it copies (lock files and the project's sources), by path and content."""
    if name == "base":
        return base_key()
    image = IMAGES[name]
    dockerfile = repo / image.dockerfile
    files = context_files(dockerfile, repo)

    def parts() -> Iterator[bytes]:
        yield from (name.encode(), base_key().encode(), (image.target or "").encode(), dockerfile.read_bytes())
        for path in files:
            yield path.relative_to(repo).as_posix().encode()
            yield path.read_bytes()

    return _hash_parts(parts())


# --- building -----------------------------------------------------------------------------------


def _progress(message: str) -> None:
    print(f"==> [images] {message}", file=sys.stderr, flush=True)


def _run(step: str, command: list[str], *, stream: bool = False) -> str:
    """Run one build command; on failure raise with the step and the output's tail."""
    if stream:
        # Long builds print every line (buildah's STEP lines and pip's progress).
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        tail: list[str] = []
        for line in process.stdout:
            sys.stderr.write(f"    {line}")
            tail = [*tail[-40:], line]
        if process.wait() != 0:
            raise ImageError(f"{step} failed (exit {process.returncode}): {shlex.join(command)}\n{''.join(tail)}")
        return ""
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise ImageError(f"{step} failed (exit {result.returncode}): {shlex.join(command)}\n{output}")
    return result.stdout.strip()


def check_tools() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise ImageError(f"{', '.join(missing)} not found: run `make images-sysdeps` (Debian packages)")
    if os.geteuid() != 0:
        raise ImageError("image builds run buildah with --isolation chroot and mmdebstrap as root: run as root")


def _buildah(*args: str) -> list[str]:
    return ["buildah", *_storage_options(), *args]


def _in_store(ref: str) -> bool:
    result = subprocess.run(_buildah("inspect", "--type", "image", ref), capture_output=True, check=False)
    return result.returncode == 0


def _push(archive: ImageArchive) -> None:
    """Write the image out as an OCI archive, atomically: a half-written file never has the key's name."""
    partial = archive.path.with_name(archive.path.name + ".partial")
    partial.unlink(missing_ok=True)
    _run("writing the OCI archive", _buildah("push", "--quiet", archive.ref, f"oci-archive:{partial}:{archive.ref}"))
    partial.rename(archive.path)


def _load(archive: ImageArchive) -> None:
    """Put an archived image back into the build store (a later build needs it as its base)."""
    if not _in_store(archive.ref):
        image_id = _run("loading the base", _buildah("pull", "--quiet", f"oci-archive:{archive.path}"))
        _run("naming the base", _buildah("tag", image_id.splitlines()[-1], archive.ref))


def _drop_superseded(archive: ImageArchive) -> None:
    """Remove this image's archives and tags of other keys: each source change makes a new key,
    and the trainer's archive is several GB. The cached layers stay for the next build."""
    for path in images_dir().glob(f"{archive.name}-*.oci.tar"):
        old = _archive(archive.name, path.name.removeprefix(f"{archive.name}-").removesuffix(".oci.tar"))
        if old.key != archive.key:
            path.unlink(missing_ok=True)
            subprocess.run(_buildah("rmi", old.ref), capture_output=True, check=False)


def _build_base(archive: ImageArchive) -> None:
    work = images_dir() / f"base-{archive.key}.work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rootfs = work / "rootfs.tar"
    hooks = [f"--customize-hook={hook}" for hook in BASE_HOOKS]
    _progress(f"base: mmdebstrap {BASE_SUITE} ({', '.join(BASE_PACKAGES)}) from Debian's mirror (about a minute)")
    _run(
        "mmdebstrap",
        ["mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", *hooks, BASE_SUITE, str(rootfs)],
        stream=True,
    )
    _progress("base: making the image from the root filesystem")
    container = _run("buildah from scratch", _buildah("from", "scratch"))
    try:
        _run("adding the root filesystem", _buildah("add", container, str(rootfs), "/"))
        _run("configuring the base", _buildah("config", *BASE_CONFIG, container))
        _run("committing the base", _buildah("commit", "--quiet", container, archive.ref))
    finally:
        subprocess.run(_buildah("rm", container), capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)


def _build_dockerfile(name: str, archive: ImageArchive, base: ImageArchive) -> None:
    image = IMAGES[name]
    _load(base)
    target = ["--target", image.target] if image.target else []
    _progress(f"{name}: buildah bud -f {image.dockerfile} {' '.join(target)} (BASE={base.ref})")
    _run(
        f"building {name}",
        _buildah(
            "bud",
            # Layer caching: a change to the sources alone rebuilds the last steps, not the
            # locked dependencies (several GB for the trainer), which sit in earlier layers.
            "--layers",
            # A failed step's working container holds the step's whole root filesystem (a
            # trainer's pip step: 7-15 GB): removed on failure too, not left to fill the disk.
            "--force-rm",
            "--pull-never",
            "--network",
            "host",
            "--isolation",
            "chroot",
            "--build-arg",
            f"BASE={base.ref}",
            "--volume",
            f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro",
            "--file",
            str(REPO / image.dockerfile),
            *target,
            "--tag",
            archive.ref,
            str(REPO),
        ),
        stream=True,
    )


def ensure_image(name: str) -> ImageArchive:
    """The image's archive for the current inputs, built first if no archive has their key."""
    if name not in NAMES:
        raise ImageError(f"unknown image {name!r}: expected one of {', '.join(NAMES)}")
    archive = _archive(name, image_key(name))
    if archive.path.is_file():
        return archive
    check_tools()
    base = ensure_image("base") if name != "base" else None
    images_dir().mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    _progress(f"building {name} (key {archive.key}; not in {images_dir()})")
    if base is None:
        _build_base(archive)
    else:
        _build_dockerfile(name, archive, base)
    _push(archive)
    _drop_superseded(archive)
    size = archive.path.stat().st_size / 1e6
    _progress(f"{name}: built in {time.monotonic() - started:.0f} s, archive {size:.0f} MB: {archive.path}")
    return archive


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlkube_e2e.images", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build the images whose archives are missing (all by default)")
    build.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(NAMES)}")
    commands.add_parser("keys", help="print each image's cache key and archive path")
    args = parser.parse_args(argv)
    try:
        if args.command == "keys":
            for name in NAMES:
                archive = _archive(name, image_key(name))
                print(f"{name}\t{archive.ref}\t{archive.path}\t{'built' if archive.path.is_file() else 'missing'}")
        else:
            for name in args.names or NAMES:
                archive = ensure_image(name)
                print(f"{name}\t{archive.ref}\t{archive.path}")
    except ImageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
