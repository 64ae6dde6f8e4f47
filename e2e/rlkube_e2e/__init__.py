"""rlkube_e2e: a local Kubernetes control plane with fake GPU node pools, for tests.

`rlkube_e2e.cluster.LocalCluster` starts etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok as local processes;
`python -m rlkube_e2e.cluster up|down|status` is its CLI (wrapped by `e2e/cluster`).
`rlkube_e2e.testing` holds the helpers behind the pytest fixtures.
"""
