"""A process node (pods run as local processes) shared by the end-to-end tests that run
the trainer or the operator in pods. Its pool label is its own (`e2e-jobs`, not `local`):
tests/e2e/test_procnode.py runs a node of its own in pool `local` meanwhile, and each
test's pods must land on the node it watches. It lives as long as this package's tests:
a real node left in the shared cluster would take the pods of later tests that name no
pool, and really mount their volumes (the fuzz's jobs then hang in ContainerCreating)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from rlkube_e2e.pools import POOL_LABEL
from rlkube_e2e.testing import ClusterInfo

if TYPE_CHECKING:
    from rlkube_e2e.procnode.node import ProcessNode


@pytest.fixture(scope="package")
def process_node(cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessNode]:
    from rlkube_e2e.procnode.node import ProcessNode  # noqa: PLC0415
    from rlkube_e2e.procnode.testing import running_node  # noqa: PLC0415

    reason = ProcessNode.unavailable()
    if reason:
        pytest.skip(f"the process node needs {reason}")
    labels = {POOL_LABEL: "e2e-jobs"}
    with running_node(cluster.kubeconfig, tmp_path_factory.mktemp("procnode"), "proc-e2e", labels) as node:
        yield node
