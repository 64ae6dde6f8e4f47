"""rlkube_e2e: a local Kubernetes control plane with fake GPU node pools, for tests.

`LocalCluster` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler
and kwok as local processes; `python -m rlkube_e2e.cluster up|down|status` is its CLI.
"""

from rlkube_e2e.cluster import LocalCluster
from rlkube_e2e.errors import ClusterError

__all__ = ["ClusterError", "LocalCluster"]
