"""A run's host processes as the coordinator and every host see them.

Which host process runs which peer (:func:`hosts_of`), what every host knows of the run
(:class:`HostSettings`), what a host needs to join it (:class:`Ticket`: no private key), the
error of a host that cannot take part (:class:`HostError`), and the kinds of the frames
between a host and the coordinator (``hello``, ``directory``, ``done``, ``finish``,
``stats``, ``failed``; enrollment) and of a host's counts (``pre-empted``, ``expired``).
Shared by the one-shot host (:mod:`p2pdp.net.host`, :mod:`p2pdp.net.host_process`), the
iterative one (:mod:`p2pdp.net.iterative_host`), both coordinators and the launch
(:mod:`p2pdp.experiments.network`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from p2pdp.net.gossip_host import PEER_KINDS
from p2pdp.protocols.groups import ASSIGN, PARTIAL, PUBLISH, SHARE, SUBMIT

__all__ = [
    "CERTIFICATE",
    "DIRECTORY",
    "DONE",
    "ENROLL",
    "ENROLL_BYTES",
    "EXPIRED",
    "EXPLAINED",
    "FAILED",
    "FAILED_CHARS",
    "FINISH",
    "HELLO",
    "KINDS",
    "PRE_EMPTED",
    "STATS",
    "HostError",
    "HostSettings",
    "Ticket",
    "hosts_of",
]

# Control kinds between a host and the coordinator (peer-protocol kinds: p2pdp.protocols.groups)
HELLO, DIRECTORY, DONE, FINISH, STATS = "hello", "directory", "done", "finish", "stats"
#: A host's last control frame when its own code failed (``error``: where and what, at most
#: FAILED_CHARS characters): the coordinator ends the run with it (:mod:`p2pdp.net.failures`).
FAILED, FAILED_CHARS = "failed", 1000
#: A host's enrollment (token and signing request) and the coordinator's answer (certificate).
ENROLL, CERTIFICATE = "enroll", "certificate"
#: Largest enrollment frame, either way (bytes): a P-256 request or certificate in PEM is
#: under 1 KiB, a token 43 characters.
ENROLL_BYTES = 4096
#: Exit status of a host process that printed its own one-line error (``p2pdp host N: ...``):
#: the coordinator's error then says only that it is above, with no unrelated advice.
EXPLAINED = 3
#: A host's count of publications of released groups its peers refused (a forged copy with
#: the group's id came first): honest messages not delivered
#: (:meth:`p2pdp.net.host.PeerHost.pre_empted`).
PRE_EMPTED = "pre-empted"
#: Every kind a peer's socket reads (a refusal is counted under its kind, or "unknown").
KINDS = (ASSIGN, SUBMIT, SHARE, PARTIAL, PUBLISH, *PEER_KINDS)
#: A host's count of contributions that reached their curator past its group's timer (or
#: once the group ended otherwise): honest messages lost, not refused (:class:`~p2pdp.
#: protocols.oneshot.Late`), and of groups that completed only after it.
EXPIRED = "expired"


@dataclass(frozen=True)
class HostSettings:
    """What a host needs to know about the run (the same for every host).

    Attributes
    ----------
    n_peers : int
        P; peers are numbered 0 .. P-1.
    hosts : int
        Host processes; peers are split over them in id order (:func:`hosts_of`).
    full_publication : bool
        ``publication.mode == "full"``: a curator sends the release to every other peer.
    min_shard_size : int
        The public lower bound on shard sizes (``privacy.min_shard_size``, else 1): a curator
        refuses a submission that claims fewer records.
    collect_timeout : float
        Seconds the coordinator gives a group. Its assignment repeats them; the curator
        starts its own timer on receiving it (its own clock: hosts need not share one) and
        never releases once it ran out; the coordinator aborts the group a little later (see
        :mod:`p2pdp.net.coordinator`).
    timeout : float
        Seconds any wait for a frame's body, a connection or a report may take.
    idle_timeout : float
        Seconds a control connection (a host's, to the coordinator) may stay silent between
        frames (the run's longest pause). A peer's socket keeps a silent connection only
        :attr:`peer_idle` seconds.
    seeded_noise : bool
        Draw noise from the run's seeded streams (``network.seeded_noise``: parity tests,
        NOT private); else from the operating system's CSPRNG (see the module docstring).
    group_size : int
        ``groups.group_size``: bounds what a host keeps for groups it is not assigned yet
        (:meth:`p2pdp.net.host.PeerHost._keep_early`) and the handshakes a listener holds at once.
    max_concurrent : int
        ``groups.max_concurrent_groups``: the groups in flight at once, each of which may
        send a host's peers messages before their assignment
        (:meth:`p2pdp.net.host.PeerHost._keep_early`).
    allowed : tuple of str
        If not empty, the only addresses every listener of the run accepts connections from
        (a hosts file's ``allowlist``: :func:`p2pdp.net.tls.listen`).
    releases_per_peer : int
        The most releases one peer can curate in the run (the aggregations its budget
        affords: a curator is a member): under full publication, a host keeps at most that
        many groups' publications per sender.
    """

    n_peers: int
    hosts: int
    full_publication: bool
    min_shard_size: int = 1
    collect_timeout: float = 10.0
    timeout: float = 10.0
    idle_timeout: float = 600.0
    seeded_noise: bool = False
    group_size: int = 3
    max_concurrent: int = 1
    allowed: tuple[str, ...] = ()
    releases_per_peer: int = 2**31 - 1

    @property
    def peer_idle(self) -> float:
        """Seconds a peer's socket keeps a connection that sends nothing: a group's time and
        two timeouts of slack. A sender drops a connection it has not used for half that and
        connects afresh (:func:`p2pdp.net.connections.fresh`), so it never writes to one
        about to be closed."""
        return self.collect_timeout + 2 * self.timeout


def hosts_of(n_peers: int, hosts: int) -> np.ndarray:
    """The host process of every peer, (P,) int: peers split evenly, in id order."""
    owner = np.empty(n_peers, dtype=np.int64)
    for host, peers in enumerate(np.array_split(np.arange(n_peers), hosts)):
        owner[peers] = host
    return owner


@dataclass(frozen=True)
class Ticket:
    """What a host needs to join a run (its launch bundle's part from the coordinator): no
    private key, only what lets it get a certificate for a key of its own
    (:func:`p2pdp.net.connections.enroll`).

    Attributes
    ----------
    port, enrollment_port : int
        Where the coordinator listens for control connections (mutual TLS) and enrollments
        (TLS authenticating the coordinator only).
    token : str
        The host's one-time enrollment token (:class:`p2pdp.net.tls.Authority`).
    authority : bytes
        The run's CA certificate (PEM): pins the coordinator, and every peer of the run.
    """

    port: int
    enrollment_port: int
    token: str
    authority: bytes


class HostError(Exception):
    """A host process cannot take part: the coordinator is unreachable, or its peers cannot
    listen on its address (a hosts file's ``coordinator`` or ``address``, say), or its own
    code failed (:mod:`p2pdp.net.failures`)."""
