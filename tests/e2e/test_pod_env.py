"""rlkube_e2e.pod_env: a container's environment resolved as the kubelet does (used by
bench/gpu/local_pods.py)."""

from __future__ import annotations

import pytest

from rlkube_e2e.pod_env import ConfigError, container_env, decode_secret, expand


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-x", "1-x"),
        ("$$(A)", "$(A)"),
        ("$(UNSET)", "$(UNSET)"),
        ("$(A", "$(A"),
        ("a$b$", "a$b$"),
        ("$(A)$(B)", "12"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "2"}) == expected


def _lookup(kind: str, name: str) -> dict[str, str] | None:
    objects = {("configmap", "settings"): {"MODE": "fast", "bad name": "x"}, ("secret", "wandb"): {"api-key": "sk"}}
    return objects.get((kind, name))


def test_a_containers_environment_in_the_kubelets_order() -> None:
    pod = {"metadata": {"name": "job-actor-0", "namespace": "ns", "labels": {"rank": "3"}}}
    container = {
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['rank']"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "URL", "value": "http://$(IP):80/$(CFG_MODE)"},
            {"name": "OPTIONAL", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}},
        ],
    }
    env = container_env(pod, container, _lookup, "10.0.0.5", "10.0.0.1", {"PATH": "/bin"})
    assert env == {
        "PATH": "/bin",
        "CFG_MODE": "fast",  # "bad name" is no variable name: skipped, as the kubelet does
        "KEY": "sk",
        "POD": "job-actor-0",
        "RANK": "3",
        "IP": "10.0.0.5",
        "URL": "http://10.0.0.5:80/fast",
    }


def test_a_missing_key_is_named() -> None:
    container = {"env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "other"}}}]}
    with pytest.raises(ConfigError, match="key 'other' in secret 'wandb' not found \\(env KEY\\)"):
        container_env({}, container, _lookup, "10.0.0.5", "10.0.0.1", {})


def test_a_secrets_data_is_decoded() -> None:
    assert decode_secret({"api-key": "c2stMTIz"}) == {"api-key": "sk-123"}
