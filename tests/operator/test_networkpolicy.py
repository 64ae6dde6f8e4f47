"""The job's NetworkPolicy: built unless switched off (on by default); the job's pods reach every port of
each other, the monitoring namespace only the driver's metrics port, nobody else anything."""

from __future__ import annotations

import pytest

from rlkube_api.names import DRIVER_METRICS_PORT, LABEL_JOB
from rlkube_operator.children.networkpolicy import NAMESPACE_NAME_LABEL, network_policies
from tests.operator.helpers import CPU, GPU, NAMESPACE, UID, Mutation, Obj, children_of, load_job, set_path

ENABLED = set_path("spec.networkPolicy", {"enabled": True})


def _policies(example: str, *mutations: Mutation) -> list[Obj]:
    return [c for c in children_of(load_job(example, *mutations)) if c["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize(
    ("example", "mutations", "count"),
    [
        pytest.param(GPU, [], 1, id="on-by-default"),
        pytest.param(CPU, [], 1, id="cpu-on-by-default"),
        pytest.param(GPU, [set_path("spec.networkPolicy", {"enabled": False})], 0, id="off"),
        pytest.param(GPU, [ENABLED], 1, id="gpu-on"),
        pytest.param(CPU, [ENABLED], 1, id="cpu-on"),
    ],
)
def test_a_policy_unless_switched_off(example: str, mutations: list[Mutation], count: int) -> None:
    assert len(_policies(example, *mutations)) == count


@pytest.mark.parametrize(
    ("mutations", "monitoring"),
    [
        pytest.param([ENABLED], "monitoring", id="default-monitoring-namespace"),
        pytest.param(
            [set_path("spec.networkPolicy", {"enabled": True, "metricsNamespace": "prometheus"})],
            "prometheus",
            id="own-monitoring-namespace",
        ),
    ],
)
def test_ingress_from_the_jobs_pods_and_metrics_from_monitoring(mutations: list[Mutation], monitoring: str) -> None:
    job = load_job(GPU, *mutations)
    [policy] = _policies(GPU, *mutations)
    name = job.metadata.name
    own = {"podSelector": {"matchLabels": {LABEL_JOB: name}}}
    assert policy["metadata"]["name"] == f"{name}-network"
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["metadata"]["ownerReferences"][0]["uid"] == UID
    assert policy["metadata"]["labels"][LABEL_JOB] == name
    spec = policy["spec"]
    # The policy selects every pod of the job (the controller's labels carry the job too).
    assert spec["podSelector"] == own["podSelector"]
    assert spec["policyTypes"] == ["Ingress"]
    own_rule, metrics_rule = spec["ingress"]
    assert own_rule == {"from": [own]}  # every port: NCCL, gloo and Ray use ephemeral ones
    assert metrics_rule == {
        "from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: monitoring}}}],
        "ports": [{"protocol": "TCP", "port": DRIVER_METRICS_PORT}],
    }


def test_the_policy_selects_every_pod_of_the_job() -> None:
    job = load_job(GPU, ENABLED)
    [policy] = network_policies(job)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for sts in (c for c in children_of(job) if c["kind"] == "StatefulSet"):
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), sts["metadata"]["name"]
