"""Kueue's controller as a host process against a local cluster, for the gang admission tests.

The binary, its CRDs and its webhook manifests come from the cache (`e2e/toolchain.sh kueue`
builds them from the Go module, keyed by version). Kueue runs on loopback: its webhook server
on 127.0.0.1 with a certificate made here (the local apiserver listens on loopback too, so the
webhook configurations call it by URL with that certificate as their caBundle), its health and
metrics servers on free ports, no leader election, no internal certificate management, no
visibility API server, and only the `pod` integration.

The session's cluster is shared with every other test, so Kueue is scoped tightly: it manages
only the namespaces labelled `namespace_label` (its managedJobsNamespaceSelector, and the
namespaceSelector of every webhook it serves), and its pod webhooks see only pods that carry
a queue name. Nothing else on the cluster ever calls it, even if it dies.

One object, started and stopped as one: `stop()` removes the webhook configurations and ends
the process. The CRDs stay (inert without the controller; a later start applies them again).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from rlkube_e2e.binaries import cache_dir
from rlkube_e2e.errors import ClusterError
from rlkube_e2e.pki import self_signed_server_cert
from rlkube_e2e.polling import WaitTimedOut, poll_until
from rlkube_e2e.testing import Kubectl, wait_established

KUEUE_VERSION = os.environ.get("KUEUE_VERSION", "0.17.0")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
HOST = "127.0.0.1"
# Kueue reads its metrics server's certificate from this fixed path when it does not manage
# certificates itself (cmd/kueue/main.go); the process sees it through an overlay of /etc in
# a mount namespace of its own, so nothing is written to the host's /etc.
METRICS_CERT_DIR = "kueue/metrics/certs"
# Kueue's own API group and the core group's pods: the webhooks kept from its manifests (the
# other integrations' webhooks would call handlers this configuration does not register).
_KEPT_GROUPS = {"kueue.x-k8s.io", ""}


def kueue_dir() -> Path:
    path = cache_dir() / f"kueue-v{KUEUE_VERSION}"
    if not os.access(path / "bin" / "kueue", os.X_OK) or not (path / "webhook" / "manifests.yaml").is_file():
        raise ClusterError(
            f"Kueue not found (expected {path}/bin/kueue); run `bash e2e/toolchain.sh kueue` to build it"
        )
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def kueue_config(
    namespace_label: dict[str, str], webhook_port: int, cert_dir: Path, health_port: int, metrics_port: int
) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2, the version v0.17 reads)."""
    selector = {"matchLabels": namespace_label}
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": selector,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": HOST, "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"{HOST}:{health_port}"},
        "metrics": {"bindAddress": f"{HOST}:{metrics_port}"},
        "integrations": {"frameworks": ["pod"]},
        # The on-demand visibility server is an aggregated API: it needs an APIService.
        "featureGates": {"VisibilityOnDemand": False},
    }


def webhook_configurations(
    manifests: str, name: str, url_base: str, ca_bundle: bytes, namespace_label: dict[str, str]
) -> list[dict[str, Any]]:
    """Kueue's Mutating- and ValidatingWebhookConfiguration, from its own manifests: only the
    webhooks for its API and for pods, each calling `url_base` + its path instead of a
    Service, limited to the labelled namespaces and (for pods) to pods with a queue name."""
    configurations = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        kept = []
        for webhook in doc.get("webhooks") or []:
            groups = {g for rule in webhook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if not groups or not groups <= _KEPT_GROUPS:
                continue
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"{url_base}{path}", "caBundle": base64.b64encode(ca_bundle).decode()}
            webhook["namespaceSelector"] = {"matchLabels": namespace_label}
            resources = {r for rule in webhook["rules"] for r in rule.get("resources") or []}
            if "pods" in resources:
                webhook["objectSelector"] = {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]}
            kept.append(webhook)
        kind = doc["kind"]
        suffix = "mutating" if kind.startswith("Mutating") else "validating"
        configurations.append(
            {"apiVersion": doc["apiVersion"], "kind": kind, "metadata": {"name": f"{name}-{suffix}"}, "webhooks": kept}
        )
    return configurations


