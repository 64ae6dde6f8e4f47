"""Reads the history rows of an offline W&B run back from its `.wandb` file: the
LevelDB log format (32 KiB blocks of records with a 7-byte header) after W&B's own
7-byte header, each record a `wandb_internal_pb2.Record`."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7  # ':W&B', magic, version
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    raw = path.read_bytes()
    assert raw[:4] == b":W&B", f"{path} is not a W&B run file"
    out: list[bytes] = []
    pending = b""
    pos = HEADER
    while pos + 7 <= len(raw):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        pos += 7
        if kind == 0:
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        pending += raw[pos : pos + length]
        pos += length
        if kind in (FULL, LAST):
            out.append(pending)
            pending = b""
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """The rows `run.log` wrote, W&B's own `_step`, `_runtime`, `_timestamp` included."""
    from wandb.proto import wandb_internal_pb2 as pb  # noqa: PLC0415

    rows = []
    for data in records(path):
        record = pb.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    return rows


def run_info(path: Path) -> dict[str, str]:
    from wandb.proto import wandb_internal_pb2 as pb  # noqa: PLC0415

    for data in records(path):
        record = pb.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "run":
            return {"project": record.run.project, "name": record.run.display_name, "id": record.run.run_id}
    return {}
