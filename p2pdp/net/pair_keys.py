"""D-PSGD's pair secrets on the network: X25519 key agreement, HKDF, a ChaCha20 stream.

Correlated noise (:class:`~p2pdp.protocols.iterative.DecentralizedSGD` with
``protocol.pairwise_noise_multiplier > 0``) needs, for every overlay edge ``(a, b)``, ``a < b``,
a stream both ends draw the same numbers from and nobody else can: ``a`` adds the round's
draw ``+p`` to its step, ``b`` adds ``-p``, so the pair's terms cancel in the sum of the
models. In simulation the stream is seeded from the run's ``pairs`` stream; here each pair
agrees it over the wire.

**Keys.** Every peer has an X25519 key pair generated in its host's process from the
operating system's CSPRNG (``cryptography``'s :class:`X25519PrivateKey.generate`); the
private key never leaves that process. A host sends each other host that runs a neighbour of
one of its peers a :data:`KEYS` frame over the hosts' mutual TLS: ``[peer, public key (32
bytes), step denominator]`` for each of its peers with a neighbour there (the denominator is
public under the step's relation; both ends need it for the pair's scale ``m_e = min(m_a,
m_b)``). A receiving host accepts a peer's entry only from the host that runs the peer (its
TLS certificate's name), only for a peer that is an overlay neighbour of one of its own
peers, and only once (:meth:`PairKeys.accept`); anything else is refused.

**Secret.** ``k_ab = HKDF-SHA256(X25519(sk_a, pk_b), salt = none, info = LABEL | session |
a | b)``, 32 bytes, with ``session`` the SHA-256 of the run's CA certificate (each cell is a
session with its own CA: a pair's secret is never reused across runs) and ``a < b`` as
8-byte big-endian integers (two pairs never share a secret, even with one key pair per
peer). Both ends compute the same ``k_ab`` (X25519 is symmetric); two peers on the same host
derive it the same way, without a frame.

**Noise.** Round ``r``'s draw is ``ChaCha20(k_ab, nonce = r)``'s keystream (the 16-byte
nonce of ``cryptography``: a 4-byte zero block counter, then ``r`` as 8 bytes little-endian
and 4 zero bytes), read as ``2 ceil(d / 2)`` little-endian 64-bit words, whose top 53 bits
give uniforms ``u = ((w >> 11) + 1) / 2^53`` in ``(0, 1]``, paired by Box-Muller into
standard normals ``sqrt(-2 ln u1) (cos, sin)(2 pi u2)`` (the first ``d``). Every bit comes
from the cipher (no non-cryptographic generator is seeded from the secret); the transform is
exact up to the 53-bit grid, which truncates the normal at ``sqrt(2 * 53 ln 2) ~ 8.57``
standard deviations (probability ``< 1e-17`` per coordinate: below any ``delta`` a run
uses, and it only changes the pair term, which cancels). The round is the nonce, so each
round's draw is fresh and any round can be drawn directly (an end that skipped rounds needs
no catching up).

Seeded mode (``network.seeded_noise = true``, NOT private) still exchanges the
:data:`KEYS` frames (for the denominators) but draws each pair's terms from the simulator's
per-edge stream, so the models are the simulator's.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from p2pdp.net.wire import ProtocolError, integer
from p2pdp.protocols.correlated_dp import edge_pairs
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.peer_streams import PairStream, PairTerm, StreamSeeds, pair_ends

__all__ = [
    "KEYS",
    "LABEL",
    "KeyedPairStream",
    "PairKeys",
    "keystream",
    "pair_gaussians",
    "pair_secret",
    "session_id",
]

#: A host's frame of its peers' public keys, to a host running some of their neighbours.
KEYS = "keys"
#: HKDF's label: what the derived key is for (bound into ``info``).
LABEL = b"p2pdp/d-psgd/pair-noise/v1"
_PUBLIC_BYTES = 32


def session_id(authority: bytes) -> bytes:
    """The run's session id: SHA-256 of its CA certificate (PEM bytes)."""
    return hashlib.sha256(authority).digest()


