"""A real Kubernetes node for the local cluster: containerd + runc + CNI + kubelet.

Work in progress (issue 28). One module per job: `network` (the node's addresses and its
pods' CNI config), `containerd` (the runtime's config), `kubelet` (the kubelet's config and
flags). The process that starts them inside the node's own network and mount namespaces,
and the `RealNode` object with start()/stop(), are not written yet: see
docs/development-notes.md, "Session 9: issue 28".
"""
