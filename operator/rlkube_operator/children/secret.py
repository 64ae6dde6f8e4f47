"""The Secret holding the job's Ray token: with Ray's token authentication on, only
processes given the token join the job's Ray cluster or submit work to it (Ray's
head otherwise runs anything anyone on the pod network sends it)."""

from __future__ import annotations

from typing import Any

from rlkube_api.rljob import RLJob
from rlkube_operator.children.labels import job_labels

TOKEN_KEY = "token"


def ray_secret_name(job: RLJob) -> str:
    return ray_secret_name_of(job.metadata.name or "")


def ray_secret_name_of(job_name: str) -> str:
    return f"{job_name}-ray"


def ray_token_secret(job: RLJob, token: str) -> dict[str, Any]:
    """`token` is generated once by the reconciler and read back afterwards, so this
    builder stays pure and re-applying it never rotates the token under running pods."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": ray_secret_name(job), "namespace": job.metadata.namespace, "labels": job_labels(job)},
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }
