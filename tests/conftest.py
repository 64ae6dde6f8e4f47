"""Fixtures shared by all tests: the local control plane and clients for it.

Tests that need a cluster carry `@pytest.mark.cluster` and use the `cluster`,
`kube`, `kubectl` and `namespace` fixtures. The cluster starts once per session in
a temporary state dir (a developer's own `.cluster` is untouched) and stops at the
end; with RLKUBE_KUBECONFIG set, the session uses that existing cluster instead,
which saves the start-up when iterating on a test (`e2e/cluster up`, then
`RLKUBE_KUBECONFIG=.cluster/kubeconfig pytest ...`).

Heavy imports (kubernetes, the cluster package) happen inside the fixtures so that
test runs that need no cluster do not pay for them (about 2 s).
"""

# ruff: noqa: PLC0415  (imports inside fixtures are deliberate, see above)

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from rlkube_e2e.testing import ClusterInfo, Kubectl


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    from rlkube_e2e.errors import ClusterError
    from rlkube_e2e.testing import ClusterInfo, local_cluster

    external = os.environ.get("RLKUBE_KUBECONFIG")
    if external:
        yield ClusterInfo(Path(external))
        return
    with contextlib.ExitStack() as stack:
        try:
            # State (with logs) stays in pytest's temp dir, which keeps the last few runs.
            info = stack.enter_context(local_cluster(tmp_path_factory.mktemp("cluster"), keep_state=True))
        except ClusterError as error:
            pytest.fail(f"local cluster: {error}", pytrace=False)
        yield info


@pytest.fixture(scope="session")
def kube(cluster: ClusterInfo) -> Iterator[ApiClient]:
    """A kubernetes.client.ApiClient with admin rights on the test cluster."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def kubectl(cluster: ClusterInfo) -> Kubectl:
    """Callable: kubectl("get", "pods", "-n", ns) -> CompletedProcess (raises on failure unless check=False)."""
    from rlkube_e2e.testing import Kubectl

    return Kubectl(cluster.kubeconfig)


@pytest.fixture
def namespace(kube: ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, named after it; deleted afterwards (without waiting)."""
    from kubernetes.client import CoreV1Api

    from rlkube_e2e.testing import namespace_for_test

    with namespace_for_test(CoreV1Api(kube), request.node.name, {"rlkube.dev/test": "true"}) as name:
        yield name
