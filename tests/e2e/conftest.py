"""A process node (pods run as local processes) shared by the end-to-end tests that run
the trainer or the operator in pods."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from rlkube_e2e.testing import ClusterInfo

if TYPE_CHECKING:
    from rlkube_e2e.procnode.node import ProcessNode


@pytest.fixture(scope="session")
def process_node(cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessNode]:
    from rlkube_e2e.procnode.node import ProcessNode  # noqa: PLC0415
    from rlkube_e2e.procnode.testing import running_node  # noqa: PLC0415

    reason = ProcessNode.unavailable()
    if reason:
        pytest.skip(f"the process node needs {reason}")
    with running_node(cluster.kubeconfig, tmp_path_factory.mktemp("procnode"), "proc-e2e") as node:
        yield node
