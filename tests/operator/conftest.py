"""Fixtures for the operator's cluster tests (`@pytest.mark.cluster`).

- `rljob_crd`: the generated RLJob CRD (crds/rljob.yaml), installed once per session;
- `operator`: the real operator running in-process against the session's cluster,
  started once per session; tests that need to stop and start it (idempotency)
  call `operator.stop()` / `operator.start()`; there is never more than one;
- `podgroup_crds`: minimal Volcano and scheduler-plugins PodGroup CRDs (crds/);
- `jobs`: RLJobs and their children in the test's own namespace.

Heavy imports happen inside the fixtures (tests/conftest.py explains why): the
pure unit tests in this folder load this file too.
"""

# ruff: noqa: PLC0415  (imports inside fixtures are deliberate, see above)

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from rlkube_e2e.testing import ClusterInfo, Kubectl
    from tests.operator.cluster_kit import InProcessOperator, Jobs


@pytest.fixture(scope="session")
def rljob_crd(kubectl: Kubectl) -> None:
    from tests.operator.cluster_kit import install_rljob_crd

    install_rljob_crd(kubectl)


@pytest.fixture(scope="session")
def operator(cluster: ClusterInfo, rljob_crd: None, kubectl: Kubectl) -> Iterator[InProcessOperator]:
    """The operator, running for the whole session (restartable)."""
    from tests.operator.cluster_kit import InProcessOperator

    instance = InProcessOperator(cluster.kubeconfig)
    instance.start()
    try:
        yield instance
    finally:
        if instance.running:
            # The jobs of namespaces being deleted go while the operator still runs.
            _wait_for_no_test_rljobs(kubectl, timeout=30)
            instance.stop()


def _wait_for_no_test_rljobs(kubectl: Kubectl, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = kubectl("get", "rljobs", "-A", "-o", "name", check=False)
        if listing.returncode != 0 or not listing.stdout.strip():
            return
        time.sleep(0.5)


@pytest.fixture
def podgroup_crds(kubectl: Kubectl) -> None:
    """Installed for the test (idempotent; test_gang_cluster removes them on purpose)."""
    from tests.operator.cluster_kit import install_podgroup_crds

    install_podgroup_crds(kubectl)


@pytest.fixture
def jobs(kube: ApiClient, kubectl: Kubectl, namespace: str, operator: InProcessOperator) -> Iterator[Jobs]:
    """RLJobs in the test's namespace, with the operator running. The test's jobs
    are deleted afterwards, before the namespace is: Events the operator would
    post into a terminating namespace are refused (403) and kopf retries each for
    about a minute, holding up its event queue for the tests that follow."""
    from tests.operator.cluster_kit import Jobs

    assert operator.running, "the operator is not running"
    harness = Jobs(kube, kubectl, namespace)
    yield harness
    if operator.running:
        harness.delete_all()


@pytest.fixture
def no_session_operator() -> Iterator[None]:
    """For tests that run operators as processes of their own: the in-process operator other
    tests share watches every namespace (two operators on one job fight), so it is paused
    meanwhile."""
    from tests.operator.cluster_kit import InProcessOperator

    paused = InProcessOperator._active
    if paused is not None and paused.running:
        paused.stop()
    try:
        yield
    finally:
        if paused is not None and not paused.running:
            paused.start()
