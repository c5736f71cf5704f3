"""One host process of the one-shot protocol, from enrollment to its final report.

:func:`serve` runs host ``host_index`` of a run: it enrolls (its own key pair), opens its
peers' sockets (:class:`p2pdp.net.host.PeerHost`, and with gossip formation its
:class:`~p2pdp.net.gossip_host.HostFormation`), says ``hello`` to the coordinator, starts on
its ``directory``, carries out ``ended`` and ``halt`` (gossip), and on ``finish`` waits for
the publications its peers must receive, then reports ``stats`` and exits. The protocol
itself (what a peer accepts, what a curator releases) is :mod:`p2pdp.net.host`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from p2pdp.net.commitments import public_key
from p2pdp.net.connections import connect_control, ended_or_failed, enroll
from p2pdp.net.gossip_host import ENDED, HALT, GossipSetup, HostFormation
from p2pdp.net.host import PeerHost
from p2pdp.net.hosts import DIRECTORY, FINISH, HELLO, STATS, HostError, HostSettings, Ticket
from p2pdp.net.wire import encode, integer, read_frame
from p2pdp.privacy.release import Releaser

__all__ = ["serve"]

log = logging.getLogger(__name__)


async def serve(
    peers: np.ndarray,
    statistics: np.ndarray,
    sizes: np.ndarray,
    *,
    releaser: Releaser,
    sensitivity: Callable[[list[int]], float],
    settings: HostSettings,
    host_index: int,
    ticket: Ticket,
    coordinator: str = "127.0.0.1",
    address: str = "127.0.0.1",
    data_dependent_bounds: bool = False,
    gossip: GossipSetup | None = None,
) -> None:
    """Run host ``host_index``: its peers' sockets, until the coordinator says the run is over.

    With ``gossip`` (``groups.sampler = "gossip"``) the host also runs its peers' group
    formation (:class:`~p2pdp.net.gossip_host.HostFormation`): its ``hello`` carries the
    host's Ed25519 signing key (made here), formation starts with the ``directory`` (every
    host's key), and the coordinator's ``ended`` and ``halt`` frames go to it.

    Enrolls with ``ticket`` (:func:`~p2pdp.net.connections.enroll`: its own key pair, made
    here), connects to the coordinator at ``coordinator:ticket.port`` (``HELLO`` with the
    host's ``address``, where its peers listen, every peer's port, the length ``dim`` of its
    statistics and ``bounds``, its ``data_dependent_bounds``: whether its rows were scaled
    with bounds fitted on the pooled training fold; public facts a coordinator that holds
    no data learns only so), waits for the
    ``DIRECTORY`` of every host's address and every peer's port, serves the protocol, and on
    ``FINISH`` waits until its peers received the publications the coordinator expects, then
    reports ``STATS``: messages and bytes sent per peer (the simulator's counts), frames and
    bytes per kind on the wire, the receipts (``group`` publication: a ``full`` one reaches
    everyone), and the frames refused.
    """
    hint = (
        " (the run's listeners accept only the hosts file's allowlist, resolved: "
        f"{', '.join(settings.allowed)}; is this host's address among them?)"
        if settings.allowed
        else ""
    )
    try:
        credential = await enroll(host_index, ticket, coordinator, settings.timeout)
    except HostError as error:
        raise HostError(f"{error}{hint}") from None
    writer: asyncio.StreamWriter | None = None

    def report(message: dict[str, Any]) -> None:
        frame = encode(message)
        if message["kind"] != STATS:  # the report of the counts cannot count itself
            host.counters.wire[message["kind"]] += 1
            host.counters.wire_bytes[message["kind"]] += len(frame)
        assert writer is not None  # reports follow the hello
        writer.write(frame)

    host = PeerHost(
        peers,
        statistics,
        sizes,
        releaser=releaser,
        sensitivity=sensitivity,
        settings=settings,
        report=report,
        credential=credential,
    )
    signing: dict[str, bytes] = {}  # gossip: the public half of its commitments' signing key
    if gossip is not None:
        key = Ed25519PrivateKey.generate()
        signing["signing"] = key.public_key().public_bytes_raw()

        def send_formation(kind: str, sender: int, receiver: int, message: dict) -> None:
            frame = encode(message)
            host.send_frame(kind, sender, [receiver], frame, size=len(frame))

        host.formation = HostFormation(
            host.peers,
            gossip,
            host=host_index,
            host_of=host.host_of,
            send=send_formation,
            report=report,
            key=key,
            failure=host.failure,
        )
        host.frame_bytes = max(host.frame_bytes, gossip.frame_bytes)
    try:
        try:  # its sockets first: the coordinator closes a control connection silent too long
            ports = await host.listen(address)
        except OSError as error:
            raise HostError(f"cannot listen on {address}: {error}") from None
        reader, control = await connect_control(
            coordinator, ticket.port, credential, settings.timeout, hint
        )
        writer = control
        report(
            {
                "kind": HELLO,
                "host": host_index,
                "address": address,
                "ports": [[p, q] for p, q in ports.items()],
                "dim": int(statistics.shape[-1]),
                "bounds": bool(data_dependent_bounds),
                **signing,
            }
        )
        await ended_or_failed(
            host.failure, _serve_control(host, reader, control, report, settings, host_index),
            control, host_index, settings.timeout,
        )  # fmt: skip
    finally:
        if host.formation is not None:
            await host.formation.close()
        await host.close()
        if writer is not None:
            writer.close()


async def _serve_control(
    host: PeerHost,
    reader: asyncio.StreamReader,
    control: asyncio.StreamWriter,
    report: Callable[[dict[str, Any]], None],
    settings: HostSettings,
    host_index: int,
) -> None:
    """The coordinator's frames to host ``host_index``, until its ``finish`` (answered with
    the host's final report) or the end of its connection."""
    while True:
        message = await read_frame(reader, timeout=settings.timeout, idle=settings.idle_timeout)
        if message is None:  # the coordinator is gone: nothing more to do
            return
        if message["kind"] == DIRECTORY:
            host.ports = [integer(port, "port", 0, 65536) for port in message["ports"]]
            host.addresses = [str(a) for a in message["addresses"]]
            if host.formation is not None:
                host.formation.start([public_key(k) for k in message["signing"]])
        elif message["kind"] in (ENDED, HALT) and host.formation is not None:
            if message["kind"] == ENDED:
                host.formation.group_ended(message)
            else:
                host.formation.halt()
        elif message["kind"] == FINISH:
            host.released_pairs = {
                (integer(g, "group"), integer(c, "curator")) for g, c in message["released"]
            }
            if settings.full_publication:
                host.count_released(host.released_pairs)
            await host.flush()
            await _received(
                host, integer(message["publications"], "publications"), settings.timeout
            )
            await host.flush()
            report(host.stats(host_index))
            await asyncio.wait_for(control.drain(), settings.timeout)
            return


async def _received(host: PeerHost, publications: int, timeout: float) -> None:
    """Until the host's peers received ``publications`` publications (or ``timeout`` s): of
    released groups from their curators under full publication
    (:meth:`p2pdp.net.host.PeerHost.count_released`), else of their own groups (checked
    against their assignments on arrival)."""

    def received() -> int:
        if host.released is not None:
            return host.released_received
        return host.counters.publications_received

    deadline = asyncio.get_running_loop().time() + timeout
    while received() < publications:
        if asyncio.get_running_loop().time() > deadline:
            log.warning("host: %d of %d publications arrived", received(), publications)
            return
        await asyncio.sleep(0.005)
