"""Pod template overrides through the real API server and the operator: the RLJob is
admitted, the StatefulSets it gets carry the overrides, and the pods kwok runs from
them have the Secret-backed env, the extra resources and the sidecar."""

from __future__ import annotations

import json

import pytest

from rlkube_api.names import LABEL_ROLE
from rlkube_e2e.testing import wait_for
from tests.operator.cluster_kit import TINY_ROLES, Jobs, Obj, tiny_job

pytestmark = pytest.mark.cluster

JOB = "tiny-tpl"
SECRET_ENV = {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}


def _overrides() -> dict[str, object]:
    return {
        "spec.podTemplate": {
            "labels": {"team": "rl"},
            "annotations": {"example.com/owner": "rl-team"},
            "env": [SECRET_ENV, {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
            "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1000},
            "securityContext": {"allowPrivilegeEscalation": False},
            "volumes": [{"name": "cache", "emptyDir": {}}],
            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
            ],
        },
        "spec.roles.actor.podTemplate": {
            "labels": {"team": "actor"},
            "resources": {"requests": {"rdma/ib": "1"}, "limits": {"rdma/ib": "1"}},
            "initContainers": [{"name": "warm", "image": "busybox", "command": ["true"]}],
            "sidecars": [{"name": "log-shipper", "image": "fluent-bit", "command": ["sleep", "infinity"]}],
            "imagePullSecrets": [{"name": "extra-registry"}],
            "priorityClassName": "system-cluster-critical",
            "serviceAccountName": "actor-sa",
        },
    }


def _templates(jobs: Jobs, name: str) -> dict[str, Obj]:
    """role -> its StatefulSet's pod template, once every role has one."""

    def probe() -> dict[str, Obj] | None:
        sets = jobs.statefulsets(name).values()
        found = {s["metadata"]["labels"][LABEL_ROLE]: s["spec"]["template"] for s in sets}
        return found if set(found) == set(TINY_ROLES) else None

    return wait_for(probe, f"the StatefulSets of {name}", timeout=30)


def _pod(jobs: Jobs, name: str, role: str) -> Obj:
    def probe() -> Obj | None:
        pods = [p for p in jobs.pods(name) if p["metadata"]["labels"].get(LABEL_ROLE) == role]
        return pods[0] if pods else None

    return wait_for(probe, f"a {role} pod of {name}", timeout=30)


def test_the_statefulsets_and_their_pods_carry_the_overrides(jobs: Jobs) -> None:
    jobs.core.create_namespaced_secret(
        jobs.namespace, {"metadata": {"name": "wandb"}, "stringData": {"api-key": "sk-test"}}
    )
    jobs.core.create_namespaced_service_account(jobs.namespace, {"metadata": {"name": "actor-sa"}})
    jobs.core.create_namespaced_secret(jobs.namespace, {"metadata": {"name": "extra-registry"}})
    # kwok's fake nodes have no rdma/ib: the actor stays Pending, which is all this needs.
    jobs.create(tiny_job(JOB, jobs.namespace, _overrides()))
    by_role = _templates(jobs, JOB)
    for role, template in by_role.items():
        pod = template["spec"]
        trainer = next(c for c in pod["containers"] if c["name"] == "trainer")
        env = {e["name"]: e for e in trainer["env"]}
        assert env["WANDB_API_KEY"] == SECRET_ENV, role
        assert env["NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert template["metadata"]["annotations"]["example.com/owner"] == "rl-team"
        # Key by key over the "restricted" defaults.
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
        assert trainer["securityContext"]["allowPrivilegeEscalation"] is False
        assert {"name": "cache", "emptyDir": {}} in pod["volumes"]
        assert {"name": "cache", "mountPath": "/cache"} in trainer["volumeMounts"]
        assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    actor = by_role["actor"]
    trainer = actor["spec"]["containers"][0]
    assert actor["metadata"]["labels"]["team"] == "actor"
    assert by_role["controller"]["metadata"]["labels"]["team"] == "rl"
    assert trainer["resources"]["limits"]["rdma/ib"] == "1"
    assert [c["name"] for c in actor["spec"]["containers"]] == ["trainer", "log-shipper"]
    assert [c["name"] for c in actor["spec"]["initContainers"]] == ["warm"]
    assert actor["spec"]["imagePullSecrets"] == [{"name": "extra-registry"}]
    assert actor["spec"]["serviceAccountName"] == "actor-sa"
    assert actor["spec"]["priorityClassName"] == "system-cluster-critical"
    assert by_role["rollout"]["spec"]["serviceAccountName"] == f"{JOB}-trainer"

    # The pods the StatefulSet controller creates from them: the API server admitted each.
    assert _pod(jobs, JOB, "controller")["metadata"]["labels"]["team"] == "rl"
    actor_pod = _pod(jobs, JOB, "actor")
    assert actor_pod["spec"]["priority"] == 2000000000, "the PriorityClass was resolved"
    assert [c["name"] for c in actor_pod["spec"]["containers"]] == ["trainer", "log-shipper"]
    assert actor_pod["spec"]["containers"][0]["resources"]["requests"]["rdma/ib"] == "1"


def test_a_job_with_a_colocated_roles_template_is_refused_by_the_api_server(jobs: Jobs) -> None:
    body = tiny_job(JOB, jobs.namespace, {"spec.roles.reference": {"colocateWith": "actor", "podTemplate": {}}})
    result = jobs.kubectl("create", "-n", jobs.namespace, "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode != 0
    assert "spec.roles.reference.podTemplate" in result.stderr
