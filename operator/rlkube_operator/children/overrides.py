"""Pod template overrides (`spec.podTemplate`, then the role's `podTemplate`) merged onto
the pod template the operator built. The merge rules are in rlkube_api/pod_template.py's
docstring; what the operator owns was refused by the CRD already, so everything
left here is an addition or a user's choice of a value rlkube only defaults."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from rlkube_api.names import CONTROLLER_ROLE
from rlkube_api.pod_template import OPERATOR_VOLUMES, TRAINER_CONTAINER, PodTemplate
from rlkube_api.rljob import RLJob

Obj = dict[str, Any]

# Keyed lists: entries with the same key merge (the later one wins); others keep their order.
_LIST_KEYS = {
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "initContainers": "name",
    "sidecars": "name",
    "schedulingGates": "name",
}
_MAPS = ("labels", "annotations", "podSecurityContext", "securityContext")


def role_templates(job: RLJob, role: str) -> list[PodTemplate]:
    """The templates that apply to `role`'s pods, the most specific last."""
    spec = job.spec
    own = spec.controller.pod_template if role == CONTROLLER_ROLE else getattr(spec.roles, role).pod_template
    return [t for t in (spec.pod_template, own) if t is not None]


def merge_templates(templates: Iterable[PodTemplate]) -> Obj:
    """The templates' wire forms merged into one, later ones winning."""
    merged: Obj = {}
    for template in templates:
        for key, value in template.to_wire().items():
            if key in _MAPS:
                merged[key] = {**merged.get(key, {}), **value}
            elif key == "resources":
                old = merged.get(key, {})
                merged[key] = {part: {**old.get(part, {}), **value.get(part, {})} for part in ("requests", "limits")}
            elif key in _LIST_KEYS:
                merged[key] = _merge_keyed(merged.get(key, []), value, _LIST_KEYS[key])
            else:  # scalars and topologySpreadConstraints: replaced whole
                merged[key] = value
    if "resources" in merged:
        merged["resources"] = {k: v for k, v in merged["resources"].items() if v}
    return merged


def _merge_keyed(base: list[Obj], extra: list[Obj], key: str) -> list[Obj]:
    out = {item[key]: item for item in base}
    for item in extra:
        out[item[key]] = item
    return list(out.values())


def apply_pod_template(template: Obj, job: RLJob, role: str) -> Obj:
    """`template` (a StatefulSet's spec.template, as built) with the role's overrides
    merged in; a new dict, the input untouched."""
    overrides = merge_templates(role_templates(job, role))
    if not overrides:
        return template
    out = copy.deepcopy(template)
    meta, pod = out["metadata"], out["spec"]
    trainer = next(c for c in pod["containers"] if c["name"] == TRAINER_CONTAINER)
    # Operator keys were refused by the CRD; writing ours last keeps that true for gang keys too.
    for part in ("labels", "annotations"):
        if part in overrides:
            meta[part] = {**overrides[part], **meta.get(part, {})}
    if "env" in overrides:
        trainer["env"] = _merge_keyed(trainer.get("env", []), overrides["env"], "name")
    if "resources" in overrides:
        resources = trainer.setdefault("resources", {})
        for part, extra in overrides["resources"].items():
            resources[part] = {**resources.get(part, {}), **extra}
    if "volumeMounts" in overrides:
        # The checkpoint directory is a spec field the CRD cannot compare mounts against:
        # a mount over one of the operator's paths is dropped, the operator's stays.
        owned = {m["mountPath"] for m in trainer.get("volumeMounts", []) if m["name"] in OPERATOR_VOLUMES}
        extra = [m for m in overrides["volumeMounts"] if m["mountPath"] not in owned]
        trainer["volumeMounts"] = _merge_keyed(trainer.get("volumeMounts", []), extra, "mountPath")
    if "securityContext" in overrides:
        trainer["securityContext"] = {**trainer.get("securityContext", {}), **overrides["securityContext"]}
    if "podSecurityContext" in overrides:
        pod["securityContext"] = {**pod.get("securityContext", {}), **overrides["podSecurityContext"]}
    # A volume named like one of spec.volumes replaces it: the more specific setting wins.
    for field in ("volumes", "imagePullSecrets", "initContainers", "schedulingGates"):
        if field in overrides:
            pod[field] = _merge_keyed(pod.get(field, []), overrides[field], "name")
    if "sidecars" in overrides:
        pod["containers"] = [*pod["containers"], *overrides["sidecars"]]
    for field in ("priorityClassName", "serviceAccountName", "topologySpreadConstraints"):
        if field in overrides:
            pod[field] = overrides[field]
    return out
