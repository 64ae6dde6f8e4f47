"""The fetch: resolve what the source holds now, and download it into place unless the
destination already holds that revision."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlkube_api.exit_codes import ExitCode
from rlkube_trainer.fetch.hub import download_hub, list_hub
from rlkube_trainer.fetch.place import Listing, holds, marker_of, put_in_place, start_staging
from rlkube_trainer.fetch.s3 import download_s3, list_s3
from rlkube_trainer.fetch.source import FetchError, S3Source, parse_source

Progress = Callable[[str], None]
# A full volume or a spent quota: the job's STORAGE_FULL class.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class Fetched:
    uri: str
    dest: Path
    revision: str
    # False: the destination already held this revision, nothing was downloaded.
    downloaded: bool


def fetch(
    uri: str, dest: Path, endpoint_url: str | None = None, repo_type: str = "model", progress: Progress = print
) -> Fetched:
    """`uri` into the folder `dest`, once: skipped when `dest`'s marker names the same uri and
    revision. FetchError names the uri (and the object) on failure."""
    source = parse_source(uri, repo_type)
    listing = list_s3(source, endpoint_url) if isinstance(source, S3Source) else list_hub(source, endpoint_url)
    if holds(dest, uri, listing):
        progress(f"{dest} holds {uri} at {listing.revision} already: nothing to fetch")
        return Fetched(uri, dest, listing.revision, downloaded=False)
    try:
        staging = start_staging(dest)
        if isinstance(source, S3Source):
            download_s3(source, endpoint_url, listing, staging, progress)
        else:
            download_hub(source, endpoint_url, listing, staging, progress)
        put_in_place(staging, dest, uri, listing)
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            where = f" ({exc.filename})" if exc.filename else ""
            raise FetchError(f"{uri}: no space left on the volume of {dest}{where}", ExitCode.STORAGE_FULL) from exc
        raise FetchError(f"{uri}: writing into {dest}: {exc}") from exc
    progress(f"{uri} fetched into {dest} at {listing.revision}")
    return Fetched(uri, dest, listing.revision, downloaded=True)


def wait_for(uri: str, dest: Path, timeout: float, progress: Progress = print, poll: float = 2.0) -> None:
    """Until `dest` holds a complete fetch of `uri` (a role pod waits for the controller pod's
    fetch); FetchError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    said = False
    while True:
        marker = marker_of(dest)
        if marker is not None and marker.get("uri") == uri:
            progress(f"{dest} holds {uri} at {marker.get('revision')}")
            return
        if time.monotonic() > deadline:
            raise FetchError(
                f"{uri}: not fetched into {dest} within {timeout:.0f} s (see the controller pod's fetch)",
                ExitCode.UNEXPECTED,
            )
        if not said:
            progress(f"waiting for {uri} in {dest}")
            said = True
        time.sleep(poll)


__all__ = ["FetchError", "Fetched", "Listing", "fetch", "wait_for"]
