"""The Linux system calls the process node needs that Python 3.11's `os` lacks.

setns, unshare, mount, umount2, pivot_root and prctl through ctypes (os.setns and
os.unshare arrive only in 3.12). Errors become OSError naming the call and its
target, which is what ends up in a pod's log when a mount fails.
"""

from __future__ import annotations

import ctypes
import os
import platform

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2

_PR_SET_PDEATHSIG = 1
# pivot_root has no glibc wrapper; its number differs per architecture.
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def setns(fd: int, nstype: int = 0) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc.mount(_bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data))
    _check(result, f"mount {source or fstype or ''} on {target}")


def umount(target: str, flags: int = MNT_DETACH) -> None:
    _check(_libc.umount2(_bytes(target), flags), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    number = _SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"pivot_root: unsupported architecture {platform.machine()}")
    _check(_libc.syscall(number, _bytes(new_root), _bytes(put_old)), f"pivot_root {new_root}")


def sethostname(name: str) -> None:
    encoded = name.encode()
    _check(_libc.sethostname(encoded, len(encoded)), f"sethostname {name}")


def die_with_parent(signal: int) -> None:
    """Have the kernel send `signal` to this process when the thread that forked it exits."""
    _check(_libc.prctl(_PR_SET_PDEATHSIG, signal, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
