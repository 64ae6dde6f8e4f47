"""The operator installed as users install it: `helm install` of charts/rlkube, with the
operator image built here (`images.py`) on the local cluster's real nodes.

Shared by `make demo` and the real-node tests, so both run the chart the same way.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

from rlkube_e2e.binaries import cache_dir
from rlkube_e2e.cluster import REPO_ROOT
from rlkube_e2e.errors import ClusterError
from rlkube_e2e.pools import POOL_LABEL

CHART = REPO_ROOT / "charts" / "rlkube"
HELM_VERSION = os.environ.get("HELM_VERSION", "3.21.4")


def helm_binary() -> Path:
    path = cache_dir() / f"helm-v{HELM_VERSION}" / "bin" / "helm"
    if not os.access(path, os.X_OK):
        raise ClusterError(f"helm not found (expected {path}); run `make toolchain`")
    return path


def install_args(release: str, namespace: str, watch: list[str], image_ref: str, pool: str) -> list[str]:
    """`helm install` arguments: the local image, never pulled (no registry), on `pool`."""
    repository, tag = image_ref.rsplit(":", 1)
    escaped = POOL_LABEL.replace(".", "\\.")
    values = {
        "image.repository": repository,
        "image.tag": tag,
        "image.pullPolicy": "Never",
        "watchNamespaces": "{" + ",".join(watch) + "}",
        f"nodeSelector.{escaped}": pool,
    }
    args = ["install", release, str(CHART), "--namespace", namespace, "--create-namespace"]
    for key, value in values.items():
        args += ["--set", f"{key}={value}"]
    return args


def install(kubeconfig: Path, namespace: str, watch: list[str], image_ref: str, pool: str) -> str:
    """Install a release named after the chart and a random suffix; returns its name."""
    release = f"rlkube-{secrets.token_hex(3)}"
    helm(kubeconfig, *install_args(release, namespace, watch, image_ref, pool))
    return release


def uninstall(kubeconfig: Path, namespace: str, release: str) -> None:
    helm(kubeconfig, "uninstall", release, "--namespace", namespace, "--wait", check=False)


def helm(kubeconfig: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [str(helm_binary()), *args, f"--kubeconfig={kubeconfig}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if check and result.returncode != 0:
        raise ClusterError(f"helm {' '.join(args[:2])} failed: {result.stderr.strip()}")
    return result
