"""The node's mount namespace: the kubelet's sysctls as files, a private /run and /var/log,
and /var/lib as an overlay whose writes stay in the node's state dir.

`wrap(...)` prefixes a command so it runs inside the node's network namespace and a fresh
private mount namespace set up first (the host's /sys, and so its cgroup mounts, stay visible). The netns is entered before the mounts, because a
private /run hides /run/netns. The host's kernel settings and directories never change
(kubelet would otherwise write three sysctls host-wide): kubelet with protectKernelDefaults only reads the three files, and
what CNI keeps under /var/lib/cni (address leases, results) lands in the overlay's upper
directory. Every mount lives only in the namespace and goes when its last process exits.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from rlkube_e2e.node.kubelet import KERNEL_DEFAULTS


def write_sysctl_files(state_dir: Path) -> dict[Path, Path]:
    """The files to bind over /proc/sys, each holding the value kubelet expects."""
    directory = state_dir / "sysctl"
    directory.mkdir(parents=True, exist_ok=True)
    binds = {}
    for key, value in KERNEL_DEFAULTS.items():
        source = directory / key.replace("/", ".")
        source.write_text(value + "\n")
        binds[source] = Path("/proc/sys") / key
    return binds


def setup_script(state_dir: Path, binds: dict[Path, Path]) -> str:
    run, log = state_dir / "run", state_dir / "log"
    upper, work = var_lib_upper(state_dir), state_dir / "var-lib" / "work"
    made = " ".join(shlex.quote(str(path)) for path in (run, log, upper, work))
    lines = ["set -e", f"mkdir -p {made}"]
    lines += [f"mount --bind {shlex.quote(str(src))} {shlex.quote(str(dst))}" for src, dst in binds.items()]
    overlay = f"lowerdir=/var/lib,upperdir={upper},workdir={work}"
    lines += [
        f"mount --bind {shlex.quote(str(run))} /run",
        f"mount --bind {shlex.quote(str(log))} /var/log",
        f"mount -t overlay rlkube-node-var-lib -o {shlex.quote(overlay)} /var/lib",
        'exec "$@"',
    ]
    return "\n".join(lines)


def var_lib_upper(state_dir: Path) -> Path:
    """Where the node's writes to /var/lib land (the overlay's upper directory)."""
    return state_dir / "var-lib" / "upper"


def provide(state_dir: Path, files: Mapping[PurePosixPath, Path]) -> None:
    """Files the node finds under /var/lib from its start, as a node image ships them: each
    copied to its path in the node (`/var/lib/...`) in the overlay's upper directory, before
    the overlay is mounted; the host's /var/lib is not touched."""
    for inside, source in files.items():
        relative = inside.relative_to("/var/lib")
        target = var_lib_upper(state_dir) / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())


def wrap(netns: str, state_dir: Path, command: list[str]) -> list[str]:
    binds = write_sysctl_files(state_dir)
    script = setup_script(state_dir, binds)
    # nsenter, not `ip netns exec`: the latter remounts /sys for the namespace, which takes
    # the cgroup hierarchies under /sys/fs/cgroup with it, and the kubelet needs them.
    return [
        "nsenter", f"--net=/run/netns/{netns}",
        "unshare", "--mount", "--propagation", "private",
        "sh", "-c", script, "rlkube-node", *command,
    ]  # fmt: skip
