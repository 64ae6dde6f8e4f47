"""hf:// sources, through the Hub's own client (huggingface_hub): HF_TOKEN from the environment,
endpointUrl (HF_ENDPOINT) for a mirror. The revision (a branch, tag or commit) is resolved to
its commit first; that commit is what is downloaded and recorded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlkube_api.exit_codes import ExitCode
from rlkube_trainer.fetch.place import Listing
from rlkube_trainer.fetch.source import FetchError, HubSource

Progress = Callable[[str], None]


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _code(exc: Exception) -> ExitCode:
    """CONFIG for what the Hub answered that fetching again cannot change (no such repo, revision
    or file, no access: 4xx); UNEXPECTED, retried by the kubelet, for the rest (no connection,
    a server error)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return ExitCode.CONFIG if isinstance(status, int) and 400 <= status < 500 else ExitCode.UNEXPECTED


def list_hub(source: HubSource, endpoint_url: str | None) -> Listing:
    """The revision's commit and its files' sizes (a request to the Hub or the mirror)."""
    from huggingface_hub import HfApi  # noqa: PLC0415  (only a fetch needs it)

    api = HfApi(endpoint=endpoint_url)
    try:
        info = api.repo_info(source.repo_id, revision=source.revision, repo_type=source.repo_type, files_metadata=True)
    except Exception as exc:
        where = f" at {endpoint_url}" if endpoint_url else ""
        raise FetchError(
            f"{source.uri}: cannot resolve {source.repo_type} {source.repo_id}@{source.revision}{where}: {_reason(exc)}",
            _code(exc),
        ) from exc
    if not info.sha:
        raise FetchError(f"{source.uri}: the Hub named no commit for revision {source.revision}")
    siblings = getattr(info, "siblings", None) or []
    files = {s.rfilename: {"size": int(s.size or 0)} for s in siblings}
    return Listing(info.sha, files)


def download_hub(
    source: HubSource, endpoint_url: str | None, listing: Listing, staging: Path, progress: Progress
) -> None:
    """The resolved commit's files into `staging`."""
    from huggingface_hub import snapshot_download  # noqa: PLC0415

    total = sum(int(info["size"]) for info in listing.files.values())
    progress(f"fetching {len(listing.files)} files, {total} bytes, commit {listing.revision}")
    try:
        snapshot_download(
            source.repo_id,
            revision=listing.revision,
            repo_type=source.repo_type,
            local_dir=staging,
            endpoint=endpoint_url,
        )
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise  # a local write (run.py tells a full volume)
        raise FetchError(
            f"{source.uri}: download of {source.repo_id}@{listing.revision}: {_reason(exc)}", _code(exc)
        ) from exc
    # snapshot_download keeps its own bookkeeping in local_dir/.cache: not part of the repo.
    cache = staging / ".cache"
    if cache.is_dir():
        import shutil  # noqa: PLC0415

        shutil.rmtree(cache)
    progress(f"fetched {len(listing.files)}/{len(listing.files)} files, {total}/{total} bytes")
