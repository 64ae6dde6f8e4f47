"""The checkpoint section: where checkpoints go (a folder or an object store), resume, retention."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from rlkube_api.base import ApiModel, CelRule

# Object stores a checkpoint.uri may name, by their fsspec protocol: S3, Google Cloud Storage and
# Azure Blob Storage, all three through obstore's fsspec filesystem (in the trainer images).
OBJECT_STORE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss")
OBJECT_STORE_URL = "^(" + "|".join(OBJECT_STORE_SCHEMES) + ")://[a-z0-9][-a-z0-9._]*[a-z0-9](/.*)?$"
# A server's address: an S3-compatible server's here, a Hugging Face Hub mirror's for an hf:// source.
ENDPOINT_URL = r"^https?://[^ /]+(/[^ ]*)?$"


def _checkpoint_path(field: str) -> str:
    """CEL: the field is an absolute path or an object-store URL."""
    return f"(self.{field}.startsWith('/') || self.{field}.matches('{OBJECT_STORE_URL}'))"


class CheckpointConfig(ApiModel):
    """Checkpoints: complete ones only, the latest marker written last."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            f"self.resume == 'auto' || self.resume == 'disable' || {_checkpoint_path('resume')}",
            "resume must be auto, disable, an absolute checkpoint path or an object-store URL (s3://...)",
            ".resume",
        ),
        CelRule(
            f"!has(self.resumeFrom) || (self.resume == 'auto' && {_checkpoint_path('resumeFrom')})",
            "resumeFrom must be an absolute path or an object-store URL (s3://...), and needs resume: auto "
            "(it seeds a run whose dir has no checkpoint yet; an explicit resume path or disable would never "
            "read it)",
            ".resumeFrom",
        ),
        CelRule(
            "!has(self.endpointUrl) || (has(self.uri) && self.uri.startsWith('s3://'))",
            "endpointUrl needs an s3:// uri (it is the address of the S3-compatible server uri names)",
            ".endpointUrl",
        ),
    )

    dir: str = Field(
        "checkpoints",
        min_length=1,
        max_length=4096,
        description="Checkpoint folder (the mounted volume in pods). With uri set: only the local working "
        "folder (metrics.jsonl's working copy, TensorBoard, curves); checkpoints go to uri.",
    )
    uri: str | None = Field(
        None,
        max_length=4096,
        pattern=OBJECT_STORE_URL,
        description="Object store for checkpoints, the HF export and a copy of metrics.jsonl, through fsspec: "
        "s3://bucket/prefix, gs://bucket/prefix or az://container/prefix. Ranks write their parts "
        "directly, the manifest and COMPLETE marker last; the latest complete checkpoint is found there on "
        "resume. Credentials: the backend's environment variables (credentialsSecret in a cluster).",
    )
    endpoint_url: str | None = Field(
        None,
        max_length=2048,
        pattern=ENDPOINT_URL,
        description="An S3-compatible server's address (http(s)://host:port) for an s3:// uri; default AWS S3.",
    )
    resume: str = Field(
        "auto",
        max_length=4096,
        description="auto (latest complete checkpoint), disable, or a checkpoint's path or URL.",
    )
    resume_from: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Seed a new run from another run's checkpoint (verl's resume_from_path): a complete "
        "step_* dir or a checkpoint root (its latest), read while dir holds no complete checkpoint of its "
        "own; later restarts resume from this run's own checkpoints. Any number of actor/critic ranks, "
        "and another strategy or fsdpSize, may resume it. Needs resume: auto.",
    )
    max_to_keep: int = Field(3, ge=1, description="Complete checkpoints kept; older ones are deleted.")
    max_actor_ckpt_to_keep: int | None = Field(
        None,
        ge=1,
        description="verl's name: checkpoints kept for the actor (default maxToKeep). A checkpoint holds "
        "every role and is resumed whole, so the job keeps the larger of this and maxCriticCkptToKeep; "
        "the newest complete checkpoint is never deleted.",
    )
    max_critic_ckpt_to_keep: int | None = Field(
        None,
        ge=1,
        description="verl's name: checkpoints kept for the critic (default maxToKeep); see maxActorCkptToKeep.",
    )
    adopt: bool = Field(
        False,
        description="In a cluster: continue the run another RLJob left in dir (the same name created "
        "again, or another job): resume auto picks up its checkpoints and metrics.jsonl. Off: the driver "
        "refuses a dir holding another job's run, naming that job (the dir's rljob.json).",
    )
    async_save: bool = Field(
        False,
        description="verl's actor.checkpoint.async_save: a save blocks the step only while every rank "
        "copies its state into host memory; the files are written in the background while training goes "
        "on, and the checkpoint becomes the one a resume takes (COMPLETE, latest) only once every rank's "
        "files are written. At most one save is in flight: the next waits for it. Off (the default): the "
        "step waits for the whole write, so a checkpoint is complete before the next step starts; on, a "
        "crash during a background write resumes from the checkpoint before it. Needs host memory for one "
        "more copy of each rank's trainable state.",
    )
    export_hf: Literal["never", "final", "every_save"] = Field(
        "final",
        description="Export the actor as a Hugging Face model: final (into dir/hf at the end), every_save "
        "(also into each checkpoint's hf/), or never. true/false in the trainer YAML mean final/never.",
    )

    @field_validator("export_hf", mode="before")
    @classmethod
    def _export_hf_from_bool(cls, value: Any) -> Any:
        # The trainer YAML used to take a boolean here.
        if isinstance(value, bool):
            return "final" if value else "never"
        return value
