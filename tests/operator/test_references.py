"""children/references.py: the ConfigMaps, Secrets and claims a job's pods name, read from
the pod templates the builders make. Pure, table-driven."""

from __future__ import annotations

import pytest

from rlkube_api.names import CONTROLLER_ROLE
from rlkube_operator.children.references import Reference, job_references, pod_references
from rlkube_operator.children.statefulset import pod_template
from rlkube_operator.children.topology import pod_roles
from rlkube_operator.gang import plugin_for
from tests.operator.helpers import CPU, GPU, Obj, load_job, set_path


def refs(found: list[Reference]) -> list[tuple[str, str, str]]:
    return [(r.kind, r.name, r.use) for r in found]


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ({"volumes": [{"name": "r", "configMap": {"name": "reward"}}]}, [("ConfigMap", "reward", "volume r")]),
        ({"volumes": [{"name": "s", "secret": {"secretName": "creds"}}]}, [("Secret", "creds", "volume s")]),
        (
            {"volumes": [{"name": "m", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}]},
            [("PersistentVolumeClaim", "models", "volume m")],
        ),
        (
            {
                "volumes": [
                    {
                        "name": "p",
                        "projected": {
                            "sources": [
                                {"configMap": {"name": "a"}},
                                {"secret": {"name": "b"}},
                                {"secret": {"name": "c", "optional": True}},
                                {"downwardAPI": {"items": []}},
                            ]
                        },
                    }
                ]
            },
            [("ConfigMap", "a", "volume p"), ("Secret", "b", "volume p")],
        ),
        (
            {
                "containers": [
                    {
                        "name": "trainer",
                        "env": [
                            {"name": "K", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "k"}}},
                            {"name": "U", "valueFrom": {"configMapKeyRef": {"name": "mlflow", "key": "u"}}},
                            {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                            {"name": "V", "value": "plain"},
                        ],
                    }
                ]
            },
            [
                ("Secret", "wandb", "env K of container trainer"),
                ("ConfigMap", "mlflow", "env U of container trainer"),
            ],
        ),
        (
            {
                "initContainers": [{"name": "warm", "envFrom": [{"configMapRef": {"name": "settings"}}]}],
                "containers": [{"name": "shipper", "envFrom": [{"secretRef": {"name": "logs"}}]}],
            },
            [
                ("ConfigMap", "settings", "envFrom of container warm"),
                ("Secret", "logs", "envFrom of container shipper"),
            ],
        ),
        ({"imagePullSecrets": [{"name": "regcred"}]}, [("Secret", "regcred", "imagePullSecrets")]),
        # A pod starts without an optional one: not a reference to wait for.
        (
            {
                "volumes": [
                    {"name": "a", "configMap": {"name": "x", "optional": True}},
                    {"name": "b", "secret": {"secretName": "y", "optional": True}},
                ],
                "containers": [
                    {
                        "name": "trainer",
                        "env": [
                            {"name": "K", "valueFrom": {"secretKeyRef": {"name": "z", "key": "k", "optional": True}}}
                        ],
                        "envFrom": [{"configMapRef": {"name": "w", "optional": True}}],
                    }
                ],
            },
            [],
        ),
        # Volumes that name nothing in the namespace.
        (
            {"volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}, {"name": "h", "hostPath": {"path": "/d"}}]},
            [],
        ),
        # Each object once, with its first use.
        (
            {
                "volumes": [{"name": "s", "secret": {"secretName": "creds"}}],
                "imagePullSecrets": [{"name": "creds"}],
            },
            [("Secret", "creds", "volume s")],
        ),
        # A ConfigMap and a Secret may share a name: two objects.
        (
            {
                "volumes": [
                    {"name": "a", "configMap": {"name": "same"}},
                    {"name": "b", "secret": {"secretName": "same"}},
                ]
            },
            [("ConfigMap", "same", "volume a"), ("Secret", "same", "volume b")],
        ),
    ],
)
def test_pod_references(pod: Obj, expected: list[tuple[str, str, str]]) -> None:
    assert refs(pod_references(pod)) == expected


