"""Where an RLJob's model and data come from when they are not on a volume yet: `model.uri` and
`data.uri` (s3://bucket/prefix, hf://org/name[@revision]), fetched once into the job's shared
volume before the role pods start (the trainer's `rlkube-trainer fetch`, run by the operator).

The uri fills the folder the trainer reads: `model.path` for the model, `data.dir` for the data
(whose trainFiles and valFiles name files under it). That folder must lie under a writable
volume of spec.volumes, which every pod of the job mounts. The words are the checkpoint
section's: `endpointUrl` is the address of the server the uri names (an S3-compatible server
for s3://, a Hub mirror for hf://, as HF_ENDPOINT), `credentialsSecret` a Secret whose keys
become the fetch's environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3://,
HF_TOKEN for hf://).
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.config.checkpoint import ENDPOINT_URL
from rlkube_api.config.common import FilePath
from rlkube_api.config.data import DataConfig
from rlkube_api.config.model import ModelConfig
from rlkube_api.kube_syntax import LONG_NAME

S3_URI = r"s3://[a-z0-9][-a-z0-9._]*[a-z0-9](/[^ ]*)?"
# A Hub repo id (org/name) and, after @, a branch, tag or commit (refs/pr/1 included).
HF_URI = r"hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(@[-A-Za-z0-9_./]+)?"
FETCH_URI = f"^({S3_URI}|{HF_URI})$"


class FetchSource(ApiModel):
    """A uri to fetch from, the address of its server and the Secret of its credentials."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!has(self.endpointUrl) || has(self.uri)",
            "endpointUrl needs uri (it is the address of the server uri names)",
            ".endpointUrl",
        ),
        CelRule(
            "!has(self.credentialsSecret) || has(self.uri)",
            "credentialsSecret needs uri (it holds the credentials of the server uri names)",
            ".credentialsSecret",
        ),
    )

    uri: str | None = Field(
        None,
        max_length=4096,
        pattern=FETCH_URI,
        description="Fetched once into the job's volume before the role pods start: s3://bucket/prefix (every "
        "object under the prefix) or hf://org/name[@revision] (a Hub repo at a branch, tag or commit; default "
        "main). Fetched again only when the source changed (an object's ETag or size, the revision's commit).",
    )
    endpoint_url: str | None = Field(
        None,
        max_length=2048,
        pattern=ENDPOINT_URL,
        description="The address of the server uri names: an S3-compatible server for s3:// (default AWS S3), "
        "a Hub mirror for hf:// (HF_ENDPOINT; default the Hub). Needs uri.",
    )
    credentials_secret: Annotated[str, LONG_NAME] | None = Field(
        None,
        max_length=253,
        description="A Secret in the job's namespace whose keys become environment variables of the fetch "
        "only (no trainer container gets them): AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3://, HF_TOKEN "
        "for a private or gated hf:// repo. Needs uri.",
    )


class ModelSpec(ModelConfig, FetchSource):
    """The policy model, and where to fetch it from when it is not on a volume yet (uri fills path)."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (*ModelConfig.cel_rules, *FetchSource.cel_rules)


class DataSpec(DataConfig, FetchSource):
    """The training data, and where to fetch it from when it is not on a volume yet (uri fills dir)."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        *FetchSource.cel_rules,
        CelRule(
            "has(self.uri) == has(self.dir)",
            "data.uri and data.dir go together: dir is the folder on the job's volume uri is fetched into",
            ".dir",
        ),
        CelRule(
            "!has(self.dir) || (self.trainFiles.all(f, f.startsWith(self.dir.endsWith('/') ? self.dir : self.dir + '/'))"
            " && (!has(self.valFiles) || self.valFiles.all(f, f.startsWith(self.dir.endsWith('/') ? self.dir : "
            "self.dir + '/'))))",
            "data.trainFiles and data.valFiles must be files under data.dir (where data.uri is fetched to)",
            ".trainFiles",
        ),
    )

    dir: FilePath | None = Field(
        None,
        description="The folder data.uri is fetched into, under a writable volume of spec.volumes; trainFiles and "
        "valFiles name files under it (e.g. dir /data/gsm8k, trainFiles [/data/gsm8k/train.parquet]). Needs uri.",
    )


def _under_a_writable_volume(field: str) -> str:
    """CEL: `field` (a path of the spec) lies strictly under a writable mountPath of spec.volumes."""
    return (
        "has(self.volumes) && self.volumes.exists(v, !(has(v.readOnly) && v.readOnly)"
        f" && self.{field}.startsWith(v.mountPath.endsWith('/') ? v.mountPath : v.mountPath + '/'))"
    )


# The spec's rules: the folder a uri fills is on storage every pod of the job shares.
FETCH_PATH_RULES = (
    CelRule(
        f"!has(self.model.uri) || ({_under_a_writable_volume('model.path')})",
        "model.path must lie under a writable mountPath of spec.volumes when model.uri is set (the model is "
        "fetched there once, and every pod reads it from there)",
        ".model.path",
    ),
    CelRule(
        f"!has(self.data.uri) || ({_under_a_writable_volume('data.dir')})",
        "data.dir must lie under a writable mountPath of spec.volumes when data.uri is set (the data is fetched "
        "there once, and every pod reads it from there)",
        ".data.dir",
    ),
)
