"""A host's connections: enrollment, the control connection, its peers' sockets and writes.

What every host process does on the wire, whatever it runs: it enrolls with the coordinator
for a certificate of its own key (:func:`enroll`), opens its control connection
(:func:`connect_control`), reads each connection's frames until it closes or stays silent
(:func:`serve_frames`), and writes to a peer on one connection per receiver, dropped before
its receiver would close it for silence (:func:`fresh`). Used by the one-shot host
(:class:`p2pdp.net.host.PeerHost`, whose socket layer is :class:`PeerSockets`: a listening
socket per peer and an outbox written in order by one sender task) and the iterative one
(:mod:`p2pdp.net.iterative_host`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from p2pdp.net.failures import Failure
from p2pdp.net.hosts import (
    CERTIFICATE,
    ENROLL,
    ENROLL_BYTES,
    FAILED,
    FAILED_CHARS,
    HostError,
    HostSettings,
    Ticket,
)
from p2pdp.net.tls import (
    COORDINATOR,
    Credential,
    enrollment_client,
    host_name,
    identity,
    listen,
    new_key,
    resolve,
    signing_request,
)
from p2pdp.net.wire import (
    IdleTimeout,
    ProtocolError,
    encode,
    error_reason,
    read_frame,
)
from p2pdp.protocols.groups import ASSIGN, HEADER_BYTES, Send

__all__ = ["PeerSockets", "connect_control", "ended_or_failed", "enroll", "fresh", "serve_frames"]

log = logging.getLogger(__name__)


def fresh(
    writers: dict[int, asyncio.StreamWriter], used: dict[int, float], key: int, idle: float
) -> None:
    """Forget (and close) ``writers[key]`` if it was last used more than ``idle / 2`` seconds
    ago (its receiver closes it after ``idle``:
    :attr:`~p2pdp.net.hosts.HostSettings.peer_idle`); mark it used now. Call before writing,
    then connect if ``key`` is not in ``writers``."""
    now = time.monotonic()
    writer = writers.get(key)
    if writer is not None and now - used.get(key, now) > idle / 2:
        del writers[key]
        writer.close()
    used[key] = now


async def serve_frames(
    reader: asyncio.StreamReader,
    handle: Callable[[dict[str, Any]], None],
    settings: HostSettings | Any,
    max_bytes: int,
    counters: Any,
    who: str = "",
) -> None:
    """Hand each frame of one connection to ``handle`` until it closes, or stays silent
    ``settings.peer_idle`` seconds (``settings``: a host's, one-shot or iterative: its
    ``timeout`` and ``peer_idle``) (``counters.idle_closed``; not logged: its sender connects
    afresh); a frame that breaks the wire format is refused (``counters.refused`` by the
    error's class), logged with its reason after ``who``, and closes this connection only."""
    try:
        while True:
            message = await read_frame(
                reader, timeout=settings.timeout, idle=settings.peer_idle, max_bytes=max_bytes
            )
            if message is None:
                return
            handle(message)
    except IdleTimeout:  # its sender stopped using it: an ordinary close, not a refusal
        counters.idle_closed += 1
    except (ProtocolError, TimeoutError, ConnectionError) as error:
        counters.refused[type(error).__name__] += 1
        log.warning("%srefused a connection: %s", who, error_reason(error))


async def connect_control(
    coordinator: str, port: int, credential: Credential, timeout: float, hint: str = ""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A host's TLS control connection to the coordinator; HostError naming where it looked
    (``hint``: what to check, appended) if it cannot be opened within ``timeout`` seconds."""
    try:
        return await asyncio.wait_for(
            asyncio.open_connection(
                coordinator,
                port,
                ssl=credential.context(server=False),
                server_hostname=COORDINATOR,
            ),
            timeout,
        )
    except (OSError, TimeoutError) as error:
        raise HostError(f"cannot reach the coordinator at {coordinator}:{port}: "
                        f"{error or 'timed out'}{hint}") from None  # fmt: skip


async def enroll(host_index: int, ticket: Ticket, coordinator: str, timeout: float) -> Credential:
    """Host ``host_index``'s credential: a key pair made here (it never leaves this
    process) and the certificate the coordinator's CA issues for it, in exchange for the
    ticket's one-time token and a signing request, over TLS that authenticates the
    coordinator (pinned by the run's CA) and not the host (it has no certificate yet).

    Raises
    ------
    HostError
        The coordinator is unreachable, or refused the enrollment (it closes the connection).
    """
    key = new_key()
    name = host_name(host_index)
    where = f"{coordinator}:{ticket.enrollment_port}"
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                coordinator,
                ticket.enrollment_port,
                ssl=enrollment_client(ticket.authority),
                server_hostname=COORDINATOR,
            ),
            timeout,
        )
    except (OSError, TimeoutError) as error:
        raise HostError(f"cannot reach the coordinator at {where} to enroll: "
                        f"{error or 'timed out'}") from None  # fmt: skip
    try:
        writer.write(
            encode(
                {
                    "kind": ENROLL,
                    "host": host_index,
                    "token": ticket.token,
                    "request": signing_request(name, key),
                }
            )
        )
        answer = await read_frame(reader, timeout=timeout, max_bytes=ENROLL_BYTES)
    except (OSError, TimeoutError, ProtocolError) as error:
        raise HostError(f"enrollment at {where} failed: {error or 'timed out'}") from None
    finally:
        writer.close()
    if (
        answer is None
        or answer["kind"] != CERTIFICATE
        or not isinstance(answer.get("certificate"), bytes)
    ):
        raise HostError(f"the coordinator at {where} refused this host's enrollment")
    return Credential(name=name, certificate=answer["certificate"], key=key,
                      authority=ticket.authority)  # fmt: skip


async def ended_or_failed(
    failure: Failure,
    main: Coroutine[Any, Any, None],
    control: asyncio.StreamWriter,
    host_index: int,
    timeout: float,
) -> None:
    """Run a host's ``main`` (its control loop) under ``failure``
    (:meth:`~p2pdp.net.failures.Failure.race`): at the first fault of the host's callbacks,
    tell the coordinator (``failed``: where and what, which ends the run) and raise
    HostError naming it."""
    try:
        await failure.race(main)
    except HostError as error:
        if failure.fault is None:  # not a fault of the callbacks: the host's own error
            raise
        frame = encode({"kind": FAILED, "host": host_index, "error": str(error)[:FAILED_CHARS]})
        control.write(frame)
        try:
            await asyncio.wait_for(control.drain(), timeout)
        except (OSError, TimeoutError):
            pass  # the coordinator is gone: nothing more to tell
        raise


class PeerSockets:
    """The socket layer of a :class:`p2pdp.net.host.PeerHost` (its base): one listening
    socket per peer, each frame read handed to ``handle``; frames to other peers counted
    when sent and written in order by one sender task, one connection per receiver."""

    peers: list[int]
    settings: HostSettings
    counters: Any  # the host's counts (messages, bytes, wire frames, refusals)
    host_of: np.ndarray
    model_bytes: int
    frame_bytes: int
    ports: list[int]
    addresses: list[str]
    servers: list[asyncio.base_events.Server]
    _server_tls: ssl.SSLContext | None
    _client_tls: ssl.SSLContext | None
    _writers: dict[int, asyncio.StreamWriter]
    _used: dict[int, float]
    _outbox: deque[tuple[int | None, Any]]
    _connecting: dict[int, asyncio.Lock]  # a defaultdict
    _sending: asyncio.Future | None
    _more: asyncio.Event
    failure: Failure  # the first fault of the host's callbacks (its run ends on it)
    handle: Callable[..., None]  # handle(peer, message, who): one frame for an own peer

    async def listen(self, address: str = "127.0.0.1") -> dict[int, int]:
        """Open one listening socket per peer and start the sender task; ``{peer: port}``.
        A fault of either (not a refusal) goes to :attr:`failure`, which ends the host's
        run (:mod:`p2pdp.net.failures`)."""
        self._sending = self.failure.spawn("its sender task", self._sender())
        allowed = resolve(self.settings.allowed)  # once: the names of a hosts file
        ports = {}
        for peer in self.peers:
            serve = self.failure.handler(
                f"peer {peer}'s connection", functools.partial(self._serve, peer)
            )
            if self._server_tls is None:  # tests of the protocol alone
                server = await asyncio.start_server(serve, address, 0)
            else:  # at most a group's worth of handshakes at once, and some slack
                server = await listen(
                    serve,
                    address,
                    self._server_tls,
                    pending=self.settings.group_size + 8,
                    refused=self.counters.refused,
                    allowed=allowed,
                    # one connection from the coordinator and one from each host (one per
                    # receiver), and one each to replace it
                    per_identity=2,
                    total=2 * (self.settings.hosts + 1),
                    first_frame=self.settings.timeout,  # a party connects to send a frame
                    failure=self.failure,
                )
            self.servers.append(server)
            ports[peer] = server.sockets[0].getsockname()[1]
        return ports

    async def _serve(
        self, peer: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Read frames addressed to ``peer`` until the connection closes, or stays silent
        :attr:`~HostSettings.peer_idle` seconds (closed, counted ``idle_closed`` and not
        logged: its sender connects afresh); a frame that breaks the wire format is refused,
        logged with its reason, and closes this connection only."""
        who = identity(writer)  # the certificate's name (TLS), else None
        try:
            await serve_frames(
                reader,
                lambda message: self.handle(peer, message, who),
                self.settings,
                self.frame_bytes,
                self.counters,
                f"peer {peer}: ",
            )
        except asyncio.CancelledError:  # the host is shutting down
            pass
        finally:
            writer.close()

    async def _writer(self, receiver: int) -> asyncio.StreamWriter:
        fresh(self._writers, self._used, receiver, self.settings.peer_idle)
        if receiver not in self._writers:
            async with self._connecting[receiver]:  # one connection per receiver
                if receiver not in self._writers:
                    _, self._writers[receiver] = await asyncio.wait_for(
                        asyncio.open_connection(
                            self.addresses[int(self.host_of[receiver])],
                            self.ports[receiver],
                            ssl=self._client_tls,
                            server_hostname=(
                                host_name(int(self.host_of[receiver])) if self._client_tls else None
                            ),
                        ),
                        self.settings.timeout,
                    )
        return self._writers[receiver]

    def send(self, send: Send, group: int, **fields: Any) -> None:
        """Send one protocol message: counted now, written by the host's sender task in the
        order sent."""
        frame = encode({"kind": send.kind, "sender": send.sender, "group": group, **fields})
        self.send_frame(send.kind, send.sender, [send.receiver], frame)

    def send_frame(
        self, kind: str, sender: int, receivers: list[int], frame: bytes, size: int | None = None
    ) -> None:
        """The same encoded message from ``sender`` to each of ``receivers``; ``size``: its
        bytes as the simulator counts them (default: a model's, a header for an assignment)."""
        counters = self.counters
        n = len(receivers)
        if size is None:
            size = self.model_bytes if kind != ASSIGN else HEADER_BYTES
        counters.messages[sender] += n
        counters.bytes[sender] += n * size
        counters.wire[kind] += n
        counters.wire_bytes[kind] += n * len(frame)
        self._outbox.extend((receiver, frame) for receiver in receivers)
        self._more.set()

    def after_sends(self, action: Callable[[], None]) -> None:
        """Run ``action`` once every frame sent so far is written (at once outside a running
        event loop: the unit tests drive a host by hand)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            action()
            return
        self._outbox.append((None, action))
        self._more.set()

    async def _sender(self) -> None:
        """Write the outbox in order, draining each touched connection before the next
        action (a curator's report waits until its publications are written: back-pressure,
        so no backlog grows without bound). A receiver that is gone costs its frames, never
        this task: a connection that fails is counted ``unreachable`` and dropped."""
        touched: dict[int, asyncio.StreamWriter] = {}
        while True:
            if not self._outbox:
                self._more.clear()
                await self._more.wait()
                continue
            receiver, item = self._outbox.popleft()
            if receiver is None:
                await self._drain(touched)
                item()
                continue
            try:
                writer = await self._writer(receiver)
                if writer.is_closing():  # its other end closed (its host is gone): asyncio
                    raise ConnectionResetError("connection closed")  # would drop it silently
                writer.write(item)
            except (OSError, TimeoutError) as error:
                self._unreachable(receiver, error)
                continue
            touched[receiver] = writer
            if len(touched) >= 64:  # bound the unflushed bytes
                await self._drain(touched)

    async def _drain(self, touched: dict[int, asyncio.StreamWriter]) -> None:
        """Wait until the frames written to ``touched`` receivers left; then forget them. (A
        connection with nothing left to send is not drained: its other end may have closed
        since, after reading everything.)"""
        for receiver, writer in touched.items():
            if not writer.transport.get_write_buffer_size():
                continue
            try:
                await asyncio.wait_for(writer.drain(), self.settings.timeout)
            except (OSError, TimeoutError) as error:  # e.g. its host finished and closed
                self._unreachable(receiver, error)
        touched.clear()

    def _unreachable(self, receiver: int, error: BaseException) -> None:
        self.counters.refused["unreachable"] += 1
        self._writers.pop(receiver, None)
        log.warning("frame to peer %d not delivered: %s", receiver, error)

    async def flush(self) -> None:
        """Wait until every frame sent so far is written (or found undeliverable)."""
        written = asyncio.get_running_loop().create_future()
        self.after_sends(lambda: written.set_result(None))  # only this action resolves it
        await written

    async def close(self) -> None:
        if self._sending is not None:
            self._sending.cancel()
        for server in self.servers:
            server.close()
        for writer in self._writers.values():
            writer.close()
