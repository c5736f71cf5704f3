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
descriptors per listener, for a few seconds. An authenticated connection (an insider holds a
valid certificate) counts against its certificate name: at most ``per_identity`` per name and
``total`` per listener, a silent one is closed after ``first_frame`` seconds, and a newcomer
beyond the bound takes only the place of a silent connection of its own name. Failed accepts
(e.g. no descriptor left) are logged once per kind (:func:`quiet_accept_errors`), and an
allowlist holds addresses, its names resolved once (:func:`resolve`).
"""

from __future__ import annotations

import asyncio
import datetime
import errno
import logging
import secrets
import socket
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

from p2pdp.core.errors import ConfigError
from p2pdp.net.failures import Failure
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
    "quiet_accept_errors",
    "resolve",
    "signing_request",
]

COORDINATOR = "coordinator"
#: Seconds a client has to complete its TLS handshake with a listener of the run.
HANDSHAKE_TIMEOUT = 5.0
_VALIDITY = datetime.timedelta(days=1)

log = logging.getLogger(__name__)


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


def resolve(names: Collection[str]) -> frozenset[str]:
    """The IP addresses of ``names`` (host names or addresses, e.g. a hosts file's
    allowlist), each looked up once with :func:`socket.getaddrinfo`: a listener compares a
    client's address with these, never with a name.

    Raises
    ------
    ConfigError
        A name that does not resolve (naming it and the allowlist).
    """
    addresses: set[str] = set()
    for name in names:
        try:
            found = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError) as error:
            raise ConfigError(
                f"the allowlist's address {name!r} (a hosts file's coordinator or host "
                f"address) does not resolve: {error}; give an IP address or a resolvable name"
            ) from None
        addresses.update(str(info[4][0]) for info in found)
    return frozenset(addresses)


class _Once:
    """Log a warning once per kind (e.g. per errno of a failed accept, per address refused):
    a client, or a shortage of descriptors, cannot grow the log with repeats."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def warn(self, kind: str, message: str, *args: Any) -> None:
        if kind not in self.seen and len(self.seen) < 256:
            self.seen.add(kind)
            log.warning(message + " (logged once)", *args)


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` log a failed ``accept`` (e.g. EMFILE: out of descriptors) once per kind
    instead of a traceback each time (asyncio retries it after a second, so it may fail many
    times); every other error goes to the handler it had."""
    if getattr(loop, "_p2pdp_quiet", False):
        return
    previous = loop.get_exception_handler()
    once = _Once()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and "accept" in str(context.get("message", "")):
            kind = errno.errorcode.get(error.errno or 0, type(error).__name__)
            once.warn(f"accept {kind}", "a listener could not accept a connection: %s", error)
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    loop._p2pdp_quiet = True  # type: ignore[attr-defined]


async def listen(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    address: str,
    context: ssl.SSLContext,
    *,
    pending: int,
    refused: Counter,
    allowed: Collection[str] = (),
    per_identity: int,
    total: int,
    first_frame: float,
    failure: Failure,
) -> asyncio.Server:
    """A TLS listener on ``address`` (a port the OS picks) that calls ``handler`` with each
    authenticated connection; a fault of this listener's own code (not a refusal) is
    reported to its party's ``failure`` (:mod:`p2pdp.net.failures`), which ends its run.

    A connection from an address outside ``allowed`` (when given: IP addresses, see
    :func:`resolve`) is closed at once and counted ``refused["address"]``. At most
    ``pending`` connections hold a handshake's state at once, and at most ``pending`` more
    wait for one (reading nothing): a newcomer beyond them closes the oldest in its handshake
    and, if the queue is full, the oldest in the queue (``"busy"``), and the newest queued
    takes the next free place. An honest client completes its handshake in milliseconds, a
    silent one waits to be evicted. A handshake that fails or takes more than
    ``HANDSHAKE_TIMEOUT`` s is dropped (``"handshake"``).

    Authenticated connections: at most ``per_identity`` per certificate name (the protocol
    needs one per party and listener) and ``total`` in all. A newcomer beyond either bound
    takes the place of the oldest connection of its own name (else, beyond ``total``, of any
    name) that has not sent a byte yet; if every one has, the newcomer is closed
    (``"connections"``). A connection that sends nothing within ``first_frame`` s is closed
    (``"idle"``): an honest party connects to send a frame. So a holder of a valid
    certificate keeps at most ``per_identity`` connections here, and takes no other
    party's place. Every refused connection is closed at once, with its descriptor.
    """
    loop = asyncio.get_running_loop()
    quiet_accept_errors(loop)
    once = _Once()
    holders: dict[asyncio.Transport, None] = {}  # in their handshake, oldest first
    queue: dict[asyncio.Transport, asyncio.Future[bool]] = {}  # waiting, oldest first
    held = 0  # handshakes' states alive: the holders and those evicted, not yet freed
    tasks: set[asyncio.Task[None]] = set()
    # authenticated connections per certificate name, oldest first
    admitted: dict[str | None, dict[asyncio.Transport, Admitted]] = {}

    def settle(place: asyncio.Future[bool], result: bool) -> None:
        if not place.done():  # its task may have been cancelled (the loop is closing)
            place.set_result(result)

    def evict(name: str | None) -> bool:
        """Close the oldest connection of ``name`` (any, if None) that sent nothing yet."""
        for who, connections in admitted.items():
            if name is not None and who != name:
                continue
            victim = next((t for t, p in connections.items() if not p.sent), None)
            if victim is not None:
                del connections[victim]
                refused["connections"] += 1
                victim.abort()
                return True
        return False

    def admit(secure: asyncio.Transport, protocol: Admitted) -> bool:
        who = identity(secure)
        mine = admitted.setdefault(who, {})
        count = sum(map(len, admitted.values()))
        if len(mine) >= per_identity and not evict(who):
            return False
        if count >= total and not evict(who) and not evict(None):
            return False
        mine[secure] = protocol
        protocol.secure, protocol.who = secure, who
        return True

    class Admitted(asyncio.StreamReaderProtocol):
        """An authenticated connection: marks it once it sends a byte, forgets it once
        closed."""

        secure: asyncio.Transport | None = None
        who: str | None = None
        sent = False  # a byte arrived (maybe with the handshake's last, before admit)

        def data_received(self, data: bytes) -> None:
            self.sent = True
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.secure is not None:
                admitted.get(self.who, {}).pop(self.secure, None)
            super().connection_lost(exc)

    def silent(protocol: Admitted) -> None:
        connections = admitted.get(protocol.who, {})
        if protocol.secure in connections and not protocol.sent:
            del connections[protocol.secure]
            refused["idle"] += 1
            protocol.secure.abort()

    async def upgrade(transport: asyncio.Transport) -> None:
        nonlocal held
        peer: Any = transport.get_extra_info("peername")
        if allowed and (not peer or peer[0] not in allowed):
            refused["address"] += 1
            once.warn(
                f"address {peer and peer[0]}",
                "refused a connection from %s: not in the allowlist %s (a hosts file's "
                "coordinator and host addresses, resolved)",
                peer and peer[0],
                sorted(allowed),
            )
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
                settle(place, False)
            queue[transport] = place = loop.create_future()
            if not await place:  # evicted from the queue
                return
        holders[transport] = None
        protocol = Admitted(asyncio.StreamReader(), handler)
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
                settle(place, True)
            else:
                held -= 1
        if holders.pop(transport, 0) is not None or secure is None:  # evicted meanwhile
            transport.abort()
            return
        if not admit(secure, protocol):  # this name has all the connections it may hold here
            refused["connections"] += 1
            once.warn(
                f"connections {identity(secure)}",
                "refused a connection from %r: it holds %d connections here already",
                identity(secure),
                per_identity,
            )
            secure.abort()
            return
        loop.call_later(first_frame, failure.call("a TLS listener's idle check", silent), protocol)
        protocol.connection_made(secure)  # the stream and the handler's task start here

    class Plain(asyncio.Protocol):
        """A connection before its handshake: reads nothing, hands itself to upgrade."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            transport.pause_reading()
            task = loop.create_task(failure.guard("a TLS listener", upgrade(transport)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    return await loop.create_server(Plain, address, 0)
