"""Putting a job and its runtime together: the merge rules, written once, pure.

- The job's value wins over the template's, field by field: objects (maps) merge key by key,
  recursively; scalars are replaced.
- Lists of named objects (env, volumes, imagePullSecrets, a pod template's env, volumes,
  initContainers, sidecars, schedulingGates) merge by name, volumeMounts by mountPath: a job's
  entry replaces the template's of the same name in its place, new ones come after. Other
  lists (tolerations, topologySpreadConstraints, trainFiles) are replaced whole.
- A `pool` and the `runPolicy` are replaced whole: a pool is one decision (where the pods go),
  and the API server fills a written runPolicy's defaults in, which would override the
  template's values with defaults the user never wrote.
- A field the runtime locks (spec.locked) may not be set by the job; locking a podTemplate
  field also locks it in the controller's and each role's podTemplate (which would override it
  on their pods), locking serviceAccountName also in the roles' pod templates.

The merged spec, without runtimeRef, is what the operator's builders receive; it is validated
as a whole, with the RLJob's own rules, and an error names where its value came from.
"""

from __future__ import annotations

import copy
from typing import Any

from rlkube_api.rljob import RLJob
from rlkube_api.roles import ALL_ROLES
from rlkube_api.runtime_ref import RuntimeSnapshot
from rlkube_api.validation import InvalidSpec, parse_rljob

REPLACED_WHOLE = frozenset({"pool", "runPolicy"})
# Lists merged by a key other than name.
LIST_KEYS = {"volumeMounts": "mountPath"}


class RuntimeConflict(ValueError):
    """The job sets fields its runtime locks; `fields` are their spec paths."""

    def __init__(self, fields: list[str], runtime: str) -> None:
        self.fields = fields
        self.runtime = runtime
        super().__init__(
            f"{', '.join('spec.' + f for f in fields)}: set by the job, but {runtime} locks "
            f"{'it' if len(fields) == 1 else 'them'} (its spec.locked)"
        )


def merge(template: Any, job: Any, key: str | None = None) -> Any:
    """The template with the job's values over it, by the rules above."""
    if key in REPLACED_WHOLE:
        return copy.deepcopy(job)
    if isinstance(template, dict) and isinstance(job, dict):
        out = copy.deepcopy(template)
        for k, v in job.items():
            out[k] = merge(template[k], v, k) if k in template else copy.deepcopy(v)
        return out
    if isinstance(template, list) and isinstance(job, list) and (item_key := _item_key(key, template + job)):
        by_key = {item[item_key]: copy.deepcopy(item) for item in template}
        by_key.update({item[item_key]: copy.deepcopy(item) for item in job})
        return list(by_key.values())
    return copy.deepcopy(job)


def _item_key(key: str | None, items: list[Any]) -> str | None:
    item_key = LIST_KEYS.get(key or "", "name")
    return item_key if all(isinstance(i, dict) and item_key in i for i in items) else None


def _get(spec: Any, path: str) -> Any:
    for step in path.split("."):
        if not isinstance(spec, dict) or step not in spec:
            return None
        spec = spec[step]
    return spec


def locked_overrides(locked: list[str], job: dict[str, Any]) -> list[str]:
    """The spec paths the job sets that `locked` forbids it."""
    found: list[str] = []
    for path in locked:
        candidates = [path]
        if path.startswith("podTemplate"):
            candidates += ["controller." + path, *(f"roles.{role}.{path}" for role in ALL_ROLES)]
        if path == "serviceAccountName":
            candidates += [f"roles.{role}.podTemplate.serviceAccountName" for role in ALL_ROLES]
        found += [c for c in candidates if _get(job, c) is not None and c not in found]
    return found


def describe_runtime(snapshot: RuntimeSnapshot) -> str:
    return f"{snapshot.kind} {snapshot.name}"


def merged_spec(job: dict[str, Any], snapshot: RuntimeSnapshot) -> dict[str, Any]:
    """The job's spec over its runtime's template, runtimeRef resolved away. Raises
    RuntimeConflict when the job sets a field the runtime locks."""
    spec = {k: v for k, v in job.items() if k != "runtimeRef"}
    conflicts = locked_overrides(snapshot.locked or [], spec)
    if conflicts:
        raise RuntimeConflict(conflicts, describe_runtime(snapshot))
    out: dict[str, Any] = merge(snapshot.template, spec)
    return out


def resolve(body: dict[str, Any], snapshot: RuntimeSnapshot, source: str, admitted: bool = False) -> RLJob:
    """The job as its builders see it: its spec merged over the runtime's template and
    validated with every rule an RLJob has (`admitted`: this very merge passed them before; types
    and bounds are still checked). Raises RuntimeConflict for a locked field, and InvalidSpec for
    a merged spec the rules refuse, each error naming where its value came from."""
    spec = merged_spec(body.get("spec") or {}, snapshot)
    resolved = {**body, "spec": spec}
    try:
        return parse_rljob(resolved, source, admitted=admitted)
    except InvalidSpec as exc:
        runtime = describe_runtime(snapshot)
        job = body.get("spec") or {}
        errors = [_with_origin(e, spec, job, snapshot.template, runtime) for e in exc.errors]
        raise InvalidSpec(f"{source} merged with {runtime}", errors) from None


def _with_origin(
    error: str, merged: dict[str, Any], job: dict[str, Any], template: dict[str, Any], runtime: str
) -> str:
    """'spec.a.b: message', told whether spec.a.b came from the job or the runtime's template."""
    path, _, message = error.partition(": ")
    parts = path.split(".")
    if parts[:1] != ["spec"] or len(parts) < 2:
        return error
    origin = _origin(parts[1:], merged, job, template)
    if origin == "runtime":
        return f"{path} (from {runtime} spec.template.{'.'.join(parts[1:])}): {message}"
    if origin == "job":
        return f"{path} (set by the job): {message}"
    return error


def _origin(parts: list[str], merged: Any, job: Any, template: Any) -> str | None:
    """Where the value at `parts` of the merged spec came from: 'job', 'runtime' or None (a
    rule on an object both gave parts of)."""
    key: str | None = None
    for step in parts:
        if isinstance(merged, list):
            if not step.isdigit() or int(step) >= len(merged):
                return None
            item = merged[int(step)]
            item_key = _item_key(key, merged)
            if item_key is not None:
                in_job = _named(job, item_key, item[item_key])
                in_template = _named(template, item_key, item[item_key])
            else:  # replaced whole: the job's, if it wrote the list
                in_job = item if isinstance(job, list) else None
                in_template = None if isinstance(job, list) else item
            merged = item
        else:
            merged = merged.get(step) if isinstance(merged, dict) else None
            in_job = job.get(step) if isinstance(job, dict) else None
            in_template = template.get(step) if isinstance(template, dict) else None
            if step in REPLACED_WHOLE and in_job is not None:
                return "job"
        if in_job is None and in_template is None:
            return None
        if in_job is None:
            return "runtime"
        if in_template is None:
            return "job"
        job, template, key = in_job, in_template, step
    return "job"


def _named(items: Any, item_key: str, value: Any) -> Any:
    if not isinstance(items, list):
        return None
    return next((i for i in items if isinstance(i, dict) and i.get(item_key) == value), None)
