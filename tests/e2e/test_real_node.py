"""A real node (issue 28): kubelet + containerd + runc + CNI joined to a control plane of its
own, running a pod from an image built here, and leaving nothing on the host once stopped."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import time
from collections.abc import Iterator

import pytest

from rlkube_e2e.cluster import LocalCluster
from rlkube_e2e.kubeapi import KubeApi
from rlkube_e2e.node import netns
from rlkube_e2e.node.network import cluster_link
from rlkube_e2e.node.node import NodeError, RealNode, find_node_binaries

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
]


def _wait_phase(api: KubeApi, path: str, phases: set[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    pod: dict = {}
    while time.monotonic() < deadline:
        pod = api.get(path)
        if pod.get("status", {}).get("phase") in phases:
            return pod
        time.sleep(0.5)
    raise AssertionError(f"{path} not in {phases} after {timeout} s: {json.dumps(pod.get('status'))[:2000]}")


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, RealNode]]:
    from rlkube_e2e.images import ensure_image  # noqa: PLC0415 - builds only when this test runs

    try:
        find_node_binaries()
    except NodeError as error:
        pytest.skip(str(error))
    base = ensure_image("base")
    root = tmp_path_factory.mktemp("real-node")
    pools = root / "pools.yaml"
    pools.write_text("pools: {}\n")
    cluster = LocalCluster(root / "cluster", pools, die_with_parent=True, node_network=True)
    cluster.up()
    try:
        state = cluster._require_state()
        assert state.link is not None
        node = RealNode(
            name="real-0",
            link_index=state.link,
            index=0,
            server=cluster.server,
            pki=cluster.layout.pki,
            state_dir=root / "node-0",
            labels={"rlkube.dev/pool": "real"},
            images=(base.path,),
        )
        node.start()
        try:
            yield cluster, node
        finally:
            node.stop()
    finally:
        link = cluster_link(state.link) if state.link is not None else None
        cluster.down()
    assert node.leftovers() == []
    if link is not None:
        assert netns.link_leftovers(link) == []


def test_a_pod_from_an_image_built_here_runs_and_its_logs_reach_the_api(
    real_cluster: tuple[LocalCluster, RealNode],
) -> None:
    from rlkube_e2e.images import ensure_image  # noqa: PLC0415

    cluster, node = real_cluster
    api = cluster.api()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {
            "nodeSelector": {"rlkube.dev/pool": "real"},
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": ensure_image("base").ref,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", "import socket; print('hello from', socket.gethostname())"],
                }
            ],
        },
    }
    api.call("POST", "/api/v1/namespaces/default/pods", pod)
    done = _wait_phase(api, "/api/v1/namespaces/default/pods/hello", {"Succeeded", "Failed"}, 120)
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"])[:2000]
    assert done["spec"]["nodeName"] == node.name
    assert ipaddress.ip_address(done["status"]["podIP"]) in node.net.pod_cidr
    status, logs = api.request("GET", "/api/v1/namespaces/default/pods/hello/log")
    assert status == 200, logs
    assert logs.strip() == "hello from hello"
