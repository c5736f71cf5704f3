"""The coordinator's side of its connections with the hosts: enrollment and control frames.

Each host enrolls once (:meth:`HostControl._enroll`: a certificate for its own key, against
its one-time token) and then keeps one mutual-TLS control connection to the coordinator
(:meth:`HostControl._control`). What the coordinator accepts on it
(:meth:`HostControl._on_control`): a frame only from the host its certificate names, for
that host; one ``hello`` (its own peers' ports, each once), one final ``stats`` (counts for
its own peers only, at most :data:`REPORT_KEYS` kinds and reasons), a ``done`` only from the
host of the group's curator (a release of an aborted group is charged late, any other
refused), ``formed`` and ``status`` with gossip formation, ``failed`` (the host's own code
failed: the run ends with its error, :mod:`p2pdp.net.failures`). Every field is checked before
anything counts. A host whose connection closes before its final report is lost
(:meth:`HostControl._host_lost`: its group in flight aborted, its peers out of the pool).

:class:`HostControl` is a base of :class:`p2pdp.net.coordinator.NetworkWorld`, on the state
that class builds (declared below).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.net.bookkeeping import WireStats
from p2pdp.net.commitments import public_key
from p2pdp.net.failures import Failure
from p2pdp.net.gossip_host import FORMED, STATUS
from p2pdp.net.hosts import (
    CERTIFICATE,
    DONE,
    ENROLL,
    ENROLL_BYTES,
    FAILED,
    FAILED_CHARS,
    HELLO,
    STATS,
    HostError,
    HostSettings,
)
from p2pdp.net.tls import Authority, host_name, identity
from p2pdp.net.wire import ProtocolError, encode, read_frame, unpack_vector
from p2pdp.privacy.release import ReleaseRecord
from p2pdp.protocols.groups import Group
from p2pdp.protocols.oneshot import Sampler

__all__ = ["REPORT_KEYS", "HostControl", "count_field"]

log = logging.getLogger(__name__)

#: Most distinct keys a host's final report may count under (``wire`` kinds, ``refused``
#: reasons: a host counts the protocol's kinds, reasons of its own and "unknown").
REPORT_KEYS = 64
#: Control frames a host sends (a refused one is counted under its kind).
CONTROL_KINDS = (HELLO, DONE, STATS, FORMED, STATUS, FAILED)


def count_field(value: Any, name: str, high: int = 2**63) -> int:
    """``value`` if it is an int in ``[0, high)``; else ValueError naming ``name``."""
    if type(value) is not int or not 0 <= value < high:
        raise ValueError(f"{name} must be an integer in [0, {high}), got {value!r:.40}")
    return value


class HostControl:
    """Enrollment and the hosts' control frames (a base of ``NetworkWorld``)."""

    config: ScenarioConfig
    settings: HostSettings
    authority: Authority
    n_peers: int
    n_hosts: int
    dim: int | None
    host_of: np.ndarray
    sampler: Sampler
    wire: WireStats
    ports: list[int]
    addresses: list[str]
    data_dependent_bounds: bool
    lost_hosts: set[int]
    _enrollment: asyncio.Server | None
    _hosts: dict[int, asyncio.StreamWriter]
    _hello: asyncio.Event
    _dims: dict[int, int]
    _signing: dict[int, bytes]
    _stats: dict[int, dict[str, Any]]
    _all_stats: asyncio.Event
    _done: dict[int, asyncio.Future]
    _in_flight: dict[int, Group]
    _aborted: dict[int, Group]
    _held: np.ndarray
    _status: dict[int, tuple[int, int, int]]
    _wake: asyncio.Event
    _failure: Failure

    @property
    def control_bytes(self) -> int:
        """The largest control frame a host may send (``NetworkWorld``'s)."""
        raise NotImplementedError

    _released: Callable[..., None]  # _released(group, report, *, full): charge and keep
    _on_formed: Callable[[dict[str, Any], str | None], None]  # a formed group (gossip)

    async def _enroll(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One enrollment: a single frame of at most ENROLL_BYTES, answered by the host's
        certificate if the authority accepts it; anything else is refused, counted
        ``enroll``, and closes the connection unanswered. The listener closes once every
        host enrolled."""
        try:
            message = await read_frame(reader, timeout=self.settings.timeout,
                                       max_bytes=ENROLL_BYTES)  # fmt: skip
            if message is None or message["kind"] != ENROLL:
                raise ProtocolError(f"not an enrollment: {message!r:.40}")
            certificate = self.authority.enroll(
                message.get("host"), message.get("token"), message.get("request")
            )
        except (ProtocolError, TimeoutError, ConnectionError) as error:
            self.wire.refused[ENROLL] += 1
            log.warning("coordinator: refused an enrollment: %s", error)
            writer.close()
            return
        writer.write(encode({"kind": CERTIFICATE, "certificate": certificate}))
        try:
            await asyncio.wait_for(writer.drain(), self.settings.timeout)
        except (TimeoutError, ConnectionError):
            pass  # the host cannot enroll again: it fails to start, and the run says so
        writer.close()
        if self.authority.enrolled and self._enrollment is not None:
            self._enrollment.close()  # nobody else may enroll: no listener left for it

    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read one host's control frames until its connection closes. A frame that breaks
        the protocol (a host speaking for another, a malformed report) is refused and
        counted, and the connection goes on; one that breaks the wire format ends it."""
        settings = self.settings
        host: int | None = None
        kind: Any = None
        who = identity(writer)
        try:
            while True:
                message = await read_frame(
                    reader,
                    timeout=settings.timeout,
                    idle=settings.idle_timeout,
                    max_bytes=self.control_bytes,
                )
                if message is None:
                    if host is not None and host not in self._stats:
                        self._host_lost(host, "its connection closed")
                    return
                kind = message["kind"]
                try:
                    host = self._on_control(message, who, writer, host)
                except (ProtocolError, KeyError, TypeError, ValueError, OverflowError) as error:
                    self.wire.refused[kind if kind in CONTROL_KINDS else "unknown"] += 1
                    log.warning("coordinator: refused a %r frame: %s", kind[:32], error)
        except (ProtocolError, TimeoutError, ConnectionError) as error:
            self.wire.refused[type(error).__name__] += 1
            log.warning("coordinator: refused a control connection: %s", error)
            writer.transport.abort()  # closed here too, with its descriptor, at once
        except asyncio.CancelledError:  # the run is over
            pass
        except Exception as fault:  # not a refusal: a fault of the coordinator's own code
            self._failure.report(f"the coordinator, on a {kind!r:.32} frame from {who!r}", fault)
        finally:
            writer.close()

    def _on_control(
        self,
        message: dict[str, Any],
        who: str | None,
        writer: asyncio.StreamWriter,
        host: int | None,
    ) -> int | None:
        """One control frame from the host authenticated as ``who``; the connection's host.
        Every field is checked (type and range) before anything counts: a bad frame raises
        and changes nothing."""
        kind = message["kind"]
        if kind in (HELLO, STATS, STATUS, FAILED):
            claimed = count_field(message["host"], "host", self.n_hosts)
            if who != host_name(claimed) or (host is not None and host != claimed):
                raise ProtocolError(f"{who!r} claims to be host {claimed}")
        if kind == HELLO:
            address, ports = message["address"], self._hello_ports(message["ports"], claimed)
            if claimed in self._hosts:
                raise ProtocolError(f"a second hello from host {claimed}")
            if not isinstance(address, str) or not 0 < len(address) <= 255:
                raise ValueError(f"hello address must be a host name, got {address!r:.40}")
            dim, bounds = count_field(message["dim"], "hello dim", 2**31), message["bounds"]
            if dim < 1 or not isinstance(bounds, bool):
                raise ValueError(f"hello dim {dim} must be >= 1 and bounds a bool")
            if self.config.groups.sampler == "gossip":  # its commitments' signing key
                public_key(message["signing"])  # ProtocolError unless one
                self._signing[claimed] = message["signing"]
            self._dims[claimed] = dim
            self.data_dependent_bounds |= bounds
            self._hosts[claimed] = writer
            self.addresses[claimed] = address
            if not self.ports:
                self.ports = [0] * self.n_peers
            for peer, peer_port in ports.items():
                self.ports[peer] = peer_port
            if len(self._hosts) == self.n_hosts:
                self._hello.set()
            return claimed
        if kind == DONE:
            report = self._release_report(message, who)
            future = self._done.get(report["group"])
            if future is not None and not future.done():
                group = self._in_flight[report["group"]]
                if report["curator"] != group.curator:
                    raise ProtocolError(
                        f"a release of group {group.group_id} by {report['curator']}, not its "
                        f"curator {group.curator}"
                    )
                future.set_result(report)
            else:
                self._late_release(report)
        elif kind == FORMED:
            self._on_formed(message, who)
        elif kind == STATUS:
            trying, attempts, ended = (
                count_field(message[k], f"status {k}") for k in ("trying", "attempts", "ended")
            )
            self._status[claimed] = (trying, attempts, ended)
            self._wake.set()
        elif kind == FAILED:  # the host's own code failed: the run ends, naming where
            error = message["error"]
            if not isinstance(error, str) or len(error) > FAILED_CHARS:
                raise ValueError(f"failed error must be at most {FAILED_CHARS} characters")
            self._failure.report(f"host {claimed}", HostError(error))
        elif kind == STATS:
            if claimed in self._stats:
                raise ProtocolError(f"a second final report from host {claimed}")
            self._stats[claimed] = self._stats_report(message, claimed)
            self._check_all_stats()
        else:
            raise ProtocolError(f"unknown control kind {kind!r:.40}")
        return host

    def _hello_ports(self, value: Any, host: int) -> dict[int, int]:
        """A hello's ``[[peer, port], ...]``: exactly the host's own peers, each once."""
        own = np.flatnonzero(self.host_of == host).tolist()
        ports = {
            count_field(peer, "hello peer", self.n_peers): count_field(port, "hello port", 65536)
            for peer, port in value
        }
        if sorted(ports) != own or len(value) != len(own):
            raise ProtocolError(f"host {host} says where peers {sorted(ports)[:8]} listen")
        return ports

    def _stats_report(self, message: dict[str, Any], host: int) -> dict[str, Any]:
        """A host's final report, checked: counts for its own peers, ints >= 0, at most
        REPORT_KEYS kinds and reasons (short strings), receipts (peer, group) of its own
        peers as 16-byte pairs."""
        own = set(np.flatnonzero(self.host_of == host).tolist())
        sent = []
        for peer, messages, n_bytes in message["sent"]:
            if count_field(peer, "stats peer") not in own:
                raise ProtocolError(f"host {host} reports what peer {peer} sent")
            sent.append(
                (peer, count_field(messages, "stats messages"), count_field(n_bytes, "bytes"))
            )
        tables = {}
        for name, width in (("wire", 2), ("refused", 1)):
            table = message[name]
            if not isinstance(table, dict) or len(table) > REPORT_KEYS:
                raise ValueError(f"stats {name} must be a map of at most {REPORT_KEYS} keys")
            for key, value in table.items():
                if not isinstance(key, str) or len(key) > 64:
                    raise ValueError(f"stats {name} key {key!r:.40}")
                values = value if width == 2 else [value]
                if len(values) != width:
                    raise ValueError(f"stats {name}[{key}] = {value!r:.40}")
                for item in values:
                    count_field(item, f"stats {name}[{key}]")
            tables[name] = table
        receipts = message["receipts"]
        if not isinstance(receipts, bytes) or len(receipts) % 16:
            raise ValueError("stats receipts must be (peer, group) pairs of int64")
        pairs = np.frombuffer(receipts, dtype="<i8").reshape(-1, 2)
        if not np.isin(pairs[:, 0], list(own)).all():
            raise ProtocolError(f"host {host} reports receipts of another host's peers")
        return {**tables, "sent": sent, "receipts": pairs}

    def _release_report(self, message: dict[str, Any], who: str | None) -> dict[str, Any]:
        """A curator's ``DONE``, checked: from the curator's own host, with a well-formed
        record and model (parsed here, so a bad report is refused before anything counts)."""
        if self.dim is None:
            raise ProtocolError("a release before every host said its statistics' length")
        group = count_field(message["group"], "done group")
        curator = count_field(message["curator"], "done curator", self.n_peers)
        if who != host_name(int(self.host_of[curator])):
            raise ProtocolError(f"{who!r} reports for curator {curator}")
        return {
            "group": group,
            "curator": curator,
            "record": ReleaseRecord.from_row(message["record"]),
            "model": unpack_vector(message["model"], shape=(self.dim,)),
        }

    def _host_lost(self, host: int, why: str) -> None:
        """Host ``host`` is gone: abort the group in flight with one of its peers, take its
        peers out of the pool for good."""
        if host in self.lost_hosts:
            return
        log.warning("network runtime: host %d lost (%s); its peers leave the run", host, why)
        self.lost_hosts.add(host)
        peers = np.flatnonzero(self.host_of == host)
        self.sampler.remove(set(peers.tolist()))
        for group_id, group in self._in_flight.items():
            future = self._done[group_id]
            if not future.done() and np.isin(group.members, peers).any():
                self._hold(group)  # at once: its curator's report may be next in line
                future.set_result(None)  # aborted: a member's host is gone
        self._wake.set()  # the gossip observer counts without it
        self._check_all_stats()

    def _hold(self, group: Group) -> None:
        """``group`` is aborted, but its curator may still release it (unless its host is
        gone): hold one charge back for its members until its report comes (for good if it
        never does: their budget may have been spent)."""
        if self.host_of[group.curator] not in self.lost_hosts:
            self._aborted[group.group_id] = group
            self._held[group.members] += 1

    def _check_all_stats(self) -> None:
        if len(self._stats) + len(self.lost_hosts - set(self._stats)) >= self.n_hosts:
            self._all_stats.set()

    def _late_release(self, report: dict[str, Any]) -> None:
        """A release reported after its group was aborted: it happened, so charge it, to the
        members the coordinator itself assigned (their budget for it was held back since
        the abort, see :meth:`p2pdp.net.coordinator.NetworkWorld._groups`). A report of any
        other group (never formed, still to come, reported twice, or from another curator)
        is refused: a host cannot make up releases or charges."""
        group = self._aborted.get(report["group"])
        if group is None or group.curator != report["curator"]:
            raise ProtocolError(f"a release of group {report['group']}, which was not aborted")
        del self._aborted[group.group_id]
        self._held[group.members] -= 1
        log.error(
            "network runtime: group %s released after its abort; its members are charged",
            group.group_id,
        )
        self._released(group, report, full=self.config.publication.mode == "full")
        self.wire.refused["late release"] += 1
