"""Keys stay where they are made; enrolment and mutual TLS (p2pdp.net.tls): strangers,
impostors, replays and hosts outside the allowlist are refused, the honest keep going.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import pickle
import re
import shlex
import ssl
import struct
import sys
from collections import Counter

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from p2pdp.core.errors import ConfigError
from p2pdp.experiments.run.simulation import simulate
from p2pdp.net import connections, host_process, hosts, tls
from p2pdp.net.failures import Failure
from p2pdp.net.hosts import HostError, HostSettings, Ticket
from p2pdp.net.tls import (
    Authority,
    enrollment_client,
    new_key,
    signing_request,
)
from p2pdp.net.wire import (
    ProtocolError,
    encode,
)
from p2pdp.sim.world import WorldObserver
from tests.net.helpers import (
    _config,
    _coordinator,
    _credentials,
    _host,
    _same_rows,
    _seeded,
    _submit,
    _tls_host,
)

#: A PEM private key (its header and the start of its body).
PEM_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----\r?\n[A-Za-z0-9+/]")


def _private_keys_and_pem(root):
    """Every private key object and every bytes/str holding a PEM private key reachable from
    ``root`` (through attributes, containers and closures)."""
    keys, pem, seen, todo = [], [], set(), [root]
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, type) or inspect.ismodule(item):
            continue
        seen.add(id(item))
        if isinstance(item, ec.EllipticCurvePrivateKey):
            keys.append(item)
        elif isinstance(item, (bytes, str)):
            if PEM_KEY.search(item.encode() if isinstance(item, str) else item):
                pem.append(item)
        elif inspect.isfunction(item):  # its closure and defaults, not its module's globals
            todo.extend(cell.cell_contents for cell in item.__closure__ or ())
            todo.extend([item.__defaults__, item.__kwdefaults__])
        else:
            todo.extend(gc.get_referents(item))
    return keys, pem


def _public(holder):
    """The DER public key of a private key or a certificate."""
    return holder.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _certified(pem):
    return _public(x509.load_pem_x509_certificate(pem))


def test_no_private_key_is_in_a_launch_bundle_or_held_by_the_coordinator(tmp_path, monkeypatch):
    """Both hosts started by a hosts file's commands, the bytes written to their standard
    input kept (tee): each launch bundle parses to the run, a ticket (one-time token, the
    CA's certificate) and addresses, and holds no private key (no PEM key, nothing that
    unpickles to one). Meanwhile everything the coordinator holds (the world, its authority,
    its launcher's closure) holds exactly two private keys, the CA's and its own, none for a
    host key certified in the run, and no PEM key. The rows are the simulator's (seeded)."""
    bundles = [tmp_path / f"bundle-{host}" for host in range(2)]
    host = f"{shlex.quote(sys.executable)} -m p2pdp.experiments.network"
    commands = [["sh", "-c", f"tee {shlex.quote(str(bundle))} | {host}"] for bundle in bundles]
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        'coordinator = "127.0.0.1"\nbind = "127.0.0.1"\n'
        + "".join(f'[[host]]\naddress = "127.0.0.1"\ncommand = {json.dumps(c)}\n' for c in commands)
    )
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", str(hosts))
    worlds = []

    class Holdings(WorldObserver):
        def released(self, world, group, record):
            if not worlds:  # mid-run: every host enrolled, the run under way
                worlds.append((world, _private_keys_and_pem(world)))

    config = _config("group")
    network = simulate(_seeded(config), runtime="network", observers=(Holdings(),))
    _same_rows(simulate(config), network)
    world, (keys, pem) = worlds[0]
    authority = world.authority
    issued = {host: _certified(certificate) for host, certificate in authority.issued.items()}
    assert sorted(issued) == [0, 1] and authority.enrolled
    assert pem == []
    assert sorted(map(_public, keys)) == sorted(
        [_certified(authority.certificate), _certified(authority.credential.certificate)]
    )
    assert not set(map(_public, keys)) & set(issued.values())
    for host, path in enumerate(bundles):
        raw = path.read_bytes()
        assert b"PRIVATE KEY" not in raw
        bundle = pickle.loads(raw)
        assert bundle["host"] == host and isinstance(bundle["ticket"], Ticket)
        assert bundle["ticket"].authority == authority.certificate
        assert _private_keys_and_pem(bundle) == ([], [])
        # the token was this host's, and it is spent: nobody can enroll with it again
        with pytest.raises(ProtocolError, match="wrong or spent token"):
            authority.enroll(host, bundle["ticket"].token, b"")


