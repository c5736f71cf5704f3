"""Mutual TLS for the network runtime: a certificate authority per run, one key pair per process,
made by the process that uses it.

The coordinator's :class:`Authority` makes, with the `cryptography <https://cryptography.io>`_
library, a fresh CA (ECDSA P-256, valid one day) and the coordinator's own key pair and
certificate, all in the coordinator's process. A host makes its own key pair in its own process
(:func:`new_key`) and enrolls once (:mod:`p2pdp.net.host`): over TLS that authenticates the
coordinator only (pinned by the run's CA certificate, :func:`enrollment_client`), it presents
the one-time random token of its launch bundle and a certificate signing request
(:func:`signing_request`); :meth:`Authority.enroll` checks the token, consumes it, and signs
the request's public key as ``host-N`` for the host index that token was made for, nothing
else. So no private key ever leaves the process that made it (in memory a key is a
``cryptography`` object, which cannot even be pickled), and only a holder of a launch bundle
can get a certificate, once per host.

The name (``coordinator``, ``host-0``, ``host-1``, ...) is both the subject's common name and
its DNS name. Every other connection of a run is TLS 1.2+ with certificates required on both
sides and checked against that CA only; a client also checks that the server is the host it
meant to reach. So a process without a certificate of this run cannot open a connection, and
every frame arrives on a connection whose peer is known (:func:`identity`): a host accepts
assignments only from ``coordinator`` and a peer's messages only from the host that runs that
peer (:mod:`p2pdp.net.host`).

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
import secrets
import ssl
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from p2pdp.net.wire import ProtocolError

__all__ = [
    "COORDINATOR",
    "HANDSHAKE_TIMEOUT",
    "Authority",
    "Credential",
    "enrollment_client",
    "host_name",
    "identity",
    "listen",
    "new_key",
    "signing_request",
]

COORDINATOR = "coordinator"
#: Seconds a client has to complete its TLS handshake with a listener of the run.
HANDSHAKE_TIMEOUT = 5.0
_VALIDITY = datetime.timedelta(days=1)


def host_name(host: int) -> str:
    """The TLS identity of host process ``host``."""
    return f"host-{host}"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh ECDSA P-256 private key (the operating system's CSPRNG, through OpenSSL), to be
    kept by the process that calls this."""
    return ec.generate_private_key(ec.SECP256R1())


def signing_request(name: str, key: ec.EllipticCurvePrivateKey) -> bytes:
    """A PEM certificate signing request for ``name``'s public half of ``key``, signed with
    ``key`` (which proves the requester holds it; the key itself is not in it)."""
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(_name(name))
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


def enrollment_client(authority: bytes) -> ssl.SSLContext:
    """A host's context for its enrollment: it checks the server is this run's
    ``coordinator`` (``authority``: the run's CA certificate, PEM) and presents nothing."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=authority.decode())
    return context


@dataclass(frozen=True)
class Credential:
    """One party's PEM certificate and private key (held in memory by the process that made
    it), and the run's CA certificate."""

    name: str
    certificate: bytes
    key: ec.EllipticCurvePrivateKey
    authority: bytes

    def context(self, *, server: bool, clients: bool = True) -> ssl.SSLContext:
        """An SSLContext that presents this credential and (unless a server with
        ``clients=False``: enrollment) requires the other side's, signed by the run's CA (a
        client also checks the server's name: pass it as ``server_hostname``)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED if clients else ssl.CERT_NONE
        context.load_verify_locations(cadata=self.authority.decode())
        # ssl loads a key from a file only: it is written encrypted under a one-time password
        # held in memory, readable by this user only, and deleted at once
        password = secrets.token_bytes(32)
        with tempfile.TemporaryDirectory() as directory:
            cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
            cert.write_bytes(self.certificate)
            key.touch(mode=0o600)
            key.write_bytes(
                self.key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.BestAvailableEncryption(password),
                )
            )
            context.load_cert_chain(cert, key, password=password)
        return context


class Authority:
    """A run's certificate authority, held by the coordinator only: its CA key, its own
    credential, and one one-time enrollment token per host.

    Parameters
    ----------
    hosts : int
        Host processes of the run (``host-0`` .. ``host-{hosts-1}``).

    Attributes
    ----------
    certificate : bytes
        The CA's PEM certificate (public: every launch bundle carries it).
    credential : Credential
        The coordinator's (its key made here, never sent).
    issued : dict
        Host index -> the PEM certificate issued to it (public).
    """

    def __init__(self, hosts: int) -> None:
        now = datetime.datetime.now(datetime.timezone.utc)
        self._key = new_key()
        self._issuer = _name("p2pdp run CA")
        self._now = now
        ca = (
            x509.CertificateBuilder()
            .subject_name(self._issuer)
            .issuer_name(self._issuer)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.certificate = ca.public_bytes(serialization.Encoding.PEM)
        key = new_key()
        self.credential = Credential(
            name=COORDINATOR,
            certificate=self.sign(COORDINATOR, key.public_key()),
            key=key,
            authority=self.certificate,
        )
        self._tokens = {host: secrets.token_urlsafe(32) for host in range(hosts)}
        self.issued: dict[int, bytes] = {}

    def token(self, host: int) -> str:
        """Host ``host``'s one-time enrollment token (for its launch bundle only)."""
        return self._tokens[host]

    @property
    def enrolled(self) -> bool:
        """Every host has used its token."""
        return not self._tokens

    def sign(self, name: str, public_key: ec.EllipticCurvePublicKey) -> bytes:
        """A PEM certificate for ``name`` (common and DNS name) and ``public_key``."""
        return (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self._issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._now - datetime.timedelta(minutes=5))
            .not_valid_after(self._now + _VALIDITY)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM)
        )

    def enroll(self, host: Any, token: Any, request: Any) -> bytes:
        """Host ``host``'s certificate for the public key of ``request`` (a PEM certificate
        signing request), if ``token`` is its enrollment token; the token is then spent.

        Raises
        ------
        ProtocolError
            Not a host of this run, a wrong or spent token (a second enrollment), or a request
            that is not a valid P-256 request for ``host-N`` signed by its own key (the token
            is spent all the same: it was presented).
        """
        if type(host) is not int or not isinstance(token, str) or not isinstance(request, bytes):
            raise ProtocolError("enrollment needs an int host, a str token and bytes request")
        expected = self._tokens.get(host)
        if expected is None or not secrets.compare_digest(expected.encode(), token.encode()):
            raise ProtocolError(f"enrollment of host {host} with a wrong or spent token")
        del self._tokens[host]
        try:
            csr = x509.load_pem_x509_csr(request)
            public_key = csr.public_key()
            valid = csr.is_signature_valid
        except (ValueError, InvalidSignature, UnsupportedAlgorithm) as error:
            raise ProtocolError(f"host {host}: malformed signing request: {error}") from None
        if not valid or not isinstance(public_key, ec.EllipticCurvePublicKey):
            raise ProtocolError(f"host {host}: signing request not self-signed by a P-256 key")
        if not isinstance(public_key.curve, ec.SECP256R1):
            raise ProtocolError(f"host {host}: signing request for curve {public_key.curve.name}")
        if csr.subject != _name(host_name(host)):
            raise ProtocolError(
                f"host {host} asks for a certificate of {csr.subject.rfc4514_string()!r:.80}"
            )
        self.issued[host] = certificate = self.sign(host_name(host), public_key)
        return certificate


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