def test_a_reference_says_what_it_is_and_where_the_pods_name_it() -> None:
    assert str(Reference("ConfigMap", "tiny-reward", "volume reward")) == "ConfigMap tiny-reward (volume reward)"
    # Its use is not part of its identity.
    assert Reference("Secret", "a", "volume x") == Reference("Secret", "a", "imagePullSecrets")


def test_the_jobs_own_children_are_not_references() -> None:
    """Its config ConfigMap and Ray token Secret are in every pod; the operator makes them."""
    assert refs(job_references(load_job(CPU))) == [("ConfigMap", "tiny-reward", "volume reward")]


def test_every_role_and_spec_field_that_names_an_object_is_read() -> None:
    job = load_job(
        GPU,
        set_path("spec.imagePullSecrets", [{"name": "regcred"}]),
        set_path(
            "spec.podTemplate",
            {"env": [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "k"}}}]},
        ),
        # One role's own template: read for its pods too.
        set_path(
            "spec.roles.rollout.podTemplate",
            {"volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "vllm-cache"}}]},
        ),
    )
    assert refs(job_references(job)) == [
        ("ConfigMap", "gsm8k-reward", "volume reward"),
        ("PersistentVolumeClaim", "datasets", "volume data"),
        ("PersistentVolumeClaim", "models", "volume models"),
        ("PersistentVolumeClaim", "rl-ckpt", "volume checkpoints"),
        ("PersistentVolumeClaim", "vllm-cache", "volume cache"),
        ("Secret", "regcred", "imagePullSecrets"),
        ("Secret", "wandb", "env WANDB_API_KEY of container trainer"),
    ]


def test_a_job_that_names_nothing_has_no_references() -> None:
    job = load_job(CPU, set_path("spec.reward", {"function": {"path": "/rlkube/reward.py"}}))
    assert job_references(job) == []


def test_the_object_stores_secret_is_a_reference() -> None:
    """checkpoint.credentialsSecret: a job whose Secret is missing is reported like any other."""
    job = load_job(
        CPU,
        set_path("spec.reward", {"function": {"path": "/rlkube/reward.py"}}),
        set_path("spec.checkpoint.uri", "s3://ckpt/tiny"),
        set_path("spec.checkpoint.credentialsSecret", "ckpt-s3"),
    )
    assert refs(job_references(job)) == [("Secret", "ckpt-s3", "envFrom of container trainer")]


def test_a_remote_verifiers_secret_headers_reach_the_driver_and_are_references() -> None:
    """reward.remote.secretHeaders: each header's Secret key becomes a variable of the
    controller pod alone (the driver sends the requests), and a missing Secret is reported."""
    job = load_job(
        CPU,
        set_path(
            "spec.reward",
            {
                "remote": {
                    "url": "https://verifier.example/score",
                    "secretHeaders": [
                        {"header": "Authorization", "secret": "verifier-token", "key": "token"},
                        {"header": "X-Tenant", "secret": "verifier-tenant", "key": "tenant"},
                    ],
                }
            },
        ),
    )
    assert refs(job_references(job)) == [
        ("Secret", "verifier-tenant", "env RLKUBE_REWARD_HEADER_1 of container trainer"),
        ("Secret", "verifier-token", "env RLKUBE_REWARD_HEADER_0 of container trainer"),
    ]
    for role in pod_roles(job):
        container = pod_template(job, role, 0, plugin_for(job).pod_patch(job, role.name, 0))["spec"]["containers"][0]
        headers = [e for e in container["env"] if e["name"].startswith("RLKUBE_REWARD_HEADER_")]
        if role.name == CONTROLLER_ROLE:
            assert headers[0] == {
                "name": "RLKUBE_REWARD_HEADER_0",
                "valueFrom": {"secretKeyRef": {"name": "verifier-token", "key": "token"}},
            }
        else:
            assert headers == [], role.name