def test_an_enrollment_is_refused_without_its_token_for_another_identity_or_twice():
    """Over the coordinator's enrollment listener: a wrong token, a request for host-1 with
    host 0's token (which spends it), host 0's honest enrollment after that, a frame that is
    not an enrollment and one longer than ENROLL_BYTES are all refused (no certificate) and
    counted; host 1 enrolls once (a certificate for the key it made, as host-1), not twice;
    once no token is left the listener is closed."""
    world = _coordinator(launch=lambda host, ticket: None)
    authority = world.authority

    async def raw(port, message):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=enrollment_client(authority.certificate),
            server_hostname="coordinator",
        )  # fmt: skip
        writer.write(message if isinstance(message, bytes) else encode(message))
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return answer

    async def go():
        server = world._enrollment = await tls.listen(
            world._enroll, "127.0.0.1", world._enrollment_tls, pending=4,
            refused=world.wire.refused, per_identity=4, total=4, first_frame=5.0,
            failure=world._failure,
        )  # fmt: skip
        port = server.sockets[0].getsockname()[1]

        def ticket(host, token=None):
            return Ticket(port=0, enrollment_port=port, token=token or authority.token(host),
                          authority=authority.certificate)  # fmt: skip

        refused = []
        wrong = ticket(0, token="x" * 43)
        with pytest.raises(HostError, match="refused this host's enrollment"):
            await connections.enroll(0, wrong, "127.0.0.1", 5.0)
        request = signing_request("host-1", new_key())
        assert await raw(port, {"kind": "enroll", "host": 0, "token": authority.token(0),
                                "request": request}) == b""  # fmt: skip
        with pytest.raises(HostError, match="refused"):  # host 0's token is spent
            await connections.enroll(0, wrong, "127.0.0.1", 5.0)
        assert await raw(port, {"kind": "hello", "host": 1}) == b""
        assert await raw(port, struct.pack(">I", hosts.ENROLL_BYTES + 1)) == b""
        refused.append(world.wire.refused["enroll"])
        credential = await connections.enroll(1, ticket(1), "127.0.0.1", 5.0)
        assert _certified(credential.certificate) == _public(credential.key)
        subject = x509.load_pem_x509_certificate(credential.certificate).subject
        assert subject.rfc4514_string() == "CN=host-1"
        with pytest.raises(HostError):  # no token left: the listener is closed
            await connections.enroll(1, wrong, "127.0.0.1", 5.0)
        return refused

    assert asyncio.run(go()) == [5]
    assert sorted(authority.issued) == [1] and authority.enrolled


def test_mutual_tls_refuses_strangers_impostors_and_replays():
    _, credentials = _credentials(2)
    _, stranger = _credentials(2)  # another run's CA and certificates
    assign = {"kind": "assign", "sender": -1, "group": 0, "members": [0, 1], "curator": 0,
              "release": 0, "timeout": 60.0}  # fmt: skip

    async def connect(port, party, *, run=credentials, expect="host-0"):
        context = run[party].context(server=False)
        return await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=expect)

    async def go():
        host = _tls_host(
            credentials["host-0"], HostSettings(n_peers=4, hosts=2, full_publication=False)
        )
        port = (await host.listen())[0]
        # no certificate at all: the handshake never completes, no frame is read
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(encode(assign))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        # a certificate of another run; and a server that is not the host the client meant
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await connect(port, "host-1", run=stranger)
        with pytest.raises(ssl.SSLCertVerificationError):
            await connect(port, "host-1", expect="host-1")
        # host 1 (of this run) speaks for the coordinator, then for host 0's peer 1
        _, writer = await connect(port, "host-1")
        writer.write(encode(assign))
        writer.write(encode(_submit(sender=1, members=[0, 1])))
        await writer.drain()
        # the coordinator assigns group 0, then the same frame again (a replay)
        _, coordinator = await connect(port, "coordinator")
        coordinator.write(encode(assign) + encode(assign))
        await coordinator.drain()
        await asyncio.sleep(0.3)
        for w in (writer, coordinator):
            w.close()
        await host.close()
        return host

    host = asyncio.run(go())
    assert host.counters.refused["assign"] == 2  # the impostor's and the replay
    assert host.counters.refused["submit"] == 1  # host 1 cannot speak for peer 1
    assert host.last_group == {0: 0}  # the coordinator's assignment was accepted


def test_an_allowlist_name_that_does_not_resolve_is_named():
    with pytest.raises(ConfigError, match="allowlist's address 'no-such-host.invalid'"):
        tls.resolve(["127.0.0.1", "no-such-host.invalid"])


def test_a_host_outside_the_allowlist_is_told_so(monkeypatch):
    """The coordinator refuses this host's address (its allowlist names another): the host's
    one-line error names the allowlist (it said only "Connection reset by peer")."""
    authority = Authority(1)

    async def go():
        refused = Counter()
        server = await tls.listen(
            lambda reader, writer: None, "127.0.0.1", authority.credential.context(server=True,
            clients=False), pending=4, refused=refused, allowed={"10.0.0.9"}, per_identity=4,
            total=4, first_frame=5.0, failure=Failure(),
        )  # fmt: skip
        ticket = Ticket(port=1, enrollment_port=server.sockets[0].getsockname()[1],
                        token=authority.token(0), authority=authority.certificate)  # fmt: skip
        settings = HostSettings(n_peers=2, hosts=1, full_publication=False, allowed=("10.0.0.9",))
        with pytest.raises(HostError, match=r"allowlist, resolved: 10\.0\.0\.9; is this host"):
            await host_process.serve(
                np.array([0, 1]), np.zeros((2, 2)), np.array([5, 7]), releaser=_host([]).releaser,
                sensitivity=lambda sizes: 1.0, settings=settings, host_index=0, ticket=ticket,
            )  # fmt: skip
        server.close()
        return refused

    assert asyncio.run(go())["address"] == 1
