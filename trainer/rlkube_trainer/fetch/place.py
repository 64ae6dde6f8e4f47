"""Where a fetch writes: a staging folder beside the destination, renamed into place whole, with
a marker of what it holds. A fetch cut off half-way leaves only the staging folder (removed by
the next fetch), never a destination that looks complete: the marker is written into the
staging folder last, and the destination is only ever a renamed, complete staging folder."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# In the destination folder: the source's uri, its revision, and each file's identity.
MARKER = ".rlkube-fetched.json"


@dataclass(frozen=True)
class Listing:
    """What a source holds now: `revision` identifies it whole (the Hub's commit sha; for S3 a
    digest of every object's key, ETag and size), `files` each file's identity."""

    revision: str
    files: dict[str, dict[str, Any]] = field(default_factory=dict)


def marker_of(dest: Path) -> dict[str, Any] | None:
    """The marker of a complete fetch into `dest`; None where there is none (or it is unreadable)."""
    try:
        marker: dict[str, Any] = json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def holds(dest: Path, uri: str, listing: Listing) -> bool:
    """`dest` holds `uri` at the revision `listing` names."""
    marker = marker_of(dest)
    return marker is not None and marker.get("uri") == uri and marker.get("revision") == listing.revision


def staging_of(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.fetching"


def start_staging(dest: Path) -> Path:
    """An empty staging folder for `dest` (what an earlier, cut-off fetch left there is removed)."""
    staging = staging_of(dest)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def put_in_place(staging: Path, dest: Path, uri: str, listing: Listing) -> None:
    """Writes the marker into `staging`, then renames it to `dest`. An older `dest` is moved
    aside first and removed after: a cut between the two renames leaves no `dest`, which the
    next fetch fills."""
    marker = {"uri": uri, "revision": listing.revision, "files": listing.files}
    (staging / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True))
    replaced = dest.parent / f".{dest.name}.replaced"
    shutil.rmtree(replaced, ignore_errors=True)
    if dest.exists():
        dest.rename(replaced)
    staging.rename(dest)
    shutil.rmtree(replaced, ignore_errors=True)
