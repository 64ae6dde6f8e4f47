"""A Kubernetes node that runs its pods as local processes (test infrastructure).

kwok's nodes run nothing. A process node makes the local cluster execute pods
for real, so a test can follow RLJob -> operator -> StatefulSet pods ->
rendezvous -> trainer -> status. Images are ignored: each container's
`command` + `args` runs from the project's virtualenv (its bin directory first
on PATH), as root, in namespaces that make it look like a pod:

- network: a network namespace per pod with its own address on the bridge
  `rlkbr0` (10.89.0.1/16; each node owns a /24), so pods reach each other and
  the host's bridge address; nothing is routed further (network.py);
- DNS: /etc/hosts per namespace with the names CoreDNS would serve for
  StatefulSet pods behind headless Services (dns.py);
- the API server: the service IP 10.96.0.1 on the bridge, forwarded to the
  apiserver (forwarder.py); KUBERNETES_SERVICE_HOST/PORT and the projected
  service-account volume give in-cluster config what it expects;
- files: a private mount namespace per container with a root that mirrors the
  host through bind mounts, plus the pod's own /tmp, /dev/shm and volumes
  (mounts.py, volumes.py); mount targets missing on the host are created in a
  tmpfs, never on the host;
- processes: a PID namespace per container, so killing its init kills the
  whole tree (Ray's daemons included); every process dies with the node
  (launcher.py).
- logs: `kubectl logs` works (kubelet.py serves /containerLogs to the
  apiserver, over TLS with client certificates checked against the cluster CA;
  one CRI-format file per container run, logs.py); every container of a pod
  also appends to one combined file, `ProcessNode.log_path`.

Modules: node.py (ProcessNode: registration, lease, pod watch), pods.py (one
pod's lifecycle), containers.py (one container's runs and restarts),
status.py (pod status, pure), env.py (environment, pure), volumes.py,
mounts.py, launcher.py and linux.py (what runs inside the namespaces),
network.py, dns.py, forwarder.py, api.py, kubelet.py and logs.py; testing.py for pytest fixtures;
`python -m rlkube_e2e.procnode` is the CLI.

Host side effects (root needed): the bridge rlkbr0 with 10.89.0.1/16 and
10.96.0.1/32 (kept after stop, shared by all process nodes), named network
namespaces rlk-<cluster>-<node>-<pod uid> with veth pairs (deleted with their
pods, and at the next start after a crash), /run/rlkube-procnode (address
block claims, hosts files), a TLS listener for the apiserver on 10.89.0.1
(an ephemeral port, the Node's kubelet endpoint), and the node's state directory (pod files, logs,
credentials). No sysctl, iptables rule or host path outside these is changed;
hostPath volumes of type DirectoryOrCreate/FileOrCreate create their path,
as with the kubelet.

Known limits: of the kubelet API only logs (no exec, attach, port-forward), no
Events, no resource limits (no cgroups),
securityContext and hostNetwork are ignored (everything runs as root in the
pod's own network namespace),
probes are not run (a container is Ready while its process runs), projected
tokens and ConfigMap/Secret volumes are written once per pod start, volume
types other than configMap, secret, downwardAPI, projected, emptyDir and
hostPath are refused, sidecar init containers (restartPolicy Always) run as
ordinary ones (so a long-running one blocks the pod), and a pod restarted after
a node restart gets a new address.
"""
