"""Mutual TLS for the network runtime: a certificate authority per run, one identity per process.

:meth:`RunCredentials.generate` makes, with the `cryptography
<https://cryptography.io>`_ library, a fresh CA (ECDSA P-256, valid one day) and one
certificate per party: ``coordinator`` and ``host-0``, ``host-1``, ... (the name is both the
subject's common name and its DNS name). Every connection of a run is TLS 1.2+ with
certificates required on both sides and checked against that CA only; a client also checks
that the server is the host it meant to reach. So a process without a certificate of this run
cannot open a connection, and every frame arrives on a connection whose peer is known
(:func:`identity`): a host accepts assignments only from ``coordinator`` and a peer's
messages only from the host that runs that peer (:mod:`p2pdp.net.host`).

The private keys travel to the host processes the coordinator starts (``spawn`` arguments) and
live in a temporary directory readable by this user only while the run lasts.
"""

from __future__ import annotations

import datetime
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["COORDINATOR", "Credential", "RunCredentials", "host_name", "identity"]

COORDINATOR = "coordinator"


def host_name(host: int) -> str:
    """The TLS identity of host process ``host``."""
    return f"host-{host}"


@dataclass(frozen=True)
class Credential:
    """One party's PEM certificate and private key, and the run's CA certificate."""

    name: str
    certificate: bytes
    key: bytes
    authority: bytes

    def context(self, *, server: bool) -> ssl.SSLContext:
        """An SSLContext that presents this credential and requires the other side's, signed
        by the run's CA (a client also checks the server's name: pass it as
        ``server_hostname``)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=self.authority.decode())
        with tempfile.TemporaryDirectory() as directory:  # ssl loads a chain from files only
            cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
            cert.write_bytes(self.certificate)
            key.touch(mode=0o600)
            key.write_bytes(self.key)
            context.load_cert_chain(cert, key)
        return context


@dataclass(frozen=True)
class RunCredentials:
    """The run's CA certificate and every party's credential (by name)."""

    authority: bytes
    parties: dict[str, Credential]

    @classmethod
    def generate(cls, hosts: int) -> RunCredentials:
        """A fresh CA and credentials for the coordinator and ``hosts`` host processes."""
        now = datetime.datetime.now(datetime.timezone.utc)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "p2pdp run CA")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        authority = ca.public_bytes(serialization.Encoding.PEM)
        parties = {}
        for name in [COORDINATOR, *(host_name(h) for h in range(hosts))]:
            key = ec.generate_private_key(ec.SECP256R1())
            certificate = (
                x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .sign(ca_key, hashes.SHA256())
            )
            parties[name] = Credential(
                name=name,
                certificate=certificate.public_bytes(serialization.Encoding.PEM),
                key=key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                ),
                authority=authority,
            )
        return cls(authority=authority, parties=parties)


def identity(writer: object) -> str | None:
    """The common name of the certificate the other side of a TLS connection presented
    (None without one)."""
    certificate = writer.get_extra_info("peercert") if hasattr(writer, "get_extra_info") else None
    if not certificate:
        return None
    for entry in certificate.get("subject", ()):
        for key, value in entry:
            if key == "commonName":
                return str(value)
    return None
