"""The merge of a job over its runtime's template (runtime_merge), pure: what the template
gives, what the job overrides, what a runtime locks, the merged spec validated as a whole with
errors naming where a value came from; and the runtime models' own checks."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from rlkube_api.runtime import LOCKABLE, RLJobRuntime, RuntimeTemplate
from rlkube_api.runtime_merge import RuntimeConflict, locked_overrides, merge, resolve
from rlkube_api.runtime_ref import RuntimeSnapshot
from rlkube_api.validation import InvalidSpec, parse_rljob
from rlkube_operator.desired import desired_children
from tests.operator.helpers import CPU, GPU, RAY_TOKEN, UID, example

# The example's fields a platform team would own: moved into the runtime's template.
PLATFORM = ("image", "volumes", "runPolicy")


def _split(name: str, *fields: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the example as a job naming a runtime, the runtime's template of `fields`)."""
    job = example(name)
    job["metadata"] = {"name": "job", "namespace": "ml", "generation": 1}
    template = {f: job["spec"].pop(f) for f in fields if f in job["spec"]}
    job["spec"]["runtimeRef"] = {"name": "platform"}
    return job, template


def _snapshot(template: dict[str, Any], locked: list[str] | None = None) -> RuntimeSnapshot:
    return RuntimeSnapshot(kind="ClusterRLJobRuntime", name="platform", template=template, locked=locked)


@pytest.mark.parametrize("name", [CPU, GPU])
def test_a_template_field_takes_effect_as_the_jobs_own_would(name: str) -> None:
    """Every platform field, and each role's pool and pod template the example sets, moved from
    the job into the template: the builders make the same children."""
    original = example(name)
    original["metadata"] = {"name": "job", "namespace": "ml", "generation": 1}
    want = desired_children(parse_rljob(copy.deepcopy(original)), UID, 0, True, RAY_TOKEN)
    job, template = _split(name, *PLATFORM, "podTemplate")
    roles = {}
    for role, spec in job["spec"]["roles"].items():
        parts = {k: spec.pop(k) for k in ("pool", "podTemplate") if k in spec}
        if parts:
            roles[role] = parts
    if roles:
        template["roles"] = roles
    RuntimeTemplate.model_validate(template)  # a valid runtime template as written
    resolved = resolve(job, _snapshot(template), "RLJob ml/job")
    assert resolved.spec.runtime_ref is None
    assert desired_children(resolved, UID, 0, True, RAY_TOKEN) == want


def test_the_jobs_values_win_maps_merge_and_named_lists_merge_by_name() -> None:
    template = {
        "image": "platform:1",
        "env": [{"name": "A", "value": "runtime"}, {"name": "B", "value": "runtime"}],
        "podTemplate": {
            "labels": {"team": "platform", "tier": "x"},
            "volumeMounts": [{"name": "v", "mountPath": "/a"}],
        },
        "roles": {"actor": {"pool": {"nodeSelector": {"pool": "a100"}, "tolerations": [{"key": "gpu"}]}}},
    }
    job = {
        "image": "mine:2",
        "env": [{"name": "B", "value": "job"}, {"name": "C", "value": "job"}],
        "podTemplate": {"labels": {"tier": "y"}, "volumeMounts": [{"name": "w", "mountPath": "/a"}]},
        "roles": {"actor": {"replicas": 2, "pool": {"nodeSelector": {"pool": "h100"}}}},
    }
    assert merge(template, job) == {
        "image": "mine:2",
        "env": [{"name": "A", "value": "runtime"}, {"name": "B", "value": "job"}, {"name": "C", "value": "job"}],
        "podTemplate": {
            "labels": {"team": "platform", "tier": "y"},
            "volumeMounts": [{"name": "w", "mountPath": "/a"}],
        },
        # A pool is replaced whole: the template's tolerations do not follow the job's nodeSelector.
        "roles": {"actor": {"replicas": 2, "pool": {"nodeSelector": {"pool": "h100"}}}},
    }
    assert template["env"][1]["value"] == "runtime", "the template was changed in place"


def test_a_jobs_run_policy_replaces_the_runtimes_whole() -> None:
    template = {"runPolicy": {"backoffLimit": 9, "gang": {"scheduler": "volcano"}}}
    assert merge(template, {"runPolicy": {"backoffLimit": 1}}) == {"runPolicy": {"backoffLimit": 1}}
    assert merge(template, {}) == template


