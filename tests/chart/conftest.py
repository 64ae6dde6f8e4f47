"""Fixtures for the chart's tests: helm without a cluster (lint, template) and
helm against the session's local cluster (install)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.chart.chart_kit import Helm, helm_binary

if TYPE_CHECKING:
    from rlkube_e2e.testing import ClusterInfo


@pytest.fixture(scope="session")
def helm() -> Helm:
    binary = helm_binary()
    if not binary.exists():
        pytest.fail(f"helm not found at {binary}: run `make toolchain`", pytrace=False)
    return Helm(binary)


@pytest.fixture(scope="session")
def cluster_helm(helm: Helm, cluster: ClusterInfo) -> Helm:
    return Helm(helm.binary, cluster.kubeconfig)
