"""A job written against a runtime (spec.runtimeRef): its runtime found, copied into its status
and merged under its spec (rlkube_api.runtime_merge) before anything else reads the job; or the
job held, with a condition and an Event naming why.

CEL cannot read other objects, so the API server admits a job whose runtime does not exist, or
which sets a field its runtime locks. Such a job is held: status.state Pending (a started job
keeps its state and its pods), Created=False with the reason, and no child is made or changed.
It goes on by itself once the runtime appears (the runtimes are watched) or the spec is fixed.

The runtime is copied into status.runtime on the first pass that finds it, and the job uses
that copy from then on: editing or deleting a runtime changes no job that has already resolved
it; jobs created after the edit get the new template.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rlkube_api.conditions import ConditionType, State
from rlkube_api.rljob import Condition, RLJob, RLJobStatus
from rlkube_api.runtime_merge import RuntimeConflict, resolve
from rlkube_api.runtime_ref import RuntimeSnapshot
from rlkube_api.validation import InvalidSpec
from rlkube_operator.job_state import Manifest, digest
from rlkube_operator.plan import Event

RUNTIME_NOT_FOUND = "RuntimeNotFound"
RUNTIME_FIELD_LOCKED = "RuntimeFieldLocked"
INVALID_MERGED_SPEC = "InvalidMergedSpec"

# Reads a runtime: (kind, namespace, name) -> the object, or None when it does not exist.
ReadRuntime = Callable[[str, str, str], Manifest | None]


@dataclass(frozen=True)
class Held:
    """Why a job cannot be resolved against its runtime now."""

    reason: str
    message: str


def runtime_ref(body: Manifest) -> tuple[str, str] | None:
    """(kind, name) of the job's runtimeRef, or None."""
    ref = (body.get("spec") or {}).get("runtimeRef")
    if not isinstance(ref, dict):
        return None
    return str(ref.get("kind") or "ClusterRLJobRuntime"), str(ref.get("name") or "")


def snapshot_of(runtime: Manifest) -> RuntimeSnapshot:
    spec = runtime.get("spec") or {}
    return RuntimeSnapshot(
        kind=runtime["kind"],
        name=runtime["metadata"]["name"],
        generation=runtime["metadata"].get("generation"),
        template=spec.get("template") or {},
        locked=spec.get("locked"),
    )


def with_runtime(body: Manifest, read: ReadRuntime) -> tuple[Manifest, RuntimeSnapshot] | Held:
    """The job's body with its runtime's copy in status.runtime: the copy already there, or the
    runtime as it is now (read once, on the pass that first finds it)."""
    ref = runtime_ref(body)
    assert ref is not None
    status = body.get("status") or {}
    if status.get("runtime"):
        snapshot = RuntimeSnapshot.model_validate(status["runtime"])
        if (snapshot.kind, snapshot.name) == ref:
            return body, snapshot
    kind, name = ref
    namespace = body["metadata"]["namespace"]
    found = read(kind, namespace, name)
    if found is None:
        where = f" in namespace {namespace}" if kind == "RLJobRuntime" else ""
        return Held(
            RUNTIME_NOT_FOUND,
            f"{kind} {name} (spec.runtimeRef) does not exist{where}: the job starts once it is created",
        )
    snapshot = snapshot_of(found)
    copied = {**status, "runtime": snapshot.to_wire()}
    return {**body, "status": copied}, snapshot


def resolve_job(body: Manifest, read: ReadRuntime) -> RLJob | Held:
    """The job as the builders see it: its spec merged over its runtime's template (the copy in
    its status, else the runtime as it is now, then copied), checked with every RLJob rule."""
    resolved = resolve_checked(body, read, None)
    return resolved if isinstance(resolved, Held) else resolved[0]


def resolve_checked(body: Manifest, read: ReadRuntime, checked: str | None) -> tuple[RLJob, str] | Held:
    """resolve_job, and the digest of what was merged (the job's spec and the runtime's copy).
    The rules' CEL is most of a pass's CPU time: when the digest is `checked` (the same merge
    passed them on an earlier pass), only types and bounds are checked again."""
    found = with_runtime(body, read)
    if isinstance(found, Held):
        return found
    copied, snapshot = found
    meta = body["metadata"]
    merged = digest({"spec": body.get("spec") or {}, "runtime": snapshot.to_wire()})
    try:
        job = resolve(copied, snapshot, f"RLJob {meta['namespace']}/{meta['name']}", admitted=merged == checked)
    except RuntimeConflict as exc:
        return Held(RUNTIME_FIELD_LOCKED, f"{exc}: remove it from the job's spec")
    except InvalidSpec as exc:
        return Held(INVALID_MERGED_SPEC, f"{exc.source}: " + "; ".join(exc.errors))
    return job, merged


def held_status(body: Manifest, held: Held, now: datetime) -> tuple[RLJobStatus, list[Event]]:
    """The status of a held job: Created=False naming why (its transition time kept while it
    stays False), Pending unless the job has started; an Event when the reason or message is new."""
    raw: dict[str, Any] = body.get("status") or {}
    status = RLJobStatus.model_validate(raw)
    if status.state is None:
        status.state = State.PENDING.value
    old = next((c for c in status.conditions if c.type == ConditionType.CREATED), None)
    unchanged = old is not None and old.status == "False"
    stamp = (
        old.last_transition_time
        if unchanged and old is not None
        else now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    )
    created = Condition(
        type=ConditionType.CREATED.value,
        status="False",
        reason=held.reason,
        message=held.message,
        last_transition_time=stamp,
        observed_generation=body["metadata"].get("generation"),
    )
    status.conditions = [c for c in status.conditions if c.type != ConditionType.CREATED] + [created]
    new = old is None or (old.reason, old.message) != (held.reason, held.message)
    return status, [Event("Warning", held.reason, held.message)] if new else []
