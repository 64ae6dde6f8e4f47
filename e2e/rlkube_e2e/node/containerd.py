"""containerd's config for one real node: its own root, state and socket, no host defaults.

containerd 1.6 (Debian bookworm) reads config version 2. The node's state dir holds
everything, so two nodes on one host never share a store or a socket.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ContainerdPaths:
    root: Path
    state: Path
    socket: Path
    cni_conf_dir: Path
    config: Path


# The socket as seen inside the node's mount namespace, whose /run is the node's own
# (`<state dir>/run`, mountns.py): a unix socket's path may not exceed 108 bytes, which a
# path under a test's temporary directory easily does. Clients outside the namespace reach
# it through nsenter.
SOCKET_IN_NODE = Path("/run/containerd/containerd.sock")


def containerd_paths(state_dir: Path) -> ContainerdPaths:
    base = state_dir / "containerd"
    return ContainerdPaths(
        root=base / "root",
        state=base / "state",
        socket=SOCKET_IN_NODE,
        cni_conf_dir=state_dir / "cni" / "net.d",
        config=base / "config.toml",
    )


def _quoted(value: str) -> str:
    # TOML basic strings: only backslash and double quote need escaping in our paths.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def containerd_config(paths: ContainerdPaths, sandbox_image: str, cni_bin_dir: Path) -> str:
    """The config.toml text.

    restrict_oom_score_adj: these VMs lack CAP_SYS_RESOURCE in the bounding set, so runc
    fails every sandbox when asked to lower oom_score_adj.
    The CRI's own image GC does not exist in 1.6; the kubelet's is turned off in its config.
    """
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        "version = 2",
        f"root = {_quoted(str(paths.root))}",
        f"state = {_quoted(str(paths.state))}",
        "",
        "[grpc]",
        f"  address = {_quoted(str(paths.socket))}",
        "",
        "[ttrpc]",
        f"  address = {_quoted(str(paths.socket) + '.ttrpc')}",
        "",
        f"[{cri}]",
        f"  sandbox_image = {_quoted(sandbox_image)}",
        "  restrict_oom_score_adj = true",
        "  enable_selinux = false",
        "",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        "",
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        "",
        f"[{cri}.containerd.runtimes.runc.options]",
        # The kubelet runs with cgroupDriver cgroupfs; runc must agree.
        "  SystemdCgroup = false",
        "",
        f"[{cri}.cni]",
        f"  bin_dir = {_quoted(str(cni_bin_dir))}",
        f"  conf_dir = {_quoted(str(paths.cni_conf_dir))}",
        "",
    ]
    return "\n".join(lines)


# The kubelet's first CRI call; an empty request is a valid encoding of its message.
CRI_VERSION_METHOD = "/runtime.v1.RuntimeService/Version"


def cri_serving(socket: Path, timeout: float = 5.0) -> bool:
    """Whether containerd's CRI answers on `socket`. containerd serves its own API first and
    refuses CRI calls ("server is not initialized yet") until the CRI plugin has recovered its
    state, which on a cold page cache and a large image store takes seconds: a kubelet started
    in between exits at once."""
    import grpc  # noqa: PLC0415  (only a node's start needs it)

    with grpc.insecure_channel(f"unix://{socket}") as channel:
        version = channel.unary_unary(
            CRI_VERSION_METHOD, request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw
        )
        try:
            version(b"", timeout=timeout)
        except grpc.RpcError:
            return False
    return True
