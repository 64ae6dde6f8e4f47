"""What `up` records for `down` and `status`: ports, process ids and node names."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlkube_e2e.components import Ports


@dataclass
class ProcessRecord:
    name: str
    pid: int
    binary: str
    log: str


@dataclass
class ClusterState:
    server: str
    ports: Ports
    # Pool name -> node names, as created by the last `up`.
    nodes: dict[str, list[str]] = field(default_factory=dict)
    processes: list[ProcessRecord] = field(default_factory=list)
    # The cluster link's index (node/network.py) when the cluster runs real nodes.
    link: int | None = None
    # Names of the real nodes `up` started (node i is node/network.py's node i of the link).
    real_nodes: list[str] = field(default_factory=list)

    def save(self, path: Path) -> None:
        # Written whole and renamed, so a reader never sees half a file.
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ClusterState | None:
        try:
            raw = json.loads(path.read_text())
            return cls(
                server=raw["server"],
                ports=Ports(**raw["ports"]),
                nodes={str(pool): list(names) for pool, names in raw["nodes"].items()},
                processes=[ProcessRecord(**record) for record in raw["processes"]],
                link=raw.get("link"),
                real_nodes=list(raw.get("real_nodes", [])),
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            # A state file from an older layout: treat it as no cluster rather than fail.
            return None
