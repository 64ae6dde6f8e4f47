"""The sandbox's wrapper executable: confines itself, then execs the interpreter on the script.

Run by `sandbox.run_python` as `python -I -S sandbox_exec.py LIMITS_JSON SCRATCH SCRIPT` (a file,
not a module, so it imports nothing but the standard library, in a fresh process: setting
limits between fork and exec in the trainer's threaded process would not be safe). In order:
rlimits; a network namespace of its own (as root directly, otherwise through a user namespace);
Landlock, so that the code can read and execute only the interpreter's installation and read
and write only its scratch directory (no /etc/passwd, no project files, no other /tmp), cannot
bind or connect TCP sockets, signal or reach abstract UNIX sockets outside the sandbox; then
exec. Where the kernel or the pod's seccomp profile refuses a namespace or Landlock and the
limits require it, it exits with NO_NETWORK or NO_LANDLOCK instead of running unconfined.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

NO_NETWORK = 97
NO_LANDLOCK = 98

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
# Landlock's system calls have one number on every architecture (asm-generic).
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
# Filesystem rights, by the ABI version that added them.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FILE_RIGHTS_ABI: dict[int, int] = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_TCP_BIND, _TCP_CONNECT = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def drop_network() -> bool:
    # os.unshare exists only from Python 3.12; the trainer image runs 3.11.
    if _libc.unshare(_CLONE_NEWNET) == 0:
        return True
    return bool(_libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when absent or refused (seccomp, disabled LSM)."""
    version = _libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def _file_rights(abi: int) -> int:
    return _FILE_RIGHTS_ABI[max(v for v in _FILE_RIGHTS_ABI if v <= abi)]


def _allow(ruleset: int, path: str, rights: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if not os.path.isdir(path):  # a file takes only the rights that apply to files
            rights &= _EXECUTE | _WRITE_FILE | _READ_FILE | (1 << 14) | (1 << 15)
        rule = _PathBeneathAttr(rights, fd)
        if _libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    finally:
        os.close(fd)


def confine(read_only: list[str], read_write: list[str]) -> bool:
    """Landlock for this process and what it execs; False when the kernel offers none."""
    abi = landlock_abi()
    if abi < 1:
        return False
    handled = _file_rights(abi)
    attr = _RulesetAttr(
        handled, _TCP_BIND | _TCP_CONNECT if abi >= 4 else 0, _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if abi >= 6 else 0
    )
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the struct as the running ABI knows it
    ruleset = int(_libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)))
    if ruleset < 0:
        return False
    try:
        for path in read_only:
            if os.path.exists(path):
                _allow(ruleset, path, _EXECUTE | _READ_FILE | _READ_DIR)
        for path in read_write:
            _allow(ruleset, path, handled)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        return bool(_libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) == 0)
    finally:
        os.close(ruleset)


def _set_limits(limits: dict[str, int]) -> None:
    for name, key in (
        (resource.RLIMIT_CPU, "cpu_seconds"),
        (resource.RLIMIT_AS, "memory_bytes"),
        (resource.RLIMIT_FSIZE, "max_file_bytes"),
        # Counts every process of the uid and root ignores it; the wall-clock kill of the
        # process group is the fork-bomb guard there.
        (resource.RLIMIT_NPROC, "max_processes"),
    ):
        resource.setrlimit(name, (limits[key], limits[key]))


def main(argv: list[str]) -> None:
    limits, scratch, script = json.loads(argv[1]), argv[2], argv[3]
    if not drop_network() and limits["require_no_network"]:
        os.write(2, b"rlkube-sandbox: cannot unshare the network namespace\n")
        os._exit(NO_NETWORK)
    interpreter = os.path.realpath(sys.executable)
    # The interpreter's installation (its stdlib and shared libraries) and nothing else to read.
    runtime = sorted({sys.base_prefix, sys.base_exec_prefix, "/lib", "/lib64", "/usr/lib", "/usr/lib64", interpreter})
    if not confine(runtime, [scratch]) and limits["require_filesystem_isolation"]:
        os.write(2, b"rlkube-sandbox: Landlock is not available to confine the filesystem\n")
        os._exit(NO_LANDLOCK)
    _set_limits(limits)
    os.execv(interpreter, [interpreter, "-I", "-S", script])


if __name__ == "__main__":
    main(sys.argv)
