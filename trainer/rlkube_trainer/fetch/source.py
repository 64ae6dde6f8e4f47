"""A fetch's source, parsed from model.uri or data.uri (the API's FETCH_URI admits only these)."""

from __future__ import annotations

from dataclasses import dataclass

from rlkube_api.exit_codes import ExitCode


class FetchError(RuntimeError):
    """A fetch that failed; the message names the uri (and the object, where one is to blame),
    `code` is the exit class (STORAGE_FULL for a full volume)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.CONFIG) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class S3Source:
    uri: str
    bucket: str
    prefix: str


@dataclass(frozen=True)
class HubSource:
    uri: str
    repo_id: str
    revision: str
    # "model" for model.uri, "dataset" for data.uri (an HF dataset repo).
    repo_type: str


Source = S3Source | HubSource
DEFAULT_REVISION = "main"


def parse_source(uri: str, repo_type: str = "model") -> Source:
    """The source `uri` names; FetchError for one that names none."""
    scheme, sep, rest = uri.partition("://")
    if not sep or not rest:
        raise FetchError(f"{uri}: not a source uri (s3://bucket/prefix or hf://org/name[@revision])")
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        return S3Source(uri, bucket, prefix.strip("/"))
    if scheme == "hf":
        repo_id, _, revision = rest.partition("@")
        if repo_id.count("/") != 1:
            raise FetchError(f"{uri}: an hf:// uri names a repo as org/name")
        return HubSource(uri, repo_id, revision or DEFAULT_REVISION, repo_type)
    raise FetchError(f"{uri}: no fetch for {scheme}:// (s3:// or hf://)")
