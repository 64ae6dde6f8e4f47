"""A real Kubernetes node for the local cluster: containerd + runc + CNI + kubelet + kube-proxy.

`node.RealNode` starts and stops one node (`start_nodes` starts several side by side); the
end-to-end tests and `make demo` run their pods on such nodes. One module per job: `network`
(the cluster's and nodes' addresses, the pods' CNI config), `netns` (the host bridge, each
node's network namespace and veth, and their removal), `mountns` (the node's mount
namespace: the kubelet's sysctls as files, private /run and /var/log, /var/lib as an
overlay), `containerd`, `kubelet` and `kube_proxy` (each one's config and flags), `dns`
(CoreDNS for the cluster), `image_store` (images imported once and shared by every node).
Nothing on the host changes while a node runs, and `stop()` leaves nothing behind
(`RealNode.leftovers`, `netns.leftovers`).
"""
