"""Pod template overrides in the API: what the operator owns is refused naming the
field, by pydantic and by the real API server alike; a full template is accepted."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
import yaml

from rlkube_api.validation import InvalidSpec, parse_rljob
from tests.api.cases import Case, _all, _set, example

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

SECRET = {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
TEMPLATE = "spec.podTemplate"
ACTOR = "spec.roles.actor.podTemplate"

REFUSED = [
    Case("rendezvous-env", _set(TEMPLATE, {"env": [{"name": "MASTER_ADDR", "value": "x"}]}), ("spec.podTemplate.env", "MASTER_ADDR")),
    Case("ray-token-env", _set(ACTOR, {"env": [{"name": "RAY_AUTH_TOKEN", "valueFrom": SECRET}]}), ("spec.roles.actor.podTemplate.env", "may not set a variable")),
    Case("env-two-sources", _set(TEMPLATE, {"env": [{"name": "A", "valueFrom": {**SECRET, "fieldRef": {"fieldPath": "metadata.name"}}}]}), ("spec.podTemplate.env", "exactly one of secretKeyRef")),
    Case("env-value-and-value-from", _set(TEMPLATE, {"env": [{"name": "A", "value": "x", "valueFrom": SECRET}]}), ("spec.podTemplate.env", "not both")),
    Case("env-names-repeat", _set(TEMPLATE, {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}), ("spec.podTemplate.env", "names must be unique")),
    Case("operator-volume", _set(TEMPLATE, {"volumes": [{"name": "shm", "emptyDir": {}}]}), ("spec.podTemplate.volumes", "name is used by the operator")),
    Case("operator-mount-path", _set(ACTOR, {"volumeMounts": [{"name": "x", "mountPath": "/etc/rlkube"}]}), ("spec.roles.actor.podTemplate.volumeMounts", "mountPath is used by the operator")),
    Case("operator-label", _set(TEMPLATE, {"labels": {"rlkube.dev/role": "actor"}}), ("spec.podTemplate.labels", "are the operator's")),
    Case("operator-annotation", _set(ACTOR, {"annotations": {"rlkube.dev/attempt": "9"}}), ("spec.roles.actor.podTemplate.annotations", "are the operator's")),
    Case("gpu-resource", _set(ACTOR, {"resources": {"limits": {"nvidia.com/gpu": "8"}}}), ("spec.roles.actor.podTemplate.resources.limits", "gpusPerReplica")),
    Case("memory-resource", _set(TEMPLATE, {"resources": {"requests": {"memory": "1Gi"}}}), ("spec.podTemplate.resources.requests", "resources")),
    Case("trainer-sidecar", _set(TEMPLATE, {"sidecars": [{"name": "trainer", "image": "x"}]}), ("spec.podTemplate.sidecars", "the container named trainer is the operator's")),
    Case("job-service-account", _set(TEMPLATE, {"serviceAccountName": "x"}), ("spec.podTemplate.serviceAccountName", "spec.serviceAccountName")),
    Case("controller-service-account", _set("spec.controller.podTemplate", {"serviceAccountName": "x"}), ("spec.controller.podTemplate.serviceAccountName",)),
    Case("colocated-role-template", _set("spec.roles.reference.podTemplate", {"labels": {"a": "b"}}), ("spec.roles.reference.podTemplate", "has no pods")),
    Case("command", _set(TEMPLATE, {"command": ["sh"]}), ("spec.podTemplate.command",)),
]  # fmt: skip

CM = {"name": "cfg", "key": "a"}
VOLUME = {"name": "extra", "emptyDir": {}}
# What the core API refuses only when the operator creates a StatefulSet or the kubelet a pod:
# names, keys, paths and enumerations of the template's fields, refused at admission instead.
CORE_RULES = [
    Case("secret-name", _set(TEMPLATE, {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "Wandb", "key": "k"}}}]}), ("spec.podTemplate.env", "secretKeyRef.name")),
    Case("secret-key-dotdot", _set(TEMPLATE, {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "w", "key": "..k"}}}]}), ("spec.podTemplate.env", "secretKeyRef.key", "not starting with '..'")),
    Case("config-map-key-slash", _set(TEMPLATE, {"env": [{"name": "A", "valueFrom": {"configMapKeyRef": {**CM, "key": "a/b"}}}]}), ("spec.podTemplate.env", "configMapKeyRef.key")),
    Case("env-name", _set(TEMPLATE, {"env": [{"name": "MY VAR", "value": "1"}]}), ("spec.podTemplate.env", "name")),
    Case("field-path", _set(TEMPLATE, {"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodename"}}}]}), ("spec.podTemplate.env", "fieldRef.fieldPath")),
    Case("field-path-version", _set(TEMPLATE, {"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name", "apiVersion": "v2"}}}]}), ("spec.podTemplate.env", "fieldRef.apiVersion")),
    Case("resource-field", _set(TEMPLATE, {"env": [{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}}]}), ("spec.podTemplate.env", "resourceFieldRef.resource")),
    Case("cpu-divisor", _set(TEMPLATE, {"env": [{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1Mi"}}}]}), ("spec.podTemplate.env", "resourceFieldRef.divisor", "1m or 1")),
    Case("memory-divisor", _set(TEMPLATE, {"env": [{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "divisor": "3Mi"}}}]}), ("spec.podTemplate.env", "resourceFieldRef.divisor", "1Ki")),
    Case("label-key", _set(TEMPLATE, {"labels": {"team/cost/center": "a"}}), ("spec.podTemplate.labels", "qualified names")),
    Case("label-value", _set(TEMPLATE, {"labels": {"team": "a b"}}), ("spec.podTemplate.labels",)),
    Case("annotation-key", _set(ACTOR, {"annotations": {"-bad": "x"}}), ("spec.roles.actor.podTemplate.annotations", "qualified names")),
    Case("gate-name", _set(TEMPLATE, {"schedulingGates": [{"name": "example.com/a/b"}]}), ("spec.podTemplate.schedulingGates", "qualified name")),
    Case("priority-class", _set(TEMPLATE, {"priorityClassName": "High"}), ("spec.podTemplate.priorityClassName",)),
    Case("service-account", _set(ACTOR, {"serviceAccountName": "Trainer"}), ("spec.roles.actor.podTemplate.serviceAccountName",)),
    Case("sidecar-image-missing", _set(TEMPLATE, {"sidecars": [{"name": "log"}]}), ("spec.podTemplate.sidecars", "image")),
    Case("sidecar-image", _set(TEMPLATE, {"sidecars": [{"name": "log", "image": "Fluent/Bit"}]}), ("spec.podTemplate.sidecars", "image")),
    Case("mount-unknown-volume", _set(ACTOR, {"volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}), ("spec.roles.actor.podTemplate.volumeMounts", "must name a volume")),
    Case("job-mount-role-volume", _all(_set(ACTOR, {"volumes": [VOLUME]}), _set("spec.podTemplate.volumeMounts", [{"name": "extra", "mountPath": "/x"}])), ("spec.podTemplate.volumeMounts", "must name a volume")),
    Case("mount-sub-path", _set(TEMPLATE, {"volumes": [VOLUME], "volumeMounts": [{"name": "extra", "mountPath": "/x", "subPath": "a/../../etc"}]}), ("spec.podTemplate.volumeMounts", "subPath", "without '..'")),
    Case("mount-propagation", _set(TEMPLATE, {"volumes": [VOLUME], "volumeMounts": [{"name": "extra", "mountPath": "/x", "mountPropagation": "Shared"}]}), ("spec.podTemplate.volumeMounts", "mountPropagation")),
    Case("volume-two-sources", _set(TEMPLATE, {"volumes": [{"name": "x", "emptyDir": {}, "configMap": {"name": "c"}}]}), ("spec.podTemplate.volumes", "exactly one volume source")),
    Case("volume-no-source", _set(TEMPLATE, {"volumes": [{"name": "x"}]}), ("spec.podTemplate.volumes", "exactly one volume source")),
    Case("volume-unknown-source", _set(TEMPLATE, {"volumes": [{"name": "x", "emptydir": {}}]}), ("spec.podTemplate.volumes", "emptydir")),
    Case("volume-item-path", _set(TEMPLATE, {"volumes": [{"name": "x", "configMap": {"name": "c", "items": [{"key": "a", "path": "/etc/a"}]}}]}), ("spec.podTemplate.volumes", "items", "path")),
    Case("volume-mode", _set(TEMPLATE, {"volumes": [{"name": "x", "secret": {"secretName": "s", "defaultMode": 1000}}]}), ("spec.podTemplate.volumes", "defaultMode")),
    Case("volume-claim-name", _set("spec.volumes", [{"name": "m", "mountPath": "/m", "source": {"persistentVolumeClaim": {"claimName": "My_Models"}}}]), ("spec.volumes", "claimName")),
    Case("volume-host-path", _set("spec.volumes", [{"name": "m", "mountPath": "/m", "source": {"hostPath": {"path": "/data/../etc"}}}]), ("spec.volumes", "hostPath.path")),
    Case("volume-host-path-type", _set("spec.volumes", [{"name": "m", "mountPath": "/m", "source": {"hostPath": {"path": "/d", "type": "Dir"}}}]), ("spec.volumes", "hostPath.type")),
    Case("volume-size-limit", _set(TEMPLATE, {"volumes": [{"name": "x", "emptyDir": {"sizeLimit": "-1Gi"}}]}), ("spec.podTemplate.volumes", "sizeLimit")),
    Case("checkpoint-volume-sources", _set("spec.checkpoint.volume", {"persistentVolumeClaim": {"claimName": "c"}, "emptyDir": {}}), ("spec.checkpoint.volume", "exactly one volume source")),
]  # fmt: skip
REFUSED += CORE_RULES
# Security settings that cannot combine with the operator's own (the restricted Pod Security
# Standard's: allowPrivilegeEscalation false, runAsNonRoot), or that the core API does not know.
SECURITY = [
    Case("privileged", _set(TEMPLATE, {"securityContext": {"privileged": True}}), ("spec.podTemplate.securityContext.privileged", "allowPrivilegeEscalation: true")),
    Case("role-privileged", _set(ACTOR, {"securityContext": {"privileged": True, "allowPrivilegeEscalation": False}}), ("spec.roles.actor.podTemplate.securityContext.privileged",)),
    Case("sys-admin", _set(TEMPLATE, {"securityContext": {"capabilities": {"add": ["IPC_LOCK", "CAP_SYS_ADMIN"]}}}), ("spec.podTemplate.securityContext.capabilities.add", "SYS_ADMIN")),
    Case("root-container", _set("spec.controller.podTemplate", {"securityContext": {"runAsUser": 0}}), ("spec.controller.podTemplate.securityContext.runAsUser", "runAsNonRoot: false")),
    Case("root-pod", _set(TEMPLATE, {"podSecurityContext": {"runAsUser": 0}}), ("spec.podTemplate.podSecurityContext.runAsUser", "runAsNonRoot: false")),
    Case("unknown-key", _set(TEMPLATE, {"securityContext": {"privilegd": True}}), ("spec.podTemplate.securityContext", "privilegd")),
    Case("wrong-type", _set(TEMPLATE, {"securityContext": {"privileged": "yes"}}), ("spec.podTemplate.securityContext.privileged",)),
    Case("seccomp-type", _set(TEMPLATE, {"podSecurityContext": {"seccompProfile": {"type": "runtime/default"}}}), ("spec.podTemplate.podSecurityContext.seccompProfile.type",)),
    Case("negative-group", _set(TEMPLATE, {"podSecurityContext": {"fsGroup": -1}}), ("spec.podTemplate.podSecurityContext.fsGroup",)),
]  # fmt: skip
REFUSED += SECURITY


def test_security_settings_that_combine_with_the_operators_are_accepted() -> None:
    allowed = {"privileged": True, "allowPrivilegeEscalation": True, "capabilities": {"add": ["IPC_LOCK"]}}
    job = example("tiny-cpu.yaml")
    _set(TEMPLATE, {"securityContext": allowed, "podSecurityContext": {"runAsUser": 0, "runAsNonRoot": False}})(job)
    template = parse_rljob(job).spec.pod_template
    assert template is not None and template.to_wire()["securityContext"] == allowed


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.id)
def test_pydantic_refuses_what_the_operator_owns_naming_the_field(case: Case) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_rljob(case.job())
    text = "\n".join(caught.value.errors).replace(".0.", ".")
    for field in case.fields:
        assert field in text, text


def test_the_example_is_valid() -> None:
    job = parse_rljob(example("pod-template.yaml"))
    assert job.spec.pod_template is not None
    assert job.spec.roles.actor.pod_template is not None


def _server_error(kubectl: Kubectl, namespace: str, case: Case) -> str | None:
    result = kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(case.job()), check=False
    )
    return None if result.returncode == 0 else result.stderr


@pytest.mark.cluster
@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.id)
def test_the_api_server_refuses_what_the_operator_owns_naming_the_field(
    kubectl: Kubectl, rljob_crd: None, namespace: str, case: Case
) -> None:
    error = _server_error(kubectl, namespace, case)
    assert error is not None, f"{case.id}: the API server accepted it"
    flat = error.replace("[0]", "")
    for field in case.fields:
        assert field in flat, f"{case.id}: expected {field!r} in:\n{error}"
