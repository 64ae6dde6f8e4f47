"""The admin kubeconfig, with certificates embedded so the file works when copied."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from rlkube_e2e.pki import Pki

CONTEXT = "rlkube-e2e"


def write_kubeconfig(
    path: Path,
    server: str,
    pki: Pki,
    *,
    user: str = "rlkube-admin",
    client_cert: Path | None = None,
    client_key: Path | None = None,
) -> None:
    """The admin's kubeconfig, or (given a cert/key pair, e.g. a real kubelet's) another user's."""
    cert = client_cert or pki.admin_cert
    key = client_key or pki.admin_key

    def data(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT,
                "cluster": {"server": server, "certificate-authority-data": data(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": data(cert),
                    "client-key-data": data(key),
                },
            }
        ],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": user}}],
        "current-context": CONTEXT,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
