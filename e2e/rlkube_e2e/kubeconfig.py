"""The admin kubeconfig, with certificates embedded so the file works when copied."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from rlkube_e2e.pki import Pki

CONTEXT = "rlkube-e2e"


def write_kubeconfig(path: Path, server: str, pki: Pki) -> None:
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
                "name": "rlkube-admin",
                "user": {
                    "client-certificate-data": data(pki.admin_cert),
                    "client-key-data": data(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": "rlkube-admin"}}],
        "current-context": CONTEXT,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
