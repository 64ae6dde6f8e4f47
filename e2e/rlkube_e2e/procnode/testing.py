"""The process node in tests: a context manager for fixtures, and waits that explain failures.

    @pytest.fixture(scope="module")
    def process_node(cluster, tmp_path_factory):
        with running_node(cluster.kubeconfig, tmp_path_factory.mktemp("procnode")) as node:
            yield node

A wait that times out says what the pod's status was and ends with the pod's
log, which is usually where the reason is.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rlkube_e2e.procnode.node import ProcessNode
from rlkube_e2e.testing import wait_for

LOG_TAIL = 4000


@contextlib.contextmanager
def running_node(
    kubeconfig: Path, state_dir: Path, name: str = "proc-0", labels: Mapping[str, str] | None = None
) -> Iterator[ProcessNode]:
    """A started process node; on exit every pod process is killed and the Node deleted.

    Deleting the Node lets the pod garbage collector remove pods that were still
    being deleted (their namespaces would otherwise stay Terminating).
    """
    node = ProcessNode(kubeconfig, name, labels, state_dir)
    node.start()
    try:
        yield node
    finally:
        node.stop(delete_node=True)


def pod_log(node: ProcessNode, namespace: str, name: str) -> str:
    path = node.log_path(namespace, name)
    return path.read_text(errors="replace") if path.exists() else ""


def read_pod(core: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as a plain dict (kubernetes.client.CoreV1Api `core`), None if it does not exist."""
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415 - heavy, tests only

    try:
        response = core.read_namespaced_pod(name, namespace, _preload_content=False)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    pod: dict[str, Any] = json.loads(response.data)
    return pod


def wait_pod(
    core: Any,
    node: ProcessNode,
    namespace: str,
    name: str,
    what: str,
    probe: Callable[[dict[str, Any]], bool],
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Wait until `probe(pod)` holds; on timeout fail with the pod's status and log."""
    last: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        pod = read_pod(core, namespace, name)
        if pod is None:
            return None
        last.clear()
        last.update(pod)
        return pod if probe(pod) else None

    try:
        return wait_for(check, f"pod {namespace}/{name} {what}", timeout)
    except AssertionError as error:
        status = json.dumps(last.get("status", {}), indent=1)[:3000]
        log = pod_log(node, namespace, name)[-LOG_TAIL:]
        path = node.log_path(namespace, name)
        raise AssertionError(f"{error}\nstatus: {status}\nlog ({path}):\n{log}\nnode log: {node.node_log}") from None


def phase_is(*phases: str) -> Callable[[dict[str, Any]], bool]:
    return lambda pod: (pod.get("status") or {}).get("phase") in phases
