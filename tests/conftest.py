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


# Tests that share an expensive fixture stay on one worker when `make test` runs them on
# several (pytest-xdist, --dist loadgroup): one control plane for every test that uses the
# session's cluster; the end-to-end package on one worker, for its shared real nodes and because
# its other tests start real nodes of their own, whose network and mounts would meet those; and
# each other module whole, so that its module-scoped fixtures (trained jobs, engines,
# checkpoints) are built once.
CONTROL_PLANE_GROUP = "control-plane"
REAL_NODES_GROUP = "real-nodes"


def worker_group(item: pytest.Item) -> str:
    if "cluster" in getattr(item, "fixturenames", ()):
        return CONTROL_PLANE_GROUP
    module = item.nodeid.split("::", 1)[0]
    return REAL_NODES_GROUP if module.startswith("tests/e2e/") else module


def start_rank(item: pytest.Item, slow_groups: set[str]) -> int:
    """Longest first: the workers take groups in this order, and a long group taken last would
    leave the other worker idle at the end. The two cluster groups run for the longest, then
    modules with a slow test, then the trainer's (processes and engines), then the quick rest."""
    group = worker_group(item)
    if group == REAL_NODES_GROUP:
        return 0
    if group == CONTROL_PLANE_GROUP:
        return 1
    if group in slow_groups:
        return 2
    return 3 if item.nodeid.startswith("tests/trainer/") else 4


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config.option, "dist", "no") == "no":
        return
    slow_groups = {worker_group(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: start_rank(item, slow_groups))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(worker_group(item)))
