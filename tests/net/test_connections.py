"""Connections between hosts: senders outlive receivers, idle connections close, listeners
bound silent clients and shut down or run out of descriptors without a traceback.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys

import numpy as np
import pytest

from p2pdp.net import tls
from p2pdp.net.host import PeerHost
from p2pdp.net.hosts import HostSettings
from p2pdp.net.wire import (
    encode,
)
from tests.net.helpers import ASSIGN_0, _credentials, _full_publication, _host, _tls_host


def test_a_host_keeps_sending_when_a_receiver_is_gone():
    """A connection that fails while draining (its host finished and closed, say), or that
    is known closed already (its host was killed), costs its frames, counted, not the
    host's sender: later frames are still written and a flush returns."""

    class Gone:  # a connection whose other end has closed, with a frame still to send
        class transport:
            @staticmethod
            def get_write_buffer_size():
                return 1

        def is_closing(self):  # not known to be closed yet: the drain finds out
            return False

        def write(self, data):
            pass

        async def drain(self):
            raise ConnectionResetError("Connection lost")

        def close(self):
            pass

    class Closed(Gone):  # its other end closed and asyncio knows: a write would vanish
        def is_closing(self):
            return True

        def write(self, data):
            raise AssertionError("written to a closed connection, dropped without a count")

    async def go():
        host = _host([])
        host._sending = asyncio.ensure_future(host._sender())
        host._writers = {1: Gone(), 2: Gone(), 3: Closed()}
        host.send_frame("publish", 0, [1, 2, 3], b"frame")
        await asyncio.wait_for(host.flush(), 5)
        host._writers[1] = Gone()
        host.send_frame("publish", 0, [1], b"frame")
        await asyncio.wait_for(host.flush(), 5)
        await host.close()
        return host

    host = asyncio.run(go())
    assert host.counters.refused["unreachable"] == 4
    assert 3 not in host._writers  # the next frame to peer 3 connects afresh
    assert host.counters.wire["publish"] == 4  # counted as sent, as the simulator counts them


def test_a_peers_socket_closes_an_idle_connection_and_senders_connect_afresh(caplog):
    """A peer's socket keeps a connection that sends nothing for ``peer_idle`` seconds (a
    group's time and two timeouts; it was 600 s): peer 0's host sends a frame to peer 1, stays
    silent past that, and sends another: its receiver closed the first connection, and the
    sender, which drops a connection unused for half that, reconnected: both frames arrive,
    nothing is lost."""
    settings = HostSettings(
        n_peers=2, hosts=2, full_publication=False, collect_timeout=0.2, timeout=0.2
    )
    assert settings.peer_idle == pytest.approx(0.6)
    releaser = _host([]).releaser

    def host(peer):
        return PeerHost(np.array([peer]), np.array([[0.1, 0.2]]), np.array([5]),
                        releaser=releaser, sensitivity=lambda sizes: 1.0, settings=settings,
                        report=lambda message: None)  # fmt: skip

    async def go():
        sender, receiver = host(0), host(1)
        await sender.listen()
        port = (await receiver.listen())[1]
        sender.addresses, sender.ports = ["127.0.0.1"] * 2, [0, port]
        frame = encode(_full_publication(0, 3))  # refused by peer 1 (no such group): counted
        for _ in range(2):
            sender.send_frame("publish", 0, [1], frame)
            await sender.flush()
            await asyncio.sleep(1.0)  # past peer_idle: the receiver closes the connection
        await sender.close()
        await receiver.close()
        return sender, receiver

    with caplog.at_level("INFO", logger="p2pdp.net"):
        sender, receiver = asyncio.run(go())
    assert receiver.counters.refused == {"publish": 2}  # both arrived; an idle close is no refusal
    assert receiver.counters.idle_closed == 2  # each connection closed when idle
    assert sender.counters.refused["unreachable"] == 0
    assert "refused a connection" not in caplog.text


def test_a_connection_its_peer_closes_logs_nothing_and_a_refused_one_says_why(caplog):
    """Host 0 sends peer 2 (on host 1, mutual TLS) a frame and closes its connection, as a
    sender drops one it left unused: nothing is logged or refused but the frame (no such
    group). A frame that stops half-way is refused, and its log line names why (a timeout
    carries no message of its own: it used to log "refused a connection: ")."""
    _, credentials = _credentials(2)
    settings = HostSettings(n_peers=4, hosts=2, full_publication=False, timeout=0.2)

    async def go():
        receiver = PeerHost(np.array([2, 3]), np.zeros((2, 2)), np.array([5, 5]),
                            releaser=_host([]).releaser, sensitivity=lambda sizes: 1.0,
                            settings=settings, report=lambda message: None,
                            credential=credentials["host-1"])  # fmt: skip
        sender = _tls_host(credentials["host-0"], settings)
        port = (await receiver.listen())[2]
        await sender.listen()
        sender.addresses, sender.ports = ["127.0.0.1"] * 2, [0, 0, port, 0]
        sender.send_frame("publish", 0, [2], encode(_full_publication(0, 3)))
        await sender.flush()
        await sender.close()  # closes its connection to peer 2
        await asyncio.sleep(0.3)
        closed = dict(receiver.counters.refused), caplog.text
        context = credentials["host-0"].context(server=False)
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="host-1"
        )
        writer.write(encode(_full_publication(0, 4))[:10])  # a frame that stops half-way
        await asyncio.sleep(0.5)
        writer.close()
        await receiver.close()
        return closed

    with caplog.at_level("INFO", logger="p2pdp.net"):
        (refused, logged) = asyncio.run(go())
    assert refused == {"publish": 1} and "connection" not in logged
    (line,) = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert line.split("refused a connection: ")[1].strip()  # a reason, never empty
    assert "did not end within 0.2 s" in line


