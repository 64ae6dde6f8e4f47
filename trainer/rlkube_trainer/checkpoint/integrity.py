"""Whether a checkpoint's parts are what their writers wrote: each writer reports every file it
wrote (``written``: size and SHA-256); the coordinator checks the report against what it sees
before it commits (``check_written``, which catches a writer whose pod does not mount the same
volume) and the manifest keeps the checksums, checked again when a part is loaded
(``check_checksum``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rlkube_trainer.checkpoint.folder import MANIFEST, CheckpointError, object_sizes
from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath


@dataclass(frozen=True)
class Written:
    """A file a writer wrote into the staging dir, as the writer saw it."""

    size: int
    sha256: str
    writer: str  # who wrote it, for the error when the coordinator does not see it: "actor rank 1"


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
    listed = object_sizes(staging)
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
