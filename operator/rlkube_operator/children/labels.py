"""Labels that identify a job's children, and the ownerReference tying them to it."""

from __future__ import annotations

from typing import Any

from rlkube_api.names import LABEL_JOB, LABEL_MANAGED_BY, LABEL_ROLE, MANAGED_BY
from rlkube_api.rljob import API_VERSION, KIND, RLJob


def job_labels(job: RLJob) -> dict[str, str]:
    return {LABEL_JOB: job.metadata.name or "", LABEL_MANAGED_BY: MANAGED_BY}


def role_labels(job: RLJob, role: str) -> dict[str, str]:
    return {**job_labels(job), LABEL_ROLE: role}


def role_selector(job: RLJob, role: str) -> dict[str, str]:
    return {LABEL_JOB: job.metadata.name or "", LABEL_ROLE: role}


def owner_reference(job: RLJob, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
