"""s3:// sources, through the object-store code the checkpoints use (obstore's fsspec filesystem;
credentials from the environment, endpointUrl for an S3-compatible server)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlkube_api.exit_codes import ExitCode
from rlkube_trainer.checkpoint.objectstore import ObjectPath, storage_options
from rlkube_trainer.fetch.place import Listing
from rlkube_trainer.fetch.source import FetchError, S3Source

Progress = Callable[[str], None]


# The server's answers that fetching again cannot change; anything else (a connection refused,
# a server error) is retried by the kubelet.
_PERMANENT = ("NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "NoSuchKey")


def _failed(source: S3Source, what: str, exc: Exception) -> FetchError:
    """A FetchError naming the uri with the first line of an object-store error (obstore's carry
    a long debug dump after it) and the server's error code where it gave one."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    code = next((c for c in _PERMANENT if c in str(exc)), None)
    if code is None:
        return FetchError(f"{source.uri}: {what}: {first}", ExitCode.UNEXPECTED)
    return FetchError(f"{source.uri}: {what}: {code}: {first}")


def _local_errno(exc: Exception) -> int | None:
    """The errno of a local write that obstore reports as its own error ("... (os error 28)")."""
    found = re.search(r"\(os error (\d+)\)", str(exc))
    return int(found.group(1)) if found and "LocalFileSystem" in str(exc) else None


def _root(source: S3Source, endpoint_url: str | None) -> ObjectPath:
    url = f"s3://{source.bucket}/{source.prefix}".rstrip("/")
    return ObjectPath(url, storage_options(url, endpoint_url))


def list_s3(source: S3Source, endpoint_url: str | None) -> Listing:
    """Every object under the prefix: its key (relative to the prefix), ETag and size."""
    root = _root(source, endpoint_url)
    try:
        found: dict[str, Any] = root.fs.find(root.key, detail=True)
    except Exception as exc:
        raise _failed(source, "cannot list it", exc) from exc
    prefix = root.key + "/"
    files = {
        key[len(prefix) :]: {"etag": str(info.get("e_tag", "")), "size": int(info["size"])}
        for key, info in found.items()
        if key.startswith(prefix) and info.get("type") != "directory"
    }
    if not files:
        raise FetchError(f"{source.uri}: no object under this prefix (NoSuchKey)")
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return Listing(f"sha256:{digest}", files)


def download_s3(
    source: S3Source, endpoint_url: str | None, listing: Listing, staging: Path, progress: Progress
) -> None:
    """Each object of `listing` into `staging`, one line of progress per object."""
    root = _root(source, endpoint_url)
    total = sum(int(info["size"]) for info in listing.files.values())
    done = 0
    for count, (key, info) in enumerate(sorted(listing.files.items()), 1):
        local = staging / key
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            (root / key).download(local)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) and not local.exists():
                raise FetchError(f"{source.uri}: object {key} vanished while fetching (NoSuchKey)") from exc
            raise
        except Exception as exc:
            if _local_errno(exc) is not None:
                # obstore writes the local file itself and reports its OSError as one of its own.
                raise OSError(_local_errno(exc), f"writing {key}", str(local)) from exc
            raise _failed(source, f"object {key}", exc) from exc
        done += int(info["size"])
        progress(f"fetched {count}/{len(listing.files)} files, {done}/{total} bytes: {key}")
