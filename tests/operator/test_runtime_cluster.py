"""Jobs written against a runtime (spec.runtimeRef), with the real API server and the
operator: the runtime's pod settings reach the StatefulSets; a job whose runtime does not
exist is held and starts once it is created, keeping the runtime it resolved when the runtime
changes later; a job that sets a field its runtime locks is held naming the field, and starts
once the field is removed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rlkube_e2e.testing import Kubectl
from tests.operator.cluster_kit import TINY_ROLES, Jobs, condition, tiny_job

pytestmark = pytest.mark.cluster

JOB = "on-runtime"
TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}


def _platform_parts(body: dict[str, Any]) -> dict[str, Any]:
    """The example's platform fields, taken out of the job: the runtime's template."""
    spec = body["spec"]
    return {"image": spec.pop("image"), "volumes": spec.pop("volumes"), "runPolicy": spec.pop("runPolicy")}


def _runtime(kind: str, name: str, template: dict[str, Any], locked: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": template}
    if locked:
        spec["locked"] = locked
    return {"apiVersion": "rlkube.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def cluster_runtime_name(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A ClusterRLJobRuntime name of this test's own, deleted afterwards."""
    name = f"{namespace}-rt"
    yield name
    kubectl("delete", "clusterrljobruntime", name, "--ignore-not-found", check=False)


def _held(reason: str) -> Any:
    def check(job: dict[str, Any]) -> bool:
        created = condition(job, "Created")
        return created is not None and created["reason"] == reason

    return check


def _created(job: dict[str, Any]) -> bool:
    created = condition(job, "Created")
    return created is not None and created["status"] == "True"


def test_a_job_waits_for_its_runtime_then_gets_its_pod_settings_and_keeps_them(
    jobs: Jobs, kubectl: Kubectl, cluster_runtime_name: str
) -> None:
    body = tiny_job(JOB, jobs.namespace)
    template = _platform_parts(body)
    template["podTemplate"] = {"labels": {"platform": "rl"}}
    template["roles"] = {"actor": {"pool": {"tolerations": [TOLERATION]}}}
    body["spec"]["runtimeRef"] = {"kind": "ClusterRLJobRuntime", "name": cluster_runtime_name}
    jobs.create(body)

    job = jobs.wait(JOB, _held("RuntimeNotFound"), "Created=False/RuntimeNotFound", timeout=10)
    created = condition(job, "Created")
    assert created is not None and created["status"] == "False"
    assert f"ClusterRLJobRuntime {cluster_runtime_name} (spec.runtimeRef) does not exist" in created["message"]
    assert job["status"]["state"] == "Pending"
    assert "runtime" not in job["status"]
    event = jobs.wait_event(JOB, "RuntimeNotFound", timeout=10)
    assert event["type"] == "Warning" and cluster_runtime_name in event["message"]
    assert not jobs.statefulsets(JOB)

    runtime = _runtime("ClusterRLJobRuntime", cluster_runtime_name, template)
    kubectl("create", "-f", "-", input=json.dumps(runtime))
    job = jobs.wait(JOB, _created, "Created=True once the runtime exists", timeout=15)
    assert job["status"]["runtime"]["name"] == cluster_runtime_name
    assert job["status"]["runtime"]["template"]["image"] == template["image"]
    sets = jobs.statefulsets(JOB)
    assert set(sets) == {f"{JOB}-{role}" for role in TINY_ROLES}
    for name, stateful_set in sets.items():
        pod = stateful_set["spec"]["template"]
        assert pod["metadata"]["labels"]["platform"] == "rl", name
        trainer = pod["spec"]["containers"][0]
        assert trainer["image"] == template["image"], name
        assert "/rlkube" in {m["mountPath"] for m in trainer["volumeMounts"]}, name
        tolerations = pod["spec"].get("tolerations") or []
        assert (TOLERATION in tolerations) == name.endswith("-actor"), (name, tolerations)

    # The runtime changes: the job keeps the copy it resolved (status.runtime).
    patch = {"spec": {"template": {"podTemplate": {"labels": {"platform": "other"}}}}}
    kubectl("patch", "clusterrljobruntime", cluster_runtime_name, "--type=merge", "-p", json.dumps(patch))
    time.sleep(2)  # the runtimes' watch wakes the job at once
    for name, stateful_set in jobs.statefulsets(JOB).items():
        assert stateful_set["spec"]["template"]["metadata"]["labels"]["platform"] == "rl", name


def test_a_job_setting_a_locked_field_is_held_naming_it_until_removed(jobs: Jobs, kubectl: Kubectl) -> None:
    body = tiny_job(JOB, jobs.namespace)
    template = _platform_parts(body)
    runtime = _runtime("RLJobRuntime", "locked", template, locked=["image", "podTemplate.securityContext"])
    kubectl("create", "-n", jobs.namespace, "-f", "-", input=json.dumps(runtime))
    body["spec"]["runtimeRef"] = {"kind": "RLJobRuntime", "name": "locked"}
    body["spec"]["image"] = "someone-elses:image"
    body["spec"]["roles"]["actor"]["podTemplate"] = {"securityContext": {"runAsNonRoot": True}}
    jobs.create(body)

    job = jobs.wait(JOB, _held("RuntimeFieldLocked"), "Created=False/RuntimeFieldLocked", timeout=10)
    message = condition(job, "Created")["message"]  # type: ignore[index]
    assert "spec.image, spec.roles.actor.podTemplate.securityContext" in message, message
    assert "RLJobRuntime locked locks them" in message, message
    assert jobs.wait_event(JOB, "RuntimeFieldLocked", timeout=10)["type"] == "Warning"
    assert not jobs.statefulsets(JOB)

    jobs.patch(JOB, {"spec": {"image": None, "roles": {"actor": {"podTemplate": None}}}})
    jobs.wait(JOB, _created, "Created=True once the locked fields are gone", timeout=15)
    sets = jobs.statefulsets(JOB)
    assert {s["spec"]["template"]["spec"]["containers"][0]["image"] for s in sets.values()} == {template["image"]}
