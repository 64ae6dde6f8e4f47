"""rlkube_e2e: a local Kubernetes cluster for tests and the demo.

`rlkube_e2e.cluster.LocalCluster` starts etcd, kube-apiserver,
kube-controller-manager and kube-scheduler as local processes, kwok when the cluster
has simulated GPU node pools, and real nodes (kubelet, containerd, runc, kube-proxy,
with CoreDNS; `rlkube_e2e.node`) when asked for;
`python -m rlkube_e2e.cluster up|down|status` is its CLI (wrapped by `e2e/cluster`).
`rlkube_e2e.images` builds the project's images, `rlkube_e2e.release` installs the
chart, `rlkube_e2e.demo` is `make demo`; `rlkube_e2e.testing` holds the helpers
behind the pytest fixtures.
"""