def test_a_listener_bounds_silent_clients_and_then_serves_an_honest_one(monkeypatch, caplog):
    """40 silent TCP clients at one peer's socket, then the coordinator: each newcomer
    beyond the cap on handshakes in progress evicts the oldest, so the coordinator's
    handshake completes and its assignment is read; the silent clients left are dropped at
    the handshake deadline. With an allowlist, a client from another address (here:
    127.0.0.1 itself, not listed) is refused before its handshake."""
    monkeypatch.setattr(tls, "HANDSHAKE_TIMEOUT", 0.5)
    _, credentials = _credentials(1)

    async def go(allowed):
        host = _tls_host(
            credentials["host-0"],
            HostSettings(n_peers=2, hosts=1, full_publication=False, allowed=allowed),
        )
        port = (await host.listen())[0]
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]
        await asyncio.sleep(0.1)
        context = credentials["coordinator"].context(server=False)
        try:
            _, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname="host-0"
            )
            writer.write(encode({**ASSIGN_0, "members": [0, 1]}))
            await writer.drain()
            await asyncio.sleep(1.0)  # past the deadline
            writer.close()
        except (ssl.SSLError, ConnectionError):
            pass
        for _, w in silent:
            w.close()
        await host.close()
        return host

    host = asyncio.run(go(()))
    pending = 3 + 8  # the default group size, and some slack
    assert host.counters.refused["busy"] == 40 + 1 - pending
    assert host.counters.refused["handshake"] == pending - 1
    assert host.last_group == {0: 0}
    with caplog.at_level("WARNING"):
        host = asyncio.run(go(("10.0.0.9",)))
    assert host.counters.refused["address"] == 41 and host.last_group == {}
    assert caplog.text.count("not in the allowlist ['10.0.0.9']") == 1  # logged once
    host = asyncio.run(go(("localhost",)))  # a name: resolved once, to 127.0.0.1
    assert host.counters.refused["address"] == 0 and host.last_group == {0: 0}


def test_a_host_shut_down_with_connections_queued_logs_no_error(caplog):
    """40 silent clients hold every handshake place and queue for more when the host's loop
    ends: their tasks are cancelled quietly (the queue's futures used to be set after their
    cancellation: an InvalidStateError traceback per queued connection)."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(tls, "HANDSHAKE_TIMEOUT", 30.0)
    _, credentials = _credentials(1)

    async def go():
        host = _tls_host(
            credentials["host-0"], HostSettings(n_peers=2, hosts=1, full_publication=False)
        )
        port = (await host.listen())[0]
        silent.extend(socket.create_connection(("127.0.0.1", port)) for _ in range(40))
        for _ in range(3):  # accepted, and queued: not yet through the queue when it ends
            await asyncio.sleep(0)
        await host.close()

    silent = []
    with caplog.at_level("DEBUG", logger="asyncio"):
        asyncio.run(go())
    monkeypatch.undo()
    for client in silent:
        client.close()
    assert "InvalidStateError" not in caplog.text and "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


#: A listener in a process with one descriptor left, taken by a client: every accept fails
#: with EMFILE (asyncio retries 100 at a time, every second) for ``argv[1]`` seconds.
OUT_OF_DESCRIPTORS = """
import asyncio, logging, os, resource, socket, sys
from collections import Counter
from p2pdp.net import tls
from p2pdp.net.failures import Failure
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
context = tls.Authority(1).credential.context(server=True)
async def main():
    server = await tls.listen(lambda r, w: None, "127.0.0.1", context, pending=4,
                              refused=Counter(), per_identity=2, total=4, first_frame=5.0,
                              failure=Failure())
    port = server.sockets[0].getsockname()[1]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    os.close(held.pop())
    client = socket.create_connection(("127.0.0.1", port))  # the last descriptor
    await asyncio.sleep(float(sys.argv[1]))
asyncio.run(main())
"""


def test_accept_errors_out_of_descriptors_are_logged_once():
    """A listener whose process has no descriptor left: accept fails with EMFILE over and
    over (asyncio logged a traceback for each: 3,400 lines in 3.5 s here, 163 MB in 3.5 min
    in the audit); now one line, naming the error, for the whole process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS, "2.5"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "p2pdp.net.tls: a listener could not accept a connection: [Errno 24] Too many open "
        "files (logged once)"
    ]
