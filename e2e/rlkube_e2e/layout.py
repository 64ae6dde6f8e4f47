"""Where a cluster keeps its files inside the state directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlkube_e2e.pki import Pki


@dataclass(frozen=True)
class Layout:
    state_dir: Path

    @property
    def state_file(self) -> Path:
        """Ports, process ids and node names of the running cluster (JSON)."""
        return self.state_dir / "cluster.json"

    @property
    def lock_file(self) -> Path:
        return self.state_dir / ".lock"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> Pki:
        return Pki(self.state_dir / "pki")

    @property
    def etcd_data(self) -> Path:
        return self.state_dir / "etcd"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def cert_dir(self, component: str) -> Path:
        """Where controller-manager and scheduler write their self-signed serving certs."""
        return self.state_dir / "serving-certs" / component

    @property
    def kwok_home(self) -> Path:
        """HOME for kwok, so a developer's ~/.kwok/kwok.yaml cannot add stages."""
        return self.state_dir / "kwok-home"
