"""The real node's config: pure functions, plus containerd parsing what we write."""

from __future__ import annotations

import base64
import ipaddress
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from rlkube_e2e.kubeconfig import write_kubeconfig
from rlkube_e2e.node.containerd import containerd_config, containerd_paths
from rlkube_e2e.node.kubelet import KERNEL_DEFAULTS, KubeletInputs, cgroup_root, kubelet_args, kubelet_config
from rlkube_e2e.node.network import (
    CLUSTER_LINKS,
    MAX_CLUSTERS,
    NODES_PER_CLUSTER,
    POD_RANGES,
    cluster_link,
    cni_conflist,
    node_network,
)
from rlkube_e2e.pki import SERVICE_CLUSTER_IP_RANGE, ensure_pki, issue_node_client_cert


def test_nodes_never_share_a_name_or_an_address() -> None:
    nets = [node_network(c, i) for c in (0, 1, MAX_CLUSTERS - 1) for i in range(NODES_PER_CLUSTER)]
    for field in ("netns", "host_veth", "node_address", "pod_cidr"):
        values = [getattr(n, field) for n in nets]
        assert len(set(values)) == len(values), field
    for n in nets:
        assert n.node_address.network == n.host_address.network
        assert n.node_address.ip != n.host_address.ip
        assert not n.node_address.ip.is_loopback
        assert not n.pod_cidr.overlaps(n.node_address.network)
        assert len(n.host_bridge) <= 15 and len(n.host_veth) <= 15
    # The nodes of one cluster share its bridge; two clusters never do.
    assert len({n.host_bridge for n in nets}) == 3
    services = ipaddress.IPv4Network(SERVICE_CLUSTER_IP_RANGE)
    assert not services.overlaps(CLUSTER_LINKS) and not services.overlaps(POD_RANGES)
    with pytest.raises(ValueError, match="out of range"):
        cluster_link(MAX_CLUSTERS)
    with pytest.raises(ValueError, match="out of range"):
        node_network(0, NODES_PER_CLUSTER)


def test_each_node_routes_every_sibling_slots_pods_through_that_siblings_address() -> None:
    nets = [node_network(3, i) for i in range(NODES_PER_CLUSTER)]
    for net in nets:
        routes = dict(net.sibling_routes)
        assert net.pod_cidr not in routes
        assert {other.pod_cidr: other.node_address.ip for other in nets if other is not net} == routes


