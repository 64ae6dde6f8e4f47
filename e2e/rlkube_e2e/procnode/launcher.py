"""The processes that hold a pod's namespaces and run its containers.

The node starts them with `command(...)`; both modes read a JSON spec written by
the node and run single-threaded with the standard library only (they start
per container, so they must start fast, and a mount namespace can only be
entered by a single-threaded process).

sandbox    the pod's "pause" process. Joins the pod's network namespace, makes
           its own mount, UTS (hostname) and IPC namespaces, mounts the pod's
           memory-backed volumes there (so they survive container restarts),
           prints "ready" and sleeps until killed.
container  one run of one container. Enters the sandbox's namespaces, makes a
           private mount namespace (a copy of the sandbox's) and a PID
           namespace, builds the root (mounts.py), then forks the PID
           namespace's init, which pivots into the root and forks the command.
           init forwards SIGTERM & co. to the command's process group, reaps
           orphans, and exits with the command's exit code; when init exits the
           kernel kills every process left in the PID namespace, so a
           container's process tree (Ray starts dozens of daemons) never
           outlives it.

Both die with their parent (PR_SET_PDEATHSIG): a node that crashes takes its
pods' processes along.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from rlkube_e2e.procnode import linux, mounts

E2E_DIR = Path(__file__).resolve().parents[2]
# -I -S: no site-packages and no environment variables; the launcher needs only
# the standard library, and starts in a fraction of the time.
_BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from rlkube_e2e.procnode.launcher import main; sys.exit(main(sys.argv[2:]))"
)
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# The exit code of a container that could not be started, as containerd reports it.
START_ERROR_EXIT_CODE = 128
READY = "ready"


def command(python: str, mode: str, spec: Path) -> list[str]:
    return [python, "-I", "-S", "-c", _BOOTSTRAP, str(E2E_DIR), mode, str(spec)]


def main(argv: list[str]) -> int:
    mode, spec_path = argv
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    linux.die_with_parent(signal.SIGKILL)
    if os.getppid() != spec["parent"]:
        return 1  # The node went away before the line above took effect.
    if mode == "sandbox":
        return run_sandbox(spec)
    return run_container(spec)


def run_sandbox(spec: dict[str, Any]) -> int:
    try:
        with open(spec["netns"]) as netns:
            linux.setns(netns.fileno(), linux.CLONE_NEWNET)
        linux.unshare(linux.CLONE_NEWNS | linux.CLONE_NEWUTS | linux.CLONE_NEWIPC)
        mounts.make_private()
        mounts.detach_namespace_files()
        linux.sethostname(spec["hostname"])
        for tmpfs in spec["tmpfs"]:
            linux.mount("tmpfs", tmpfs["path"], "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, f"mode={tmpfs['mode']}")
    except OSError as error:
        print(f"procnode: pod sandbox: {error}", file=sys.stderr, flush=True)
        return 1
    print(READY, flush=True)
    while True:
        signal.pause()


def run_container(spec: dict[str, Any]) -> int:
    # Opened before the root changes: the result file may live outside the container's view.
    result = os.open(spec["result"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _enter_sandbox(spec["sandbox"])
        linux.unshare(linux.CLONE_NEWNS | linux.CLONE_NEWPID)
        mounts.make_private()
        builder = mounts.RootBuilder(Path(spec["root"]), Path(spec["stash"]))
        builder.mirror_host()
        for mount in spec["mounts"]:
            builder.bind(mounts.Mount(**mount))
        builder.ensure(spec["cwd"], directory=True)
        mounts.detach_namespace_files()
    except OSError as error:
        return _start_error(result, f"setting up the container's file system: {error}")
    init = os.fork()
    if init == 0:
        os._exit(_init(spec, result))
    _forward_signals(lambda sig: os.kill(init, sig))
    _, status = os.waitpid(init, 0)
    return _exit_code(status)


def _enter_sandbox(pid: int) -> None:
    # All descriptors first: after joining the mount namespace /proc may differ.
    fds = [os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY) for kind in ("net", "uts", "ipc", "mnt")]
    try:
        for fd in fds:
            linux.setns(fd)
    finally:
        for fd in fds:
            os.close(fd)


def _init(spec: dict[str, Any], result: int) -> int:
    """PID 1 of the container: pivot into the root, run the command, reap, exit with its code."""
    try:
        linux.die_with_parent(signal.SIGKILL)
        root = spec["root"]
        flags = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
        linux.mount("proc", f"{root}/proc", "proc", flags)
        os.chdir(root)
        # pivot_root(".", ".") stacks the old root under the new one; unmounting "."
        # then drops it (as runc does), leaving no way back to the host's tree.
        linux.pivot_root(".", ".")
        linux.umount(".")
        os.chdir(spec["cwd"])
    except OSError as error:
        return _start_error(result, f"entering the container's root: {error}")
    argv: list[str] = spec["argv"]
    env: dict[str, str] = spec["env"]
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            for sig in FORWARDED_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except OSError as error:
            os._exit(_start_error(result, f"exec {argv[0]!r}: {error.strerror} (PATH={env.get('PATH', '')})"))

    def forward(sig: int) -> None:
        try:
            os.killpg(child, sig)
        except ProcessLookupError:
            os.kill(child, sig)

    _forward_signals(forward)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        if pid == child:
            return _exit_code(status)


def _forward_signals(send: Callable[[int], None]) -> None:
    def handler(sig: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            send(sig)

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, handler)


def _start_error(result: int, message: str) -> int:
    os.write(result, json.dumps({"error": message}).encode())
    print(f"procnode: {message}", file=sys.stderr, flush=True)
    return START_ERROR_EXIT_CODE


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    # A process killed by signal N exits with 128 + N in container runtimes' terms.
    return 128 - code if code < 0 else code
