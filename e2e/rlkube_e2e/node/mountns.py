"""The node's mount namespace: the kubelet's sysctls as files, and a private /run and /var/log.

`wrap(...)` prefixes a command so it runs inside the node's network namespace and a fresh
private mount namespace set up first. The netns is entered before the mounts, because a
private /run hides /run/netns. The host's kernel settings and directories never change
(real-node.md quirk 2): kubelet with protectKernelDefaults only reads the three files.
"""

from __future__ import annotations

import shlex
from pathlib import Path

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
    lines = ["set -e", f"mkdir -p {shlex.quote(str(run))} {shlex.quote(str(log))}"]
    lines += [f"mount --bind {shlex.quote(str(src))} {shlex.quote(str(dst))}" for src, dst in binds.items()]
    lines += [
        f"mount --bind {shlex.quote(str(run))} /run",
        f"mount --bind {shlex.quote(str(log))} /var/log",
        'exec "$@"',
    ]
    return "\n".join(lines)


def wrap(netns: str, state_dir: Path, command: list[str]) -> list[str]:
    binds = write_sysctl_files(state_dir)
    script = setup_script(state_dir, binds)
    return [
        "ip", "netns", "exec", netns,
        "unshare", "--mount", "--propagation", "private",
        "sh", "-c", script, "rlkube-node", *command,
    ]  # fmt: skip