class KueueController:
    """Kueue v0.17 against the cluster of `kubectl`, managing the namespaces that carry
    `namespace_label`; its files (config, certificate, log) in `state_dir`."""

    def __init__(
        self, kubectl: Kubectl, state_dir: Path, namespace_label: dict[str, str], name: str = "rlkube-test-kueue"
    ) -> None:
        self.kubectl = kubectl
        self.state_dir = state_dir
        self.namespace_label = namespace_label
        self.name = name
        self.webhook_port = _free_port()
        self.health_port = _free_port()
        self.metrics_port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._webhooks: list[dict[str, Any]] = []

    @property
    def log_path(self) -> Path:
        return self.state_dir / "kueue.log"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def start(self, timeout: float = 120.0) -> None:
        home = kueue_dir()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._install_crds(home / "crd")
        cert_dir = self.state_dir / "certs"
        cert_dir.mkdir(exist_ok=True)
        cert, key = cert_dir / "tls.crt", cert_dir / "tls.key"
        self_signed_server_cert(cert, key, "kueue-webhook", [HOST])
        # /etc/kueue/metrics/certs as Kueue will see it: the upper layer of its /etc overlay.
        upper, work = self.state_dir / "etc-upper", self.state_dir / "etc-work"
        (upper / METRICS_CERT_DIR).mkdir(parents=True, exist_ok=True)
        work.mkdir(exist_ok=True)
        for source in (cert, key):
            (upper / METRICS_CERT_DIR / source.name).write_bytes(source.read_bytes())
        config = self.state_dir / "config.yaml"
        config.write_text(
            json.dumps(
                kueue_config(self.namespace_label, self.webhook_port, cert_dir, self.health_port, self.metrics_port)
            )
        )
        namespace_flags = ["--mount"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount"]
        overlay = f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
        command = [
            "unshare",
            *namespace_flags,
            "sh",
            "-c",
            f'{overlay} && exec "$@"',
            "kueue",
            str(home / "bin" / "kueue"),
            f"--config={config}",
        ]
        env = {**os.environ, "KUBECONFIG": str(self.kubectl.kubeconfig)}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_ready(timeout)
            self._webhooks = webhook_configurations(
                (home / "webhook" / "manifests.yaml").read_text(),
                self.name,
                f"https://{HOST}:{self.webhook_port}",
                cert.read_bytes(),
                self.namespace_label,
            )
            self.kubectl(
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                "-",
                input=json.dumps({"apiVersion": "v1", "kind": "List", "items": self._webhooks}),
            )
        except BaseException:
            self.stop()
            raise

    def _install_crds(self, crd_dir: Path) -> None:
        # Server-side: the CRDs are too large for client-side apply's last-applied annotation.
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_dir), timeout=120)
        for crd in sorted(crd_dir.glob("*.yaml")):
            # kueue.x-k8s.io_workloads.yaml -> workloads.kueue.x-k8s.io
            group, plural = crd.stem.split("_", 1)
            wait_established(self.kubectl, f"{plural}.{group}")

    def _wait_ready(self, timeout: float) -> None:
        """readyz turns 200 once the webhook server listens (Kueue's own readiness check)."""
        process = self.process
        assert process is not None

        def ready() -> bool:
            if process.poll() is not None:
                raise ClusterError(f"Kueue exited with {process.returncode}: {self.log_tail()}")
            urllib.request.urlopen(f"http://{HOST}:{self.health_port}/readyz", timeout=1).close()
            with socket.create_connection((HOST, self.webhook_port), timeout=1):
                return True

        try:
            poll_until(ready, "Kueue's /readyz and webhook port", timeout=timeout)
        except WaitTimedOut as error:
            raise ClusterError(f"{error}: {self.log_tail()}") from None

    def stop(self) -> None:
        """The webhook configurations first (nothing may call a Kueue that is gone), then the process."""
        for configuration in self._webhooks:
            kind = (
                "mutatingwebhookconfiguration"
                if configuration["kind"].startswith("Mutating")
                else "validatingwebhookconfiguration"
            )
            self.kubectl("delete", kind, configuration["metadata"]["name"], "--ignore-not-found", check=False)
        self._webhooks = []
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
