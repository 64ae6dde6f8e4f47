"""Security against the real API server, with the operator running in-process: trainer pods
admitted where the "restricted" Pod Security Standard is enforced, the optional NetworkPolicy,
and secrets that reach pods only by reference (never copied into what the operator writes)."""

from __future__ import annotations

import base64
import json
import logging
import secrets

import pytest
import yaml

from rlkube_api.names import LABEL_JOB
from rlkube_e2e.testing import Kubectl
from rlkube_operator.children.secret import TOKEN_KEY, ray_secret_name_of
from tests.operator.cluster_kit import TINY_PODS, Jobs, tiny_job

pytestmark = pytest.mark.cluster

JOB = "tiny"
# "restricted" refuses the example's hostPath; a job there keeps its data on other volume types.
NO_HOST_PATH = {"spec.volumes": [{"name": "work", "mountPath": "/rlkube", "source": {"emptyDir": {}}}]}


def _enforce_restricted(kubectl: Kubectl, namespace: str) -> None:
    kubectl(
        "label",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )


def test_trainer_pods_pass_the_restricted_pod_security_standard(jobs: Jobs, kubectl: Kubectl) -> None:
    _enforce_restricted(kubectl, jobs.namespace)
    # The namespace does enforce it: a pod like the trainer's but running as root is refused.
    root_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "root", "namespace": jobs.namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    refused = kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(root_pod), check=False)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted' in refused.stderr, refused.stderr

    jobs.create(tiny_job(JOB, jobs.namespace, NO_HOST_PATH))
    jobs.wait_running(JOB)
    pods = jobs.wait_pods(JOB, TINY_PODS)
    assert len(pods) == TINY_PODS
    failed = [
        e
        for e in json.loads(kubectl("get", "events", "-n", jobs.namespace, "-o", "json").stdout)["items"]
        if e.get("reason") == "FailedCreate"
    ]
    assert failed == []


def test_the_network_policy_is_a_child_of_the_job(jobs: Jobs, kubectl: Kubectl) -> None:
    """On by default: a job that says nothing of it gets its policy."""
    created = jobs.create(tiny_job(JOB, jobs.namespace))
    assert created["spec"]["networkPolicy"]["enabled"] is True  # the server's default
    jobs.wait_running(JOB)
    out = kubectl("get", "networkpolicy", f"{JOB}-network", "-n", jobs.namespace, "-o", "json").stdout
    policy = json.loads(out)
    assert policy["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert policy["spec"]["podSelector"] == {"matchLabels": {LABEL_JOB: JOB}}
    # Switching it off later is refused (the operator never prunes a child).
    patch = json.dumps({"spec": {"networkPolicy": {"enabled": False}}})
    result = kubectl("patch", "rljob", JOB, "-n", jobs.namespace, "--type=merge", "-p", patch, check=False)
    assert result.returncode != 0 and "enabled is immutable" in result.stderr


def test_secrets_reach_pods_only_by_reference(jobs: Jobs, kubectl: Kubectl, caplog: pytest.LogCaptureFixture) -> None:
    """Neither the user's image-pull Secret nor the job's Ray token appears in anything the
    operator wrote: ConfigMaps, the job's status, Events, its children's specs, its log."""
    caplog.set_level(logging.DEBUG)
    pull_secret = "registry-creds"
    user_value = f"user-secret-{secrets.token_hex(16)}"
    kubectl("create", "secret", "generic", pull_secret, "-n", jobs.namespace, f"--from-literal=token={user_value}")
    jobs.create(tiny_job(JOB, jobs.namespace, {"spec.imagePullSecrets": [{"name": pull_secret}]}))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)
    ray_secret = json.loads(
        kubectl("get", "secret", ray_secret_name_of(JOB), "-n", jobs.namespace, "-o", "json").stdout
    )
    ray_token = base64.b64decode(ray_secret["data"][TOKEN_KEY]).decode()
    assert len(ray_token) >= 16

    written = {
        kind: kubectl("get", kind, "-n", jobs.namespace, "-o", "yaml").stdout
        for kind in ("configmaps", "rljobs", "events", "statefulsets", "services", "serviceaccounts", "roles", "pods")
    }
    written["operator log"] = caplog.text
    assert any(JOB in r.getMessage() for r in caplog.records), "the operator's log was not captured"
    for what, text in written.items():
        for value, name in ((ray_token, "the Ray token"), (user_value, "the user's Secret")):
            assert value not in text, f"{name} is copied into {what}"
            assert base64.b64encode(value.encode()).decode() not in text, f"{name} (base64) is in {what}"
    # The pods get the token by reference, and the pull Secret by name.
    for sts in yaml.safe_load(written["statefulsets"])["items"]:
        pod = sts["spec"]["template"]["spec"]
        [token_env] = [e for e in pod["containers"][0]["env"] if e["name"] == "RAY_AUTH_TOKEN"]
        assert token_env == {
            "name": "RAY_AUTH_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": ray_secret_name_of(JOB), "key": TOKEN_KEY}},
        }
        assert pod["imagePullSecrets"] == [{"name": pull_secret}]