def pair_secret(
    private: X25519PrivateKey, public: bytes, *, session: bytes, a: int, b: int
) -> bytes:
    """The 32-byte secret of the pair ``{a, b}`` (see the module docstring), from one end's
    private key and the other end's public key; ProtocolError for a public key X25519
    refuses (a low-order point gives no shared secret)."""
    low, high = sorted((int(a), int(b)))
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError as error:
        raise ProtocolError(f"public key of the pair ({low}, {high}) refused: {error}") from None
    info = LABEL + b"|" + session + struct.pack(">QQ", low, high)
    return HKDF(algorithm=SHA256(), length=32, salt=None, info=info).derive(shared)


def keystream(secret: bytes, round_: int, n_bytes: int) -> bytes:
    """The first ``n_bytes`` of round ``round_``'s ChaCha20 keystream under ``secret``."""
    nonce = struct.pack("<IQI", 0, int(round_), 0)
    encryptor = Cipher(algorithms.ChaCha20(secret, nonce), mode=None).encryptor()
    return encryptor.update(bytes(n_bytes))


def pair_gaussians(secret: bytes, round_: int, dim: int) -> np.ndarray:
    """(dim,) standard normals of round ``round_`` from the pair's ``secret`` (Box-Muller on
    53-bit uniforms of its ChaCha20 keystream; see the module docstring)."""
    half = math.ceil(dim / 2)
    words = np.frombuffer(keystream(secret, round_, 16 * half), dtype="<u8")
    uniforms = ((words >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53
    radius = np.sqrt(-2.0 * np.log(uniforms[:half]))
    angle = 2.0 * np.pi * uniforms[half:]
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:dim]


@dataclass(slots=True)
class KeyedPairStream:
    """One end's pair term from an agreed secret: :class:`~p2pdp.protocols.iterative_peer.
    PairStream`'s interface (``edge``, ``sign``, ``std``, ``draw``), each round drawn
    directly from the secret (no state)."""

    edge: int
    sign: float
    std: float
    secret: bytes = field(repr=False)

    def draw(self, round_: int, dim: int) -> np.ndarray:
        """Round ``round_``'s draw (d,), times ``std``."""
        return pair_gaussians(self.secret, round_, dim) * self.std


class PairKeys:
    """A host's side of the key agreement: its peers' key pairs, the neighbours' public keys
    it accepted, and the pair streams it gives its machines.

    Parameters
    ----------
    peers : iterable of int
        The peers this host runs.
    mixing : Mixing
        The overlay (public).
    host_of : (P,) int array
        The host of every peer.
    session : bytes
        The run's session id (:func:`session_id`).
    denominators : dict
        Its own peers' public step denominators.
    pair_noise_multiplier, clip_norm : float
        ``z_p`` as applied and the clip norm ``C``: a pair's term has standard deviation
        ``z_p C / min(m_a, m_b)`` in the step's gradient.
    seeds : StreamSeeds or None
        Seeded mode (NOT private): the run's seeded roots, whose per-edge streams the pair
        terms are drawn from (the simulator's); None: from the agreed secrets.
    """

    def __init__(
        self,
        peers: Iterable[int],
        mixing: Mixing,
        host_of: np.ndarray,
        *,
        session: bytes,
        denominators: dict[int, float],
        pair_noise_multiplier: float,
        clip_norm: float,
        seeds: StreamSeeds | None = None,
    ) -> None:
        self.scale = float(pair_noise_multiplier) * float(clip_norm)
        self.seeds = seeds
        self.own = sorted(int(p) for p in peers)
        self.mixing = mixing
        self.host_of = np.asarray(host_of)
        self.session = bytes(session)
        self.denominators = {int(p): float(m) for p, m in denominators.items()}
        self._private = {p: X25519PrivateKey.generate() for p in self.own}
        self.public = {p: key.public_key().public_bytes_raw() for p, key in self._private.items()}
        own = set(self.own)
        #: remote peer -> this host's peers it neighbours
        self.wanted: dict[int, list[int]] = {}
        for p in self.own:
            for j in self._neighbours(p):
                if j not in own:
                    self.wanted.setdefault(j, []).append(p)
        self.received: dict[int, bytes] = {}  # remote peer -> its public key, once
        self.edges = edge_pairs(mixing)  # (U, 2) the overlay's edges (a, b), a < b

    def _neighbours(self, peer: int) -> list[int]:
        start, stop = int(self.mixing.indptr[peer]), int(self.mixing.indptr[peer + 1])
        return [int(j) for j in self.mixing.indices[start:stop]]

    @property
    def ready(self) -> bool:
        """Whether every neighbour of its peers has a public key here."""
        return len(self.received) == len(self.wanted)

    def offers(self) -> dict[int, list[list[Any]]]:
        """Host -> the entries ``[peer, public key, denominator]`` of its frame: this host's
        peers with a neighbour on that host (only public values)."""
        offers: dict[int, list[list[Any]]] = {}
        for p in self.own:
            hosts = {int(self.host_of[j]) for j in self._neighbours(p)}
            for h in sorted(hosts - {int(self.host_of[p])}):
                offers.setdefault(h, []).append([p, self.public[p], self.denominators[p]])
        return offers

    def accept(self, sender_host: int, entries: Any) -> None:
        """A :data:`KEYS` frame's entries from the host authenticated as ``sender_host``.
        Every entry is checked before any is kept: ProtocolError naming the first that is
        not a well-formed ``[peer, 32-byte key, denominator]`` of a peer that ``sender_host``
        runs, neighbours one of this host's peers and has no key here yet."""
        if not isinstance(entries, list) or len(entries) > len(self.wanted):
            raise ProtocolError(f"a keys frame's entries: {entries!r:.60}")
        kept: dict[int, tuple[bytes, float]] = {}
        for entry in entries:
            if not isinstance(entry, list) or len(entry) != 3:
                raise ProtocolError(f"a keys entry {entry!r:.60}")
            peer = integer(entry[0], "keys peer", 0, len(self.host_of))
            public, denominator = entry[1], entry[2]
            if int(self.host_of[peer]) != sender_host:
                raise ProtocolError(f"host {sender_host} sends the key of peer {peer}")
            if peer not in self.wanted:
                raise ProtocolError(f"peer {peer} neighbours no peer of this host")
            if peer in self.received or peer in kept:
                raise ProtocolError(f"a second key of peer {peer}")
            if not isinstance(public, bytes) or len(public) != _PUBLIC_BYTES:
                raise ProtocolError(f"the key of peer {peer} is not {_PUBLIC_BYTES} bytes")
            if type(denominator) not in (int, float) or not 0 < denominator < math.inf:
                raise ProtocolError(f"the denominator of peer {peer}: {denominator!r:.20}")
            kept[peer] = (public, float(denominator))
        for peer, (public, denominator) in kept.items():
            self.received[peer] = public
            self.denominators[peer] = denominator

    def secret(self, peer: int, other: int) -> bytes:
        """The secret of the pair (``peer``, one of this host's, and its neighbour
        ``other``)."""
        public = self.public.get(other) or self.received[other]
        return pair_secret(self._private[peer], public, session=self.session, a=peer, b=other)

    def streams(self, peer: int) -> list[PairTerm]:
        """Peer ``peer``'s pair streams, in the order its machine adds them
        (:func:`~p2pdp.protocols.peer_streams.pair_ends`): from the agreed secrets, or,
        in seeded mode (NOT private), the simulator's per-edge streams."""
        if not self.ready:
            raise ValueError("the pair keys are not all here yet")
        denominators = np.full(len(self.host_of), np.nan)
        for p, m in self.denominators.items():
            denominators[p] = m
        edges = self.edges
        streams: list[PairTerm] = []
        for edge, sign, std in pair_ends(peer, edges, denominators, self.scale):
            if self.seeds is not None:
                rng = self.seeds.generator("pairs", edge)
                streams.append(PairStream(edge, sign, std, rng))
            else:
                a, b = (int(v) for v in edges[edge])
                other = b if a == peer else a
                streams.append(KeyedPairStream(edge, sign, std, self.secret(peer, other)))
        return streams
