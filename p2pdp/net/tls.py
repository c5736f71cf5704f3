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

Every listener of a run is made by :func:`listen`: a connection first passes the address
allowlist (if any), then has ``HANDSHAKE_TIMEOUT`` seconds to complete its handshake, and at
most ``pending`` connections per listener hold a handshake's state at once, as many more
wait for one, and a newcomer evicts the oldest. So silent or slow clients hold at most
``pending`` handshakes' memory (~300 KB each, asyncio's TLS buffers) and ``2 pending``
descriptors per listener, for a few seconds.
"""

from __future__ import annotations

import asyncio
import datetime
import ssl
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = [
    "COORDINATOR",
    "HANDSHAKE_TIMEOUT",
    "Credential",
    "RunCredentials",
    "host_name",
    "identity",
    "listen",
]

COORDINATOR = "coordinator"
#: Seconds a client has to complete its TLS handshake with a listener of the run.
HANDSHAKE_TIMEOUT = 5.0


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


async def listen(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    address: str,
    context: ssl.SSLContext,
    *,
    pending: int,
    refused: Counter,
    allowed: Collection[str] = (),
) -> asyncio.Server:
    """A TLS listener on ``address`` (a port the OS picks) that calls ``handler`` with each
    authenticated connection.

    A connection from an address outside ``allowed`` (when given: IP addresses as this
    listener sees them) is closed at once and counted ``refused["address"]``. At most
    ``pending`` connections hold a handshake's state at once, and at most ``pending`` more
    wait for one (reading nothing): a newcomer beyond them closes the oldest in its handshake
    and, if the queue is full, the oldest in the queue (``"busy"``), and the newest queued
    takes the next free place. An honest client completes its handshake in milliseconds, a
    silent one waits to be evicted. A handshake that fails or takes more than
    ``HANDSHAKE_TIMEOUT`` s is dropped (``"handshake"``).
    """
    loop = asyncio.get_running_loop()
    holders: dict[asyncio.Transport, None] = {}  # in their handshake, oldest first
    queue: dict[asyncio.Transport, asyncio.Future[bool]] = {}  # waiting, oldest first
    held = 0  # handshakes' states alive: the holders and those evicted, not yet freed
    tasks: set[asyncio.Task[None]] = set()

    async def upgrade(transport: asyncio.Transport) -> None:
        nonlocal held
        peer: Any = transport.get_extra_info("peername")
        if allowed and (not peer or peer[0] not in allowed):
            refused["address"] += 1
            transport.abort()
            return
        if held < pending:
            held += 1
        else:
            if holders:
                oldest = next(iter(holders))
                del holders[oldest]
                refused["busy"] += 1
                oldest.abort()
            if len(queue) >= pending:
                first, place = next(iter(queue.items()))
                del queue[first]
                refused["busy"] += 1
                first.abort()
                place.set_result(False)
            queue[transport] = place = loop.create_future()
            if not await place:  # evicted from the queue
                return
        holders[transport] = None
        protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(), handler)
        try:
            secure = await loop.start_tls(
                transport,
                protocol,
                context,
                server_side=True,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
            )
        except (OSError, ssl.SSLError, TimeoutError):
            if transport in holders:  # not evicted: its handshake failed or took too long
                del holders[transport]
                refused["handshake"] += 1
            transport.abort()
            return
        finally:  # its state is released: the newest in the queue takes its place
            if queue:
                _, place = queue.popitem()
                place.set_result(True)
            else:
                held -= 1
        if holders.pop(transport, 0) is not None or secure is None:  # evicted meanwhile
            transport.abort()
            return
        protocol.connection_made(secure)  # the stream and the handler's task start here

    class Plain(asyncio.Protocol):
        """A connection before its handshake: reads nothing, hands itself to upgrade."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            transport.pause_reading()
            task = loop.create_task(upgrade(transport))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    return await loop.create_server(Plain, address, 0)
