"""A real Kubernetes node for the local cluster: containerd + runc + CNI + kubelet.

Work in progress (issue 28). One module per job: `network` (the node's addresses and its
pods' CNI config), `netns` (its network namespace, veth and host bridge), `mountns` (its
mount namespace: the kubelet's sysctls as files, private /run and /var/log), `containerd`
(the runtime's config), `kubelet` (the kubelet's config and flags). Starting containerd and
the kubelet through `mountns.wrap`, and the `RealNode` object with start()/stop(), are not
written yet: see
docs/development-notes.md, "Session 9: issue 28".
"""
