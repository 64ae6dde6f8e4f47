"""`helm install` into the local cluster: the API server accepts every object the
chart renders (monitors included, against minimal Prometheus Operator CRDs), and
the real operator, authenticated as the chart's ServiceAccount, takes an RLJob
through its whole life: children, Running, a gang restart, Succeeded, the TTL
cleanup, with not one request refused.

The operator's pod itself lands on a kwok node and runs nothing; the operator
runs in-process instead (tests/operator/cluster_kit.py), with the
ServiceAccount's token in place of the admin's certificate."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kubernetes.client import ApiClient
from kubernetes.config import kube_config

from rlkube_e2e.testing import ClusterInfo, Kubectl, wait_for
from tests.chart.chart_kit import (
    Helm,
    Release,
    install_monitoring_crds,
    installed,
    kubeconfig_with_token,
    release_name,
    scratch_namespaces,
)
from tests.operator.cluster_kit import (
    TINY_PODS,
    TINY_ROLES,
    InProcessOperator,
    Jobs,
    install_podgroup_crds,
    tiny_job,
)

pytestmark = pytest.mark.cluster

JOB = "chart"
VOLCANO = ("scheduling.volcano.sh", "v1beta1")


@pytest.fixture(scope="module")
def release(cluster_helm: Helm, kubectl: Kubectl) -> Iterator[tuple[Release, str]]:
    """The chart installed cluster-wide with both monitors, and a namespace for jobs."""
    install_monitoring_crds(kubectl)
    stem = release_name()
    with (
        scratch_namespaces(kubectl, f"{stem}-system", f"{stem}-jobs") as (system, jobs),
        installed(
            cluster_helm,
            kubectl,
            system,
            "metrics.serviceMonitor.enabled=true",
            "trainerMetrics.podMonitor.enabled=true",
        ) as release,
    ):
        yield release, jobs


def test_the_api_server_accepts_every_object(
    cluster_helm: Helm, kubectl: Kubectl, release: tuple[Release, str]
) -> None:
    installed_release, _ = release
    status = cluster_helm("status", installed_release.name, "--namespace", installed_release.namespace, "-o", "json")
    assert '"status":"deployed"' in status.stdout.replace(" ", "")
    # Everything the manifest names is there (helm would have failed otherwise; this
    # checks that the monitors were stored, not skipped).
    manifest = cluster_helm("get", "manifest", installed_release.name, "--namespace", installed_release.namespace)
    for kind in ("Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert f"kind: {kind}\n" in manifest.stdout, kind
    ns = installed_release.namespace
    name = installed_release.name
    kubectl("get", "-n", ns, f"deployment/{name}", f"service/{name}-metrics", f"serviceaccount/{name}")
    kubectl("get", "-n", ns, f"servicemonitor/{name}", f"podmonitor/{name}-trainer")
    kubectl("get", f"clusterrole/{name}", f"clusterrolebinding/{name}", f"clusterrole/{name}-kopf-observation")
    kubectl("get", "crd", "rljobs.rlkube.dev", "rljobruntimes.rlkube.dev", "clusterrljobruntimes.rlkube.dev")
    # The chart's default runtime, which the API server checked against its CRD.
    kubectl("get", "clusterrljobruntime", name)


def test_the_notes_say_how_to_check_and_use_the_operator(release: tuple[Release, str]) -> None:
    installed_release, _ = release
    notes = installed_release.notes
    assert f"kubectl -n {installed_release.namespace} rollout status deployment/{installed_release.name}" in notes
    assert "kubectl apply -f examples/tiny-cpu.yaml" in notes
    assert "kubectl get rljobs" in notes
    assert "kubectl apply --server-side --force-conflicts -f charts/rlkube/crds/rljob.yaml" in notes


def test_monitors_survive_strict_server_side_validation(
    cluster_helm: Helm, kubectl: Kubectl, release: tuple[Release, str]
) -> None:
    """The stand-in CRDs declare the fields the chart sets with upstream's types and
    patterns; strict field validation refuses any field they do not know."""
    installed_release, _ = release
    manifest = cluster_helm("get", "manifest", installed_release.name, "--namespace", installed_release.namespace)
    result = kubectl(
        "apply", "--dry-run=server", "--validate=strict", "--server-side", "--field-manager=chart-test",
        "--force-conflicts", "-f", "-", input=manifest.stdout,
    )  # fmt: skip
    assert "servicemonitor.monitoring.coreos.com" in result.stdout
    assert "podmonitor.monitoring.coreos.com" in result.stdout


# --- the operator with the chart's ServiceAccount ------------------------------------------------


class PermissionProblems(logging.Handler):
    """Collects log records that say a request was refused: kopf's 'Not enough
    permissions' warnings, and the operator's failed reconciles (403 in the traceback)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.problems: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        if any(word in text for word in ("403", "Forbidden", "forbidden", "permission")):
            self.problems.append(text)


