"""Where the control-plane binaries live.

`e2e/toolchain.sh` builds them into a cache outside the repo, keyed by version; this
module reads the same layout and honours the same environment variables, so the two
never disagree about which build to use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rlkube_e2e.errors import ClusterError

K8S_VERSION = os.environ.get("K8S_VERSION", "1.36.3")
ETCD_VERSION = os.environ.get("ETCD_VERSION", "3.6.10")
KWOK_VERSION = os.environ.get("KWOK_VERSION", "0.8.0")
# Our kwok build carries a patch (e2e/toolchain.sh, build_kwok, says which and why).
KWOK_BUILD = f"kwok-v{KWOK_VERSION}+uid-precondition"
COREDNS_VERSION = os.environ.get("COREDNS_VERSION", "1.14.7")
NETWORK_POLICIES_VERSION = os.environ.get("NETWORK_POLICIES_VERSION", "0.8.0")
# Patched too (e2e/toolchain.sh, build_network_policies, says which and why).
NETWORK_POLICIES_BUILD = f"kube-network-policies-v{NETWORK_POLICIES_VERSION}+xt-nfqueue"


def cache_dir() -> Path:
    return Path(os.environ.get("RLKUBE_CACHE", Path.home() / ".cache" / "rlkube"))


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kwok: Path | None  # None: a cluster without simulated nodes


def find_binaries(kwok: bool = True) -> Binaries:
    """Locate every binary (kwok only when asked: it simulates the pools' nodes), or say in
    one line which is missing and how to get it."""
    cache = cache_dir()
    k8s = cache / f"k8s-v{K8S_VERSION}" / "bin"
    binaries = Binaries(
        etcd=cache / f"etcd-v{ETCD_VERSION}" / "bin" / "etcd",
        kube_apiserver=k8s / "kube-apiserver",
        kube_controller_manager=k8s / "kube-controller-manager",
        kube_scheduler=k8s / "kube-scheduler",
        kwok=cache / KWOK_BUILD / "bin" / "kwok" if kwok else None,
    )
    missing = [path for path in vars(binaries).values() if path is not None and not os.access(path, os.X_OK)]
    if missing:
        names = ", ".join(path.name for path in missing)
        raise ClusterError(f"{names} not found (expected {missing[0]}); run `make toolchain` to build it")
    return binaries


def find_coredns() -> Path:
    """CoreDNS, which only a cluster with real nodes runs."""
    path = cache_dir() / f"coredns-v{COREDNS_VERSION}" / "bin" / "coredns"
    if not os.access(path, os.X_OK):
        raise ClusterError(f"coredns not found (expected {path}); run `make toolchain` to build it")
    return path