def test_locking_a_pod_template_field_locks_it_in_every_template_that_would_override_it() -> None:
    job = {
        "podTemplate": {"labels": {"a": "b"}},
        "controller": {"podTemplate": {"securityContext": {"privileged": True}}},
        "roles": {"rollout": {"podTemplate": {"serviceAccountName": "mine"}}, "actor": {"pool": {}}},
        "image": "x:1",
    }
    assert locked_overrides(["podTemplate.securityContext"], job) == ["controller.podTemplate.securityContext"]
    assert locked_overrides(["serviceAccountName"], job) == ["roles.rollout.podTemplate.serviceAccountName"]
    assert locked_overrides(["image", "podTemplate.env", "roles.actor.pool"], job) == ["image", "roles.actor.pool"]


def test_a_job_setting_a_locked_field_is_refused_naming_it_and_the_runtime() -> None:
    job, template = _split(CPU, *PLATFORM)
    job["spec"]["image"] = "mine:1"
    with pytest.raises(RuntimeConflict) as refused:
        resolve(job, _snapshot(template, ["image"]), "RLJob ml/job")
    assert str(refused.value).startswith("spec.image: set by the job, but ClusterRLJobRuntime platform locks it")


def test_a_bad_merge_is_refused_naming_whose_field_it_is() -> None:
    job, template = _split(CPU, *PLATFORM)
    template["volumes"][0]["name"] = "shm"  # a volume name the operator uses
    with pytest.raises(InvalidSpec) as refused:
        resolve(job, _snapshot(template), "RLJob ml/job")
    assert "merged with ClusterRLJobRuntime platform" in str(refused.value)
    assert "spec.volumes.0.name (from ClusterRLJobRuntime platform spec.template.volumes.0.name)" in str(refused.value)

    job, template = _split(CPU, *PLATFORM)
    job["spec"]["checkpoint"]["dir"] = "/elsewhere/ckpt"  # on no shared volume
    with pytest.raises(InvalidSpec) as refused:
        resolve(job, _snapshot(template), "RLJob ml/job")
    assert "spec.checkpoint.dir (set by the job): checkpoint.dir must be on storage every pod shares" in str(
        refused.value
    )


def test_a_job_without_image_needs_a_runtime_and_its_volume_rules_wait_for_the_merge() -> None:
    job, _ = _split(CPU, *PLATFORM)
    parse_rljob(job)  # admitted: the runtime may give the image and the checkpoint's volume
    del job["spec"]["runtimeRef"]
    with pytest.raises(InvalidSpec) as refused:
        parse_rljob(job)
    assert "spec.image: image is required (or a runtimeRef whose runtime sets it)" in str(refused.value)
    job["spec"]["image"] = "trainer:1"
    with pytest.raises(InvalidSpec, match=r"checkpoint\.dir must be on storage every pod shares"):
        parse_rljob(job)


def test_locked_entries_must_be_template_fields() -> None:
    assert {"image", "podTemplate.securityContext", "roles.rollout.pool", "runPolicy"} <= set(LOCKABLE)
    assert "roles.actor" not in LOCKABLE  # every job has it
    runtime = {"metadata": {"name": "r"}, "spec": {"locked": ["image", "spec.image"]}}
    with pytest.raises(ValidationError, match=r"spec\.image: each locked entry must be a field path of the template"):
        RLJobRuntime.model_validate(runtime)
    with pytest.raises(ValidationError, match="locked entries must be unique"):
        RLJobRuntime.model_validate({"metadata": {"name": "r"}, "spec": {"locked": ["image", "image"]}})
    RLJobRuntime.model_validate({"metadata": {"name": "r"}, "spec": {"locked": ["image"]}})


def test_a_runtime_template_is_checked_as_a_jobs_parts_are() -> None:
    bad = {
        "metadata": {"name": "r"},
        "spec": {"template": {"volumes": [{"name": "shm", "mountPath": "/x", "source": {"emptyDir": {}}}]}},
    }
    with pytest.raises(ValidationError, match="name is used by the operator"):
        RLJobRuntime.model_validate(bad)
