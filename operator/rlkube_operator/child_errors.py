"""A child the API server refused, traced back to the RLJob field it was built from. Pure.

Admission refuses almost every mistake with the RLJob's own field; what still gets through
lives in free-form parts the CRD cannot see (volume sources, affinity, pod template
overrides). The API server names the child's field (`spec.template.spec.volumes[3]...`);
this maps it to the RLJob field that produced it, where one did.
"""

from __future__ import annotations

import re

from rlkube_api.names import CONTROLLER_ROLE, child_name
from rlkube_api.rljob import RLJob
from rlkube_operator.children.statefulset import volumes_and_mounts
from rlkube_operator.children.topology import pod_roles

_POD = r"spec\.template\.spec\."
# (pattern on the child's field, the RLJob field under the role's settings or the job's spec)
_ROLE_FIELDS = (
    (re.compile(_POD + r"containers\[0\]\.resources"), "resources"),
    (re.compile(_POD + r"nodeSelector"), "pool.nodeSelector"),
    (re.compile(_POD + r"tolerations"), "pool.tolerations"),
    (re.compile(_POD + r"affinity"), "pool.affinity"),
    (re.compile(r"spec\.template\.metadata"), "podTemplate.metadata"),
)
_JOB_FIELDS = (
    (re.compile(_POD + r"containers\[0\]\.env"), "spec.env"),
    (re.compile(_POD + r"containers\[0\]\.image"), "spec.image"),
    (re.compile(_POD + r"imagePullSecrets"), "spec.imagePullSecrets"),
    (re.compile(_POD + r"serviceAccountName"), "spec.serviceAccountName"),
)
_VOLUME = re.compile(_POD + r"volumes\[(\d+)\]")


def rljob_field(job: RLJob, kind: str, name: str, message: str) -> str | None:
    """The RLJob field behind the refusal of child `kind/name`, or None when none is known."""
    if kind != "StatefulSet":
        return None
    role = next((r.name for r in pod_roles(job) if child_name(job.metadata.name or "", r.name) == name), None)
    if role is None:
        return None
    settings = "spec.controller" if role == CONTROLLER_ROLE else f"spec.roles.{role}"
    if (found := _VOLUME.search(message)) is not None:
        volumes, _ = volumes_and_mounts(job)
        index = int(found.group(1))
        if index >= len(volumes):
            return None
        volume = volumes[index]["name"]
        if volume == "checkpoints":
            return "spec.checkpoint.volume"
        user = [v.name for v in job.spec.volumes or []]
        return f"spec.volumes[{user.index(volume)}] ({volume})" if volume in user else None
    for pattern, field in _ROLE_FIELDS:
        if pattern.search(message):
            return f"{settings}.{field}"
    for pattern, field in _JOB_FIELDS:
        if pattern.search(message):
            return field
    return None


def describe(job: RLJob, refused: dict[str, str]) -> str:
    """The Failed condition's message: each refused child, its error and its RLJob field."""
    parts = []
    for child, error in sorted(refused.items()):
        kind, _, name = child.partition("/")
        field = rljob_field(job, kind, name, error)
        where = f"from RLJob field {field}" if field else "no single RLJob field identified"
        parts.append(f"{child} ({where}): {error}")
    return "the API server refused a child, so no pod was started; fix the spec (a new generation retries): " + (
        "; ".join(parts)
    )
