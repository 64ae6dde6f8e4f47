"""The local control plane behaves like a small GPU cluster.

These are the properties the operator's tests build on: the real apiserver
version, GPU node pools, scheduling by pool and GPU count, pods that run, fail or
succeed on demand (kwok stages), garbage collection and RBAC. The tests at the
end check the pools file validation and need no cluster.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import (
    ApiClient,
    AppsV1Api,
    CoreV1Api,
    V1ConfigMap,
    V1Container,
    V1LabelSelector,
    V1ObjectMeta,
    V1OwnerReference,
    V1Pod,
    V1PodSpec,
    V1PodTemplateSpec,
    V1ResourceRequirements,
    V1StatefulSet,
    V1StatefulSetSpec,
    VersionApi,
)
from kubernetes.client.exceptions import ApiException

from rlkube_e2e.binaries import K8S_VERSION
from rlkube_e2e.cluster import DEFAULT_POOLS_FILE
from rlkube_e2e.errors import ClusterError
from rlkube_e2e.pools import KWOK_NODE_ANNOTATION, POOL_LABEL, load_pools, parse_pools
from rlkube_e2e.testing import Kubectl, wait_for

FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
SUCCEED_LABEL = "rlkube.dev/kwok-succeed"


def pod_spec(pool: str, gpus: int = 0) -> V1PodSpec:
    resources = V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}) if gpus else None
    return V1PodSpec(
        node_selector={POOL_LABEL: pool},
        containers=[V1Container(name="main", image="rlkube/fake:latest", resources=resources)],
    )


def create_pod(core: CoreV1Api, namespace: str, name: str, pool: str = "cpu", gpus: int = 0) -> V1Pod:
    pod = V1Pod(metadata=V1ObjectMeta(name=name), spec=pod_spec(pool, gpus))
    result: V1Pod = core.create_namespaced_pod(namespace, pod)
    return result


def wait_phase(core: CoreV1Api, namespace: str, name: str, phase: str, timeout: float = 30) -> V1Pod:
    def probe() -> V1Pod | None:
        pod: V1Pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase == phase else None

    return wait_for(probe, f"pod {namespace}/{name} to be {phase}", timeout)


def condition(pod: V1Pod, kind: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


@pytest.mark.cluster
def test_api_server_is_the_built_version(kube: ApiClient, kubectl: Kubectl) -> None:
    assert VersionApi(kube).get_code().git_version == f"v{K8S_VERSION}"
    version = json.loads(kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == f"v{K8S_VERSION}"


@pytest.mark.cluster
def test_every_pool_has_its_nodes_with_gpu_capacity(kube: ApiClient) -> None:
    core = CoreV1Api(kube)
    for pool in load_pools(DEFAULT_POOLS_FILE):
        nodes = core.list_node(label_selector=f"{POOL_LABEL}={pool.name}").items
        assert sorted(node.metadata.name for node in nodes) == sorted(pool.node_names())
        for node in nodes:
            assert node.metadata.annotations[KWOK_NODE_ANNOTATION] == "fake"
            assert pool.labels.items() <= node.metadata.labels.items()
            assert node.status.capacity.get("nvidia.com/gpu") == pool.capacity.get("nvidia.com/gpu")
            assert node.status.allocatable.get("nvidia.com/gpu") == pool.allocatable.get("nvidia.com/gpu")
            assert condition(node, "Ready").status == "True"  # type: ignore[arg-type]
            assert not node.spec.taints, f"{node.metadata.name} is tainted: {node.spec.taints}"
    h100 = core.list_node(label_selector="nvidia.com/gpu.product=H100").items
    assert h100 and all(node.status.capacity["nvidia.com/gpu"] == "8" for node in h100)


@pytest.mark.cluster
def test_statefulset_pods_run_on_the_selected_pool(kube: ApiClient, namespace: str) -> None:
    apps, core = AppsV1Api(kube), CoreV1Api(kube)
    labels = {"app": "infer"}
    statefulset = V1StatefulSet(
        metadata=V1ObjectMeta(name="infer"),
        spec=V1StatefulSetSpec(
            replicas=2,
            service_name="infer",
            # Parallel: both pods at once, as the operator's gangs are created.
            pod_management_policy="Parallel",
            selector=V1LabelSelector(match_labels=labels),
            template=V1PodTemplateSpec(metadata=V1ObjectMeta(labels=labels), spec=pod_spec("l40s-infer", gpus=4)),
        ),
    )
    apps.create_namespaced_stateful_set(namespace, statefulset)

    def ready_replicas() -> bool:
        status = apps.read_namespaced_stateful_set("infer", namespace).status
        return (status.ready_replicas or 0) == 2

    wait_for(ready_replicas, "2 ready replicas of statefulset infer")
    pods = core.list_namespaced_pod(namespace, label_selector="app=infer").items
    assert len(pods) == 2
    for pod in pods:
        assert pod.status.phase == "Running"
        assert condition(pod, "Ready").status == "True"
        assert pod.spec.node_name.startswith("l40s-infer-")
    # 4 GPUs each on 4-GPU nodes: the scheduler had to use both nodes of the pool.
    assert len({pod.spec.node_name for pod in pods}) == 2


@pytest.mark.cluster
def test_pod_asking_for_more_gpus_than_any_node_stays_pending(kube: ApiClient, namespace: str) -> None:
    core = CoreV1Api(kube)
    create_pod(core, namespace, "greedy", pool="h100-train", gpus=16)

    def unschedulable() -> V1Pod | None:
        pod: V1Pod = core.read_namespaced_pod("greedy", namespace)
        scheduled = condition(pod, "PodScheduled")
        return pod if scheduled is not None and scheduled.reason == "Unschedulable" else None

    pod = wait_for(unschedulable, "PodScheduled=False/Unschedulable on pod greedy")
    assert pod.status.phase == "Pending"
    assert condition(pod, "PodScheduled").status == "False"
    assert "Insufficient nvidia.com/gpu" in condition(pod, "PodScheduled").message
    assert pod.spec.node_name is None


@pytest.mark.cluster
def test_chaos_label_fails_a_running_pod(kube: ApiClient, namespace: str) -> None:
    core = CoreV1Api(kube)
    create_pod(core, namespace, "victim")
    wait_phase(core, namespace, "victim", "Running")
    patch = {
        "metadata": {
            "labels": {FAIL_LABEL: "true"},
            "annotations": {f"{FAIL_LABEL}/exit-code": "137", f"{FAIL_LABEL}/reason": "OOMKilled"},
        }
    }
    core.patch_namespaced_pod("victim", namespace, patch)
    pod = wait_phase(core, namespace, "victim", "Failed")
    state = pod.status.container_statuses[0].state
    assert state.running is None
    assert state.terminated.exit_code == 137
    assert state.terminated.reason == "OOMKilled"


@pytest.mark.cluster
def test_succeed_label_makes_a_running_pod_succeed(kube: ApiClient, namespace: str) -> None:
    core = CoreV1Api(kube)
    create_pod(core, namespace, "worker", pool="h100-train", gpus=8)
    wait_phase(core, namespace, "worker", "Running")
    core.patch_namespaced_pod("worker", namespace, {"metadata": {"labels": {SUCCEED_LABEL: "true"}}})
    pod = wait_phase(core, namespace, "worker", "Succeeded")
    state = pod.status.container_statuses[0].state
    assert state.running is None
    assert state.terminated.exit_code == 0
    assert state.terminated.reason == "Completed"


@pytest.mark.cluster
def test_deleting_an_owner_garbage_collects_its_dependents(kube: ApiClient, namespace: str) -> None:
    core = CoreV1Api(kube)
    owner = core.create_namespaced_config_map(namespace, V1ConfigMap(metadata=V1ObjectMeta(name="owner")))
    reference = V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core.create_namespaced_config_map(
        namespace, V1ConfigMap(metadata=V1ObjectMeta(name="dependent", owner_references=[reference]))
    )
    pod = V1Pod(metadata=V1ObjectMeta(name="dependent", owner_references=[reference]), spec=pod_spec("cpu"))
    core.create_namespaced_pod(namespace, pod)
    wait_phase(core, namespace, "dependent", "Running")

    core.delete_namespaced_config_map("owner", namespace)

    def gone(read: Any) -> bool:
        try:
            read("dependent", namespace)
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(lambda: gone(core.read_namespaced_config_map), "configmap dependent to be collected")
    wait_for(lambda: gone(core.read_namespaced_pod), "pod dependent to be collected")


@pytest.mark.cluster
def test_rbac_applies_to_service_accounts(kubectl: Kubectl, namespace: str) -> None:
    subject = f"system:serviceaccount:{namespace}:default"

    def can_list_pods() -> str:
        result = kubectl("auth", "can-i", "list", "pods", "-n", namespace, "--as", subject, check=False)
        return result.stdout.strip()

    assert can_list_pods() == "no"
    # `view` is an aggregated ClusterRole: this also shows the aggregation controller runs.
    kubectl(
        "create", "rolebinding", "view", "--clusterrole=view", f"--serviceaccount={namespace}:default", "-n", namespace
    )
    wait_for(lambda: can_list_pods() == "yes", f"{subject} to be allowed to list pods")


# -- the pools file (no cluster needed) ------------------------------------------------

VALID_POOL = {"nodes": 1, "capacity": {"cpu": "8", "memory": "64Gi", "pods": 110, "nvidia.com/gpu": 8}}


def test_shipped_pools_file_is_valid() -> None:
    pools = {pool.name: pool for pool in load_pools(DEFAULT_POOLS_FILE)}
    assert pools["h100-train"].nodes == 4
    assert pools["h100-train"].capacity["nvidia.com/gpu"] == "8"
    assert pools["l40s-infer"].nodes == 2
    assert "nvidia.com/gpu" not in pools["cpu"].capacity


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ({}, "pools"),
        ({"pools": {"a": {**VALID_POOL, "nodes": "four"}}}, "pools.a.nodes"),
        ({"pools": {"a": {**VALID_POOL, "capacity": {"cpu": "8", "memory": "1Gi"}}}}, "pools.a.capacity.pods"),
        (
            {"pools": {"a": {**VALID_POOL, "capacity": {**VALID_POOL["capacity"], "cpu": "lots"}}}},
            "pools.a.capacity.cpu",
        ),
        ({"pools": {"Bad_Name": VALID_POOL}}, "pools.Bad_Name"),
        ({"pools": {"a": {**VALID_POOL, "colour": "red"}}}, "pools.a.colour"),
        ({"pools": {"a": {**VALID_POOL, "labels": {"x": True}}}}, "pools.a.labels.x"),
        ({"pools": {"a": {**VALID_POOL, "taints": [{"key": "k", "effect": "Never"}]}}}, "pools.a.taints[0].effect"),
    ],
)
def test_pools_errors_name_the_file_and_key(document: dict[str, Any], key: str) -> None:
    with pytest.raises(ClusterError, match=rf"^pools\.yaml: {re.escape(key)}: "):
        parse_pools(document, "pools.yaml")


def test_pools_file_that_is_not_yaml_is_reported_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text("pools: [\n")
    with pytest.raises(ClusterError, match=rf"^{re.escape(str(path))}: not valid YAML"):
        load_pools(path)
