"""The kubelet's config and flags for one real node.

Every setting that differs from a stock node answers something about running a node inside
a shared host (its kernel settings, cgroups and addresses must stay untouched); the comments
say what.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The three sysctls kubelet would write host-wide at start. With protectKernelDefaults it
# only checks them; the node's mount namespace bind-mounts files holding these values
# over /proc/sys, so the host's kernel settings never change.
KERNEL_DEFAULTS: dict[str, str] = {
    "vm/overcommit_memory": "1",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
}


@dataclass(frozen=True)
class KubeletInputs:
    node_name: str
    node_ip: str
    pod_cidr: str
    state_dir: Path
    runtime_socket: Path
    client_ca: Path
    kubeconfig: Path
    serving_cert: Path
    serving_key: Path
    cluster_dns: str | None
    # Host-wide unique (node names are unique only within a cluster): names the cgroup root.
    cgroup_id: str = ""
    cluster_domain: str = "cluster.local"
    port: int = 10250


ROOT_DIR_IN_NODE = "/var/lib/kubelet"
# Where the kubelet finds a pod's `seccompProfile: {type: Localhost}` (its root dir's `seccomp`).
SECCOMP_DIR_IN_NODE = f"{ROOT_DIR_IN_NODE}/seccomp"


def cgroup_root(cgroup_id: str) -> str:
    """A cgroup tree of the node's own, apart from the host's, so stop() can remove it whole."""
    return f"/rlkube/{cgroup_id}"


def kubelet_config(inputs: KubeletInputs) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": inputs.node_ip,
        "port": inputs.port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "containerRuntimeEndpoint": f"unix://{inputs.runtime_socket}",
        # Quirk 3: cgroup v1 controllers on these VMs; 1.36 refuses v1 unless told.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root(inputs.cgroup_id or inputs.node_name),
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        # Quirk 2: check, never write, the kernel's settings.
        "protectKernelDefaults": True,
        # Quirk 7: no registry to pull back a collected image from.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # Small shared disks: evicting test pods for disk pressure would only confuse.
        "evictionHard": {"nodefs.available": "1%", "imagefs.available": "1%", "memory.available": "50Mi"},
        "podCIDR": inputs.pod_cidr,
        "failSwapOn": False,
        "tlsCertFile": str(inputs.serving_cert),
        "tlsPrivateKeyFile": str(inputs.serving_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(inputs.client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "resolvConf": str(inputs.state_dir / "resolv.conf"),
        "serializeImagePulls": False,
        "staticPodPath": "",
        "fileCheckFrequency": "20s",
        "nodeStatusReportFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
    }
    if inputs.cluster_dns is not None:
        config["clusterDNS"] = [inputs.cluster_dns]
        config["clusterDomain"] = inputs.cluster_domain
    return config


def write_kubelet_config(path: Path, inputs: KubeletInputs) -> None:
    # JSON is YAML, so the kubelet reads it without a YAML writer here.
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kubelet_config(inputs), indent=2) + "\n")


def kubelet_args(kubelet: Path, config: Path, inputs: KubeletInputs) -> list[str]:
    return [
        str(kubelet),
        f"--config={config}",
        f"--kubeconfig={inputs.kubeconfig}",
        # Inside the node's mount namespace /var/lib is an overlay whose writes land in the
        # node's state dir (mountns.py); the default path keeps the kubelet's unix sockets
        # (device plugins, pod resources) under the 108-byte limit a temporary dir can exceed.
        f"--root-dir={ROOT_DIR_IN_NODE}",
        f"--hostname-override={inputs.node_name}",
        # A real (non-loopback) address on the node's veth: pods on other nodes and the
        # apiserver (which reaches the kubelet there for logs and exec) must reach it.
        f"--node-ip={inputs.node_ip}",
        # v=2 logs each pod's sync, which is what tells why a pod sits Pending on a node.
        "--v=2",
    ]