def test_pods_get_addresses_from_their_nodes_range() -> None:
    net = node_network(0, 2)
    config = json.loads(cni_conflist(net))
    bridge = config["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["bridge"] == net.pod_bridge
    (range_,) = bridge["ipam"]["ranges"][0]
    assert ipaddress.IPv4Network(range_["subnet"]) == net.pod_cidr
    assert ipaddress.IPv4Address(range_["gateway"]) in net.pod_cidr
    # Every node and the host route the pod ranges: a pod's own address is what peers see.
    assert bridge["ipMasq"] is False


def test_containerd_keeps_everything_under_the_nodes_state_dir(tmp_path: Path) -> None:
    paths = containerd_paths(tmp_path)
    text = containerd_config(paths, "localhost/rlkube/pause:1.36.3", Path("/usr/lib/cni"))
    for path in (paths.root, paths.state, paths.cni_conf_dir):
        assert path.is_relative_to(tmp_path)
        assert f'"{path}"' in text
    # Inside the node's mount namespace /run is the node's own, under its state dir.
    assert paths.socket.is_relative_to("/run") and len(str(paths.socket)) < 108
    assert f'"{paths.socket}"' in text
    assert "restrict_oom_score_adj = true" in text
    assert 'sandbox_image = "localhost/rlkube/pause:1.36.3"' in text


@pytest.mark.skipif(shutil.which("containerd") is None, reason="containerd not installed (make sysdeps)")
def test_containerd_reads_the_config_as_written(tmp_path: Path) -> None:
    paths = containerd_paths(tmp_path)
    paths.config.parent.mkdir(parents=True)
    paths.config.write_text(containerd_config(paths, "localhost/rlkube/pause:1.36.3", Path("/usr/lib/cni")))
    dumped = subprocess.run(
        ["containerd", "--config", str(paths.config), "config", "dump"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    # The dump is containerd's merged view: our values must survive its parsing.
    assert f'root = "{paths.root}"' in dumped
    assert f'address = "{paths.socket}"' in dumped
    assert "restrict_oom_score_adj = true" in dumped
    assert f'conf_dir = "{paths.cni_conf_dir}"' in dumped


def _inputs(tmp_path: Path, dns: str | None) -> KubeletInputs:
    return KubeletInputs(
        node_name="node-a",
        node_ip="10.203.0.2",
        pod_cidr="10.204.0.0/24",
        state_dir=tmp_path,
        runtime_socket=tmp_path / "containerd.sock",
        client_ca=tmp_path / "ca.crt",
        kubeconfig=tmp_path / "kubelet.kubeconfig",
        serving_cert=tmp_path / "kubelet.crt",
        serving_key=tmp_path / "kubelet.key",
        cluster_dns=dns,
    )


def test_kubelet_config_answers_this_machines_quirks(tmp_path: Path) -> None:
    config = kubelet_config(_inputs(tmp_path, dns=None))
    assert config["protectKernelDefaults"] is True
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == cgroup_root("node-a") != cgroup_root("node-b")
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["containerRuntimeEndpoint"] == f"unix://{tmp_path / 'containerd.sock'}"
    assert "clusterDNS" not in config
    assert kubelet_config(_inputs(tmp_path, dns="10.96.0.10"))["clusterDNS"] == ["10.96.0.10"]
    assert set(KERNEL_DEFAULTS) == {"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}


def test_kubelet_registers_with_the_nodes_own_address(tmp_path: Path) -> None:
    args = kubelet_args(Path("/bin/kubelet"), tmp_path / "kubelet.json", _inputs(tmp_path, dns=None))
    assert "--node-ip=10.203.0.2" in args
    assert "--hostname-override=node-a" in args


def test_a_kubelet_is_issued_the_identity_the_node_authorizer_admits(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki")
    issue_node_client_cert(
        pki, tmp_path / "node" / "kubelet-client.crt", tmp_path / "node" / "kubelet-client.key", "node-a"
    )
    cert = x509.load_pem_x509_certificate((tmp_path / "node" / "kubelet-client.crt").read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:node-a"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)

    kubeconfig = tmp_path / "node" / "kubelet.kubeconfig"
    write_kubeconfig(
        kubeconfig,
        "https://10.203.0.1:6443",
        pki,
        user="system:node:node-a",
        client_cert=tmp_path / "node" / "kubelet-client.crt",
        client_key=tmp_path / "node" / "kubelet-client.key",
    )
    config = yaml.safe_load(kubeconfig.read_text())
    (user,) = config["users"]
    assert user["name"] == "system:node:node-a"
    embedded = base64.b64decode(user["user"]["client-certificate-data"])
    assert embedded == (tmp_path / "node" / "kubelet-client.crt").read_bytes()


def test_a_kept_apiserver_certificate_gains_the_link_address_and_the_ca_stays(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki")
    ca_before = pki.ca_cert.read_bytes()

    def ips() -> set[str]:
        cert = x509.load_pem_x509_certificate(pki.apiserver_cert.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}

    assert "10.203.5.1" not in ips()
    ensure_pki(tmp_path / "pki", ("10.203.5.1",))
    assert "10.203.5.1" in ips() and "127.0.0.1" in ips()
    assert pki.ca_cert.read_bytes() == ca_before
    ca = x509.load_pem_x509_certificate(ca_before)
    x509.load_pem_x509_certificate(pki.apiserver_cert.read_bytes()).verify_directly_issued_by(ca)
