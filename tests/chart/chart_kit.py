"""Helpers for the chart's tests: helm itself, rendered objects, and the RBAC
contract (the (apiGroup, resource, verb) triples the operator needs), which the
rendered rules, the API server's authorizer and charts/rlkube/README.md must all
agree with."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlkube_e2e.binaries import cache_dir
from rlkube_e2e.testing import Kubectl

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rlkube"
MONITORING_CRDS = Path(__file__).resolve().parent / "crds"
MONITORING_CRD_NAMES = ("servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com")
# e2e/toolchain.sh builds helm into the cache, keyed by version, and honours the same variable.
HELM_VERSION = os.environ.get("HELM_VERSION", "3.21.4")

# --- the RBAC contract -------------------------------------------------------------------------
# What the operator does in a namespace it watches, one row per rule of the chart
# (templates/_helpers.tpl, rlkube.jobRules). Derived from the operator's code:
# kube.py (server-side apply = PATCH, plus create for new objects; list + delete in
# the TTL cleanup; get of the Ray Secret, and of the ConfigMaps, Secrets and claims a
# job's pods name, before they are created; status patch; pod deletion), handlers.py
# (kopf indexes and watches pods, StatefulSets and RLJobs; Events) and
# children/rbac.py (the job's Role grants pods get/patch and events create, which
# the operator must therefore hold itself).
JOB_RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("rlkube.dev", ("rljobs",), ("list", "watch")),
    ("rlkube.dev", ("rljobruntimes",), ("get", "list", "watch")),
    ("rlkube.dev", ("rljobs/status",), ("patch",)),
    ("rlkube.dev", ("rljobs/finalizers",), ("update",)),
    ("", ("pods",), ("get", "list", "watch", "patch", "delete")),
    ("apps", ("statefulsets",), ("create", "patch", "list", "watch", "delete")),
    ("", ("configmaps", "services", "serviceaccounts"), ("create", "patch", "list", "delete")),
    ("", ("secrets",), ("create", "delete")),
    ("", ("configmaps", "persistentvolumeclaims"), ("get",)),
    ("rbac.authorization.k8s.io", ("roles", "rolebindings"), ("create", "patch", "list", "delete")),
    ("networking.k8s.io", ("networkpolicies",), ("create", "patch", "list", "delete")),
    ("scheduling.volcano.sh", ("podgroups",), ("create", "patch", "list", "delete")),
    ("scheduling.x-k8s.io", ("podgroups",), ("create", "patch", "list", "delete")),
    ("", ("events",), ("create", "list")),
)
# kopf's runtime observation (rbac.kopfObservation), cluster-scoped; Namespaces only
# in namespaced mode (cluster-wide, kopf never lists them).
OBSERVATION_RULES = (("apiextensions.k8s.io", ("customresourcedefinitions",), ("list", "watch")),)
NAMESPACE_OBSERVATION_RULES = (("", ("namespaces",), ("list", "watch")),)
# The cluster-scoped runtimes jobs may name (runtimes.py reads them, handlers.py watches them):
# read only, in both modes.
CLUSTER_RUNTIME_RULES = (("rlkube.dev", ("clusterrljobruntimes",), ("get", "list", "watch")),)

Permission = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def expand(rules: Iterable[tuple[str, tuple[str, ...], tuple[str, ...]]]) -> set[Permission]:
    return {(group, resource, verb) for group, resources, verbs in rules for resource in resources for verb in verbs}


def permissions_of(rules: Iterable[Obj]) -> set[Permission]:
    """The triples a list of rendered PolicyRules grants (resourceNames must not narrow them)."""
    found: set[Permission] = set()
    for rule in rules:
        assert not rule.get("resourceNames"), rule
        assert not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    found.add((group, resource, verb))
    return found


JOB_PERMISSIONS = expand(JOB_RULES)
OBSERVATION_PERMISSIONS = expand(OBSERVATION_RULES)
NAMESPACE_OBSERVATION_PERMISSIONS = expand(NAMESPACE_OBSERVATION_RULES)
CLUSTER_RUNTIME_PERMISSIONS = expand(CLUSTER_RUNTIME_RULES)


# --- helm ----------------------------------------------------------------------------------------


def helm_binary() -> Path:
    return cache_dir() / f"helm-v{HELM_VERSION}" / "bin" / "helm"


class Helm:
    """Runs helm; `kubeconfig` is passed for commands that reach a cluster."""

    def __init__(self, binary: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        command = [str(self.binary), *args]
        if self.kubeconfig is not None:
            command.append(f"--kubeconfig={self.kubeconfig}")
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def template(self, *sets: str, namespace: str = "rlkube-system", release: str = "rlkube") -> list[Obj]:
        """`helm template` with `--set` values, as objects (CRDs left out)."""
        args = ["template", release, str(CHART), "--namespace", namespace]
        for value in sets:
            args += ["--set", value]
        out = self(*args).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(objects: Iterable[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: Iterable[Obj], kind: str) -> Obj:
    found = of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def container(objects: Iterable[Obj]) -> Obj:
    """The operator container of the (single) Deployment."""
    [only] = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


# --- a release in the test cluster ---------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    service_account: str
    notes: str  # what `helm install` printed (NOTES.txt)

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


def release_name() -> str:
    # ClusterRoles are named after the release: unique names keep parallel sessions apart.
    return f"rlkube-{secrets.token_hex(3)}"


@contextmanager
def installed(helm: Helm, kubectl: Kubectl, namespace: str, *sets: str) -> Iterator[Release]:
    """`helm install` of the chart into `namespace`; uninstalled afterwards. The chart's
    own ServiceAccount is named after the release (fullname = release name here)."""
    install_rljob_crd(kubectl)
    name = release_name()
    # The default runtime is cluster-scoped: named after the release, so that releases side
    # by side do not claim the same object.
    args = ["install", name, str(CHART), "--namespace", namespace, "--set", f"defaultRuntime.name={name}"]
    for value in sets:
        args += ["--set", value]
    notes = helm(*args).stdout
    try:
        yield Release(name, namespace, name, notes)
    finally:
        helm("uninstall", name, "--namespace", namespace, "--wait", check=False)


@contextmanager
def scratch_namespaces(kubectl: Kubectl, *names: str) -> Iterator[tuple[str, ...]]:
    """Namespaces for a module's releases and jobs (tests/conftest.py's `namespace`
    fixture is per test); deleted afterwards without waiting."""
    for name in names:
        kubectl("create", "namespace", name)
        kubectl("label", "namespace", name, "rlkube.dev/test=true")
    try:
        yield names
    finally:
        for name in names:
            kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def install_rljob_crd(kubectl: Kubectl) -> None:
    """The current RLJob CRD, applied before any release is installed, so that Helm
    skips its crds/ copy (identical, tests/chart/test_chart.py checks) and never
    becomes the CRD's field manager: a later apply of a changed CRD by another
    manager (tests/operator's fixture, in a reused cluster) would then conflict.
    --force-conflicts takes the fields over from any earlier manager, Helm included."""
    from rlkube_api.crd import CRD_FILES, RUNTIME_CRD_FILES  # noqa: PLC0415
    from rlkube_e2e.testing import wait_established  # noqa: PLC0415

    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILES[0]), "-f", str(RUNTIME_CRD_FILES[0]))
    for crd in ("rljobs.rlkube.dev", "rljobruntimes.rlkube.dev", "clusterrljobruntimes.rlkube.dev"):
        wait_established(kubectl, crd)


def install_monitoring_crds(kubectl: Kubectl) -> None:
    from rlkube_e2e.testing import wait_established  # noqa: PLC0415

    for path in sorted(MONITORING_CRDS.glob("*.yaml")):
        kubectl("apply", "--server-side", "-f", str(path))
    for name in MONITORING_CRD_NAMES:
        wait_established(kubectl, name)


def kubeconfig_with_token(admin_kubeconfig: Path, token: str, path: Path) -> Path:
    """A kubeconfig for the same cluster that authenticates with `token` only."""
    config: Obj = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "chart-operator", "user": {"token": token}}],
                "contexts": [{"name": "chart", "context": {"cluster": cluster["name"], "user": "chart-operator"}}],
                "current-context": "chart",
            }
        )
    )
    path.chmod(0o600)
    return path