@contextmanager
def operator_as(kubeconfig: Path) -> Iterator[PermissionProblems]:
    """The in-process operator, authenticated by `kubeconfig`. An operator another
    module left running (tests/operator's session fixture, with admin rights) is
    paused meanwhile: it would reconcile the same jobs and hide a missing
    permission. KUBECONFIG and the client's default location, which
    InProcessOperator.start sets, are put back afterwards."""
    paused = InProcessOperator._active  # the running instance, if any (class-level by design)
    if paused is not None:
        paused.stop()
    saved = (os.environ.get("KUBECONFIG"), kube_config.KUBE_CONFIG_DEFAULT_LOCATION)
    problems = PermissionProblems()
    logging.getLogger().addHandler(problems)
    ours = InProcessOperator(kubeconfig)
    try:
        ours.start()
        yield problems
    finally:
        try:
            if ours.running:
                ours.stop()
        finally:
            logging.getLogger().removeHandler(problems)
            env, default = saved
            if env is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = env
            kube_config.KUBE_CONFIG_DEFAULT_LOCATION = default
            if paused is not None:
                paused.start()


def test_the_operator_runs_a_job_with_only_the_charts_permissions(
    cluster: ClusterInfo, kube: ApiClient, kubectl: Kubectl, release: tuple[Release, str], tmp_path: Path
) -> None:
    installed_release, namespace = release
    install_podgroup_crds(kubectl)  # so that PodGroups are written (and cleaned up) too
    token = kubectl(
        "create", "token", installed_release.service_account, "-n", installed_release.namespace, "--duration=1h"
    ).stdout.strip()
    kubeconfig = kubeconfig_with_token(cluster.kubeconfig, token, tmp_path / "operator.kubeconfig")
    jobs = Jobs(kube, kubectl, namespace)  # reads with admin rights, as a user would look

    with operator_as(kubeconfig) as problems:
        # Volcano gang scheduling writes a PodGroup; the default scheduler still places
        # the pods, since no Volcano scheduler runs here.
        gang = {"scheduler": "volcano", "queue": "research", "schedulerName": "default-scheduler"}
        jobs.create(
            tiny_job(JOB, namespace, {"spec.runPolicy.gang": gang, "spec.runPolicy.ttlSecondsAfterFinished": 2})
        )
        jobs.wait_running(JOB)
        jobs.wait_pods(JOB, TINY_PODS)
        children = jobs.children(JOB)
        for kind, name in [
            ("ServiceAccount", f"{JOB}-trainer"),
            ("Role", f"{JOB}-progress"),  # needs pods get/patch held by the operator
            ("RoleBinding", f"{JOB}-progress"),
            ("ConfigMap", f"{JOB}-exits"),  # its Role's patch on it needs configmaps patch held by the operator
            *[("StatefulSet", f"{JOB}-{role}") for role in TINY_ROLES],
        ]:
            assert f"{kind}/{name}" in children, f"{kind}/{name} missing: {sorted(children)}"
        assert [g["metadata"]["name"] for g in jobs.podgroups(*VOLCANO)] == [JOB]
        kubectl("get", "secret", f"{JOB}-ray", "-n", namespace)  # created, never read
        kubectl("get", "networkpolicy", f"{JOB}-network", "-n", namespace)  # on by default

        # A failed pod: the gang restarts (the old attempt's pods are deleted).
        jobs.fail_pod(f"{JOB}-actor-1")
        jobs.wait_running(JOB, restarts=1, timeout=60)

        # The driver finishes: Succeeded (an Event), scaled down, and after the TTL every child goes.
        jobs.finish_driver(JOB)
        jobs.wait_state(JOB, "Succeeded")
        jobs.wait_event(JOB, "DriverSucceeded")
        wait_for(lambda: not jobs.children(JOB), "the children to be deleted after the TTL", timeout=60)
        wait_for(lambda: not jobs.podgroups(*VOLCANO), "the PodGroup to be deleted after the TTL", timeout=30)
        jobs.wait_no_pods(JOB, timeout=60)
        jobs.delete_all()

    assert not problems.problems, "requests were refused:\n" + "\n".join(problems.problems)
