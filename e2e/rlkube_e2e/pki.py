"""Certificates for the local control plane: one CA signs everything.

The layout follows kwokctl's: a CA, a serving certificate for the apiserver, one
admin client certificate in group system:masters (used by the user and by every
component, which keeps the setup small), and a separate service-account signing
key so that tokens the apiserver issues are verifiable the way they are in a real
cluster. EC P-256 keys are used throughout because they are generated in
milliseconds, which matters for a warm start on two cores.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The service CIDR's first address is the ClusterIP of the `kubernetes` Service;
# in-cluster clients verify the apiserver against it.
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def service_account_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.dir / "sa.pub"

    def complete(self) -> bool:
        files = [self.ca_cert, self.ca_key, self.apiserver_cert, self.apiserver_key]
        files += [self.admin_cert, self.admin_key, self.service_account_key, self.service_account_pub]
        return all(path.is_file() for path in files)


def ensure_pki(directory: Path, server_ips: tuple[str, ...] = ()) -> Pki:
    """Create the certificates unless a complete set is already there.

    Reusing them across `down --keep` / `up` keeps kubeconfigs and service-account
    tokens issued earlier valid against the kept etcd data. `server_ips` are addresses the
    apiserver serves on besides loopback (a cluster with real nodes: its link's host
    address); a kept apiserver certificate that lacks one is issued again, the CA kept.
    """
    pki = Pki(directory)
    if pki.complete():
        if not set(server_ips) - _apiserver_ips(pki):
            return pki
        ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
        _issue_apiserver_cert(pki, ca_cert, _load_ca_key(pki), server_ips)
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rlkube-e2e-ca")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki.ca_key, ca_key)
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _issue_apiserver_cert(pki, ca_cert, ca_key, server_ips)
    # Group system:masters is bound to cluster-admin by the apiserver's bootstrap policy.
    _issue(
        pki.admin_cert,
        pki.admin_key,
        common_name="rlkube-admin",
        organization="system:masters",
        ca_cert=ca_cert,
        ca_key=ca_key,
        san=None,
        server=False,
    )

    sa_key = ec.generate_private_key(ec.SECP256R1())
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki


def _issue_apiserver_cert(
    pki: Pki, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, server_ips: tuple[str, ...]
) -> None:
    dns_names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    dns_names.append("kubernetes.default.svc.cluster.local")
    ips = dict.fromkeys(("127.0.0.1", KUBERNETES_SERVICE_IP, *server_ips))
    san = x509.SubjectAlternativeName(
        [x509.DNSName(name) for name in dns_names] + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    )
    _issue(
        pki.apiserver_cert,
        pki.apiserver_key,
        common_name="kube-apiserver",
        organization=None,
        ca_cert=ca_cert,
        ca_key=ca_key,
        san=san,
        server=True,
    )


def _apiserver_ips(pki: Pki) -> set[str]:
    cert = x509.load_pem_x509_certificate(pki.apiserver_cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def _load_ca_key(pki: Pki) -> ec.EllipticCurvePrivateKey:
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pki.ca_key} is not an EC key")
    return ca_key


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    # Backdated a little so a clock that is a few seconds off does not reject a fresh cert.
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
    )


def _issue(
    cert_path: Path,
    key_path: Path,
    *,
    common_name: str,
    organization: str | None,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    san: x509.SubjectAlternativeName | None,
    server: bool,
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(x509.Name(attributes), ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        # Python 3.13+ verifies strictly (RFC 5280) and wants the key identifiers.
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    # Private keys are readable by the owner only, like kubeadm's.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)


def self_signed_server_cert(cert_path: Path, key_path: Path, common_name: str, ips: list[str]) -> None:
    """A self-signed serving certificate for `ips` (a real node's kubelet endpoint: the
    apiserver is given no kubelet CA, so it does not verify it, as with kubeadm's defaults)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips])
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(san, critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def issue_node_client_cert(pki: Pki, cert_path: Path, key_path: Path, node_name: str) -> None:
    """A real kubelet's client certificate: the Node authorizer and NodeRestriction admit a
    kubelet only as user `system:node:<name>` in group `system:nodes`."""
    issue_client_cert(pki, cert_path, key_path, f"system:node:{node_name}", "system:nodes")


def issue_client_cert(pki: Pki, cert_path: Path, key_path: Path, user: str, group: str | None) -> None:
    """A client certificate for `user` (in `group`) signed by the cluster's CA; e.g.
    `system:kube-proxy`, which the apiserver's bootstrap policy binds to system:node-proxier."""
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = _load_ca_key(pki)
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    _issue(
        cert_path,
        key_path,
        common_name=user,
        organization=group,
        ca_cert=ca_cert,
        ca_key=ca_key,
        san=None,
        server=False,
    )
