"""The end-to-end tests' cluster: a private control plane with two real nodes (kubelet,
containerd, runc, CNI, kube-proxy) holding the base, operator and trainer images built here
(from the node image store: imported once, then cached). Starting real nodes still takes a
minute and pods on them really run, so every test of this package shares one cluster; each
test's objects stay in a namespace of its own. It is
not the session's shared cluster (tests/conftest.py): a real node there would take the pods
of other tests that name no pool, and really mount their volumes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlkube_e2e import tinyjob
from rlkube_e2e.testing import Kubectl, namespace_for_test, wait_established
from tests.e2e import real_node_kit
from tests.e2e.real_node_kit import RealCluster
from tests.operator.cluster_kit import OperatorProcess


@pytest.fixture(scope="package")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    images = ("base", "operator", "trainer-cpu")
    with real_node_kit.real_cluster(tmp_path_factory.mktemp("real-nodes"), images) as cluster:
        yield cluster


@pytest.fixture
def real_kubectl(real_cluster: RealCluster) -> Kubectl:
    return Kubectl(real_cluster.cluster.kubeconfig)


@pytest.fixture
def real_namespace(real_cluster: RealCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace of the real-node cluster per test, named after it; deleted afterwards
    (without waiting)."""
    from kubernetes.client import CoreV1Api  # noqa: PLC0415
    from kubernetes.config import new_client_from_config  # noqa: PLC0415

    client = new_client_from_config(config_file=str(real_cluster.cluster.kubeconfig))
    try:
        with namespace_for_test(CoreV1Api(client), request.node.name, {"rlkube.dev/test": "true"}) as name:
            yield name
    finally:
        client.close()


@pytest.fixture
def watching_operator(
    real_cluster: RealCluster, real_kubectl: Kubectl, real_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator as a process watching `real_namespace` of the real-node cluster (the CRD
    applied first)."""
    real_kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tinyjob.CRD))
    wait_established(real_kubectl, "rljobs.rlkube.dev")
    process = OperatorProcess(real_namespace, real_cluster.cluster.kubeconfig, tmp_path / "operator.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()
