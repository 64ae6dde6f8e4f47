"""The operator's side of runtime templates, pure: a job resolved against the runtime copy in
its status rather than the runtime as it is now; a held job's status and its one Event; an
unchanged merge not checked twice, a changed one checked again."""

from __future__ import annotations

import copy
from typing import Any

from rlkube_api.rljob import RLJob
from rlkube_operator.runtimes import (
    INVALID_MERGED_SPEC,
    RUNTIME_NOT_FOUND,
    Held,
    held_status,
    resolve_checked,
    resolve_job,
)
from tests.operator.helpers import CPU, at, example


def _job() -> dict[str, Any]:
    job = example(CPU)
    job["metadata"] = {"name": "job", "namespace": "ml", "generation": 1, "uid": "u"}
    job["spec"].pop("image")
    job["spec"]["runtimeRef"] = {"kind": "RLJobRuntime", "name": "platform"}
    return job


def _runtime(image: str) -> dict[str, Any]:
    return {
        "kind": "RLJobRuntime",
        "metadata": {"name": "platform", "generation": 3},
        "spec": {"template": {"image": image}},
    }


def test_the_copy_in_the_status_wins_over_the_runtime_as_it_is_now() -> None:
    first = resolve_job(_job(), lambda *_: _runtime("v1:1"))
    assert isinstance(first, RLJob) and first.spec.image == "v1:1"
    assert first.status is not None and first.status.runtime is not None
    assert (first.status.runtime.name, first.status.runtime.generation) == ("platform", 3)
    later = _job()
    later["status"] = first.status.to_wire()
    again = resolve_job(later, lambda *_: _runtime("v2:1"))  # the runtime changed since
    assert isinstance(again, RLJob) and again.spec.image == "v1:1"


def test_a_missing_runtime_holds_the_job_with_one_event() -> None:
    held = resolve_job(_job(), lambda *_: None)
    assert held == Held(
        RUNTIME_NOT_FOUND,
        "RLJobRuntime platform (spec.runtimeRef) does not exist in namespace ml: the job starts once it is created",
    )
    status, events = held_status(_job(), held, at(0))
    assert status.state == "Pending"
    created = status.conditions[-1]
    assert (created.type, created.status, created.reason) == ("Created", "False", RUNTIME_NOT_FOUND)
    assert [(e.type, e.reason) for e in events] == [("Warning", RUNTIME_NOT_FOUND)]
    body = {**_job(), "status": status.to_wire()}
    again, events = held_status(body, held, at(30))
    assert not events, "the same hold again is no news"
    assert again.conditions[-1].last_transition_time == created.last_transition_time


def test_an_unchanged_merge_is_checked_once_and_a_changed_one_again() -> None:
    read = lambda *_: _runtime("v1:1")  # noqa: E731
    resolved = resolve_checked(_job(), read, None)
    assert not isinstance(resolved, Held)
    _, checked = resolved
    same = resolve_checked(_job(), read, checked)
    assert not isinstance(same, Held) and same[1] == checked
    broken = copy.deepcopy(_job())
    broken["spec"]["checkpoint"]["dir"] = "/nowhere/shared"
    held = resolve_checked(broken, read, checked)
    assert isinstance(held, Held) and held.reason == INVALID_MERGED_SPEC
    assert "spec.checkpoint.dir (set by the job)" in held.message
