"""The operator as users install it: `helm install` of charts/rlkube in namespaced mode,
its Deployment's pod scheduled onto the process node, where it really runs (in-cluster
config, the chart's ServiceAccount and RBAC only), and an RLJob in the watched namespace
trained by pods it created, to Succeeded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rlkube_e2e import tinyjob
from rlkube_e2e.pools import POOL_LABEL
from rlkube_e2e.testing import ClusterInfo, Kubectl, wait_for
from tests.chart.chart_kit import CHART, Helm, helm_binary, install_rljob_crd, release_name

if TYPE_CHECKING:
    from rlkube_e2e.procnode.node import ProcessNode

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def no_in_process_operator() -> Iterator[None]:
    """An operator other tests left running in this process (cluster-wide) would reconcile
    the same job: paused meanwhile."""
    from tests.operator.cluster_kit import InProcessOperator  # noqa: PLC0415

    paused = InProcessOperator._active
    if paused is not None:
        paused.stop()
    try:
        yield
    finally:
        if paused is not None:
            paused.start()


def test_the_charts_operator_runs_in_a_pod_and_trains_a_job(
    cluster: ClusterInfo,
    process_node: ProcessNode,
    no_in_process_operator: None,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
) -> None:
    helm = Helm(helm_binary(), cluster.kubeconfig)
    install_rljob_crd(kubectl)
    release = release_name()
    helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        f"watchNamespaces={{{namespace}}}",
        "--set",
        f"nodeSelector.rlkube\\.dev/pool={process_node.labels[POOL_LABEL]}",
    )
    try:
        selector = f"app.kubernetes.io/instance={release}"

        def operator_running() -> dict[str, object] | None:
            out = kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json").stdout
            pods = json.loads(out)["items"]
            running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
            return running[0] if running else None

        pod = wait_for(operator_running, "the chart's operator pod Running on the process node", timeout=120)
        assert pod["spec"]["nodeName"] == "proc-e2e"  # type: ignore[index]

        job = tinyjob.prepare(
            tmp_path / "work", name="tiny-chart", steps=6, save_freq=3, pool=process_node.labels[POOL_LABEL]
        )
        tinyjob.apply(kubectl, namespace, job)
        try:
            final = tinyjob.wait_state(kubectl, namespace, job.name, ("Succeeded", "Failed"), 900)
        except TimeoutError as error:
            name = pod["metadata"]["name"]  # type: ignore[index]
            log = process_node.log_path(namespace, str(name))
            raise AssertionError(f"{error}\noperator pod log:\n{log.read_text()[-3000:]}") from error
        assert final["state"] == "Succeeded", final
        assert final["progress"]["step"] == 6
        assert len(job.metrics()) == 6
    finally:
        helm("uninstall", release, "--namespace", namespace, "--wait", check=False)
