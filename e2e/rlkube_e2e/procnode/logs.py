"""Container logs as the kubelet keeps them: one file per container run, a timestamp per line.

A container's stdout and stderr (one pipe) are copied to two places: the pod's
combined log (raw bytes, what tests and the demo read) and the run's own file in
the CRI logging format the kubelet writes (`<RFC 3339 time> <F|P> <text>`: F ends
a line, P is a piece of one), which is what `kubectl logs` options need:
`--timestamps`, `--since`, `--tail`, `--limit-bytes`, `--previous`, `-f`.
Pure functions apart from the copier and the file reads.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# A line longer than this is stored as pieces (the kubelet splits at 16 KiB as well).
MAX_PIECE = 16 * 1024
FOLLOW_POLL = 0.2


def stamp(when: datetime.datetime | None = None) -> str:
    moment = when or datetime.datetime.now(datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def encode(data: bytes, pending: bytearray, when: str, *, final: bool = False) -> bytes:
    """CRI log lines for `data` (appended to what `pending` holds of an unfinished line);
    `pending` keeps the new unfinished rest. At the end of the stream (`final`) the rest is
    written as a piece."""
    pending += data
    out = bytearray()
    while True:
        end = pending.find(b"\n", 0, MAX_PIECE + 1)
        if end != -1:
            out += f"{when} F ".encode() + pending[:end] + b"\n"
            del pending[: end + 1]
        elif len(pending) > MAX_PIECE or (final and pending):
            piece = pending[:MAX_PIECE]
            out += f"{when} P ".encode() + piece + b"\n"
            del pending[: len(piece)]
        else:
            break
    return bytes(out)


def copy_output(source: int, combined: Path, run_log: Path) -> None:
    """Copy the container's output pipe (fd `source`, closed at the end) into the pod's combined
    log and the run's CRI log until every writer has closed it."""
    pending = bytearray()
    try:
        with combined.open("ab") as raw, run_log.open("ab") as cri:
            while chunk := os.read(source, 65536):
                raw.write(chunk)
                raw.flush()
                cri.write(encode(chunk, pending, stamp()))
                cri.flush()
            cri.write(encode(b"", pending, stamp(), final=True))
    finally:
        os.close(source)


class LogRequestError(Exception):
    """A log request that cannot be answered; `status` is the HTTP status the kubelet gives."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class LogSource:
    """Where a container run's log is and whether the run still writes to it."""

    path: Path
    running: Callable[[], bool]


@dataclass(frozen=True)
class Entry:
    time: datetime.datetime
    stamp: str
    text: bytes  # with its newline when the entry ends a line

    def render(self, timestamps: bool) -> bytes:
        return (f"{self.stamp} ".encode() + self.text) if timestamps else self.text


def parse(line: bytes) -> Entry | None:
    """One CRI log line; None for a line that is not one (never written by `encode`)."""
    parts = line.rstrip(b"\n").split(b" ", 2)
    if len(parts) < 2 or parts[1] not in (b"F", b"P"):
        return None
    text = parts[2] if len(parts) == 3 else b""
    try:
        when = datetime.datetime.fromisoformat(parts[0].decode())
    except ValueError:
        return None
    return Entry(when, parts[0].decode(), text + b"\n" if parts[1] == b"F" else text)


@dataclass(frozen=True)
class LogQuery:
    """The kubelet's containerLogs options (already validated)."""

    follow: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since: datetime.datetime | None = None


def read(path: Path, query: LogQuery, running: Callable[[], bool]) -> Iterator[bytes]:
    """What `kubectl logs` prints for the run logged in `path`: the selected entries, then, with
    `follow`, new ones while `running()` holds."""
    budget = query.limit_bytes

    def emit(entries: list[Entry]) -> Iterator[bytes]:
        nonlocal budget
        for entry in entries:
            if query.since is not None and entry.time < query.since:
                continue
            data = entry.render(query.timestamps)
            if budget is not None:
                data = data[:budget]
                budget -= len(data)
            if data:
                yield data
            if budget == 0:
                return

    with path.open("rb") as handle:
        entries = [e for e in map(parse, handle.readlines()) if e is not None]
        offset = handle.tell()
    if query.tail_lines is not None:
        entries = entries[-query.tail_lines :] if query.tail_lines > 0 else []
    yield from emit(entries)
    if not query.follow:
        return
    partial = b""
    while budget != 0:
        alive = running()  # asked before reading, so nothing written before it ended is missed
        with path.open("rb") as handle:
            handle.seek(offset)
            data = partial + handle.read()
            offset = handle.tell()
        complete, _, partial = data.rpartition(b"\n")
        if complete:
            yield from emit([e for e in map(parse, complete.split(b"\n")) if e is not None])
        if not alive:
            return
        time.sleep(FOLLOW_POLL)
