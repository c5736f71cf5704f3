"""Commit-reveal of gossip formation on the network: commitments, signatures, the election.

The simulator models the commitments of gossip formation (:mod:`p2pdp.protocols.gossip`: a
nonce read through ``REVEAL``); on the network they are real. A member that accepts commits
``SHA-256(context, ids, nonce, salt)`` (:func:`commitment`, a 16-byte salt from the OS
CSPRNG) and its host signs the commitment with its Ed25519 key (:func:`statement` is what is
signed; the public keys travel in the hosts' ``hello`` and the coordinator's ``directory``).
Every member checks the group's signatures (:func:`check_signatures`) and each opening
(:func:`check_reveal`); the coordinator checks a ``formed`` report the same way and elects the
curator itself (:func:`elect`), so an initiator can neither forge a member's commitment nor
choose the curator. Used by a host's formation driver (:mod:`p2pdp.net.gossip_host`) and the
coordinator (:mod:`p2pdp.net.coordinator`); only `cryptography`'s primitives.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from p2pdp.net.wire import ProtocolError, integer
from p2pdp.protocols.gossip import elected

__all__ = [
    "HASH_BYTES",
    "NONCE_HIGH",
    "SALT_BYTES",
    "SIGNATURE_BYTES",
    "check_reveal",
    "check_signatures",
    "commitment",
    "elect",
    "member_list",
    "public_key",
    "statement",
]

#: Nonces are integers in [0, NONCE_HIGH) (the machine's draws); salts SALT_BYTES bytes.
NONCE_HIGH, SALT_BYTES = 2**53, 16
HASH_BYTES, SIGNATURE_BYTES, KEY_BYTES = 32, 64, 32
_IDS = struct.Struct("<qqqq")


def public_key(raw: Any) -> Ed25519PublicKey:
    """An Ed25519 public key from its 32 raw bytes; ProtocolError if it is not one."""
    if not isinstance(raw, bytes) or len(raw) != KEY_BYTES:
        raise ProtocolError(f"a signing key must be {KEY_BYTES} bytes")
    return Ed25519PublicKey.from_public_bytes(raw)


def commitment(initiator: int, attempt: int, member: int, nonce: int, salt: bytes) -> bytes:
    """``member``'s commitment to ``nonce`` in attempt ``(initiator, attempt)``: SHA-256 of
    a context string, the ids, the nonce and the salt (hiding: the 128-bit salt; binding:
    SHA-256's collision resistance)."""
    digest = hashes.Hash(hashes.SHA256())
    digest.update(b"p2pdp gossip commitment\0")
    digest.update(_IDS.pack(initiator, attempt, member, nonce))
    digest.update(salt)
    return digest.finalize()


def statement(initiator: int, attempt: int, member: int, committed: bytes) -> bytes:
    """What a member signs: its commitment, for this attempt, as this member."""
    return b"p2pdp gossip accept\0" + _IDS.pack(initiator, attempt, member, 0) + committed


def _bytes(value: Any, size: int, name: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != size:
        raise ProtocolError(f"{name} must be {size} bytes")
    return value


def check_signatures(
    keys: list[Ed25519PublicKey],
    host_of: np.ndarray,
    attempt: tuple[int, int],
    members: list[int],
    commitments: list[Any],
    signatures: list[Any],
) -> list[bytes]:
    """Each member's commitment, checked against its host's signature; ProtocolError if one
    is malformed or its signature does not verify."""
    if not isinstance(commitments, list) or not isinstance(signatures, list):
        raise ProtocolError("commitments and signatures must be lists")
    if not len(commitments) == len(signatures) == len(members):
        raise ProtocolError("one commitment and one signature per member")
    initiator, attempt_id = attempt
    checked = []
    for member, committed, signature in zip(members, commitments, signatures, strict=True):
        committed = _bytes(committed, HASH_BYTES, "a commitment")
        try:
            keys[int(host_of[member])].verify(
                _bytes(signature, SIGNATURE_BYTES, "a signature"),
                statement(initiator, attempt_id, member, committed),
            )
        except InvalidSignature:
            raise ProtocolError(f"member {member}'s commitment is not signed by its host") from None
        checked.append(committed)
    return checked


def check_reveal(
    attempt: tuple[int, int], member: int, nonce: Any, salt: Any, committed: bytes
) -> int:
    """``nonce`` if it and ``salt`` open ``member``'s commitment; else ProtocolError."""
    nonce = integer(nonce, "nonce", 0, NONCE_HIGH)
    if commitment(*attempt, member, nonce, _bytes(salt, SALT_BYTES, "a salt")) != committed:
        raise ProtocolError(f"member {member}'s nonce does not open its commitment")
    return nonce


def elect(
    keys: list[Ed25519PublicKey],
    host_of: np.ndarray,
    n_peers: int,
    group_size: int,
    message: dict[str, Any],
) -> tuple[np.ndarray, int]:
    """A ``formed`` report's members (initiator first) and their curator, checked: ``g``
    distinct peers, every commitment signed by its member's host, every nonce opening its
    commitment; the curator ``members[sum(nonces) mod g]``. ProtocolError otherwise."""
    initiator = integer(message["initiator"], "initiator", 0, n_peers)
    attempt = (initiator, integer(message["attempt"], "attempt"))
    members = member_list(message["members"], n_peers, group_size, initiator)
    committed = check_signatures(
        keys, host_of, attempt, members, message["commitments"], message["signatures"]
    )
    nonces, salts = message["nonces"], message["salts"]
    if not isinstance(nonces, list) or not isinstance(salts, list) or len(nonces) != len(salts):
        raise ProtocolError("one nonce and one salt per member")
    if len(nonces) != len(members):
        raise ProtocolError("one nonce and one salt per member")
    opened = [
        check_reveal(attempt, member, nonce, salt, c)
        for member, nonce, salt, c in zip(members, nonces, salts, committed, strict=True)
    ]
    return np.array(members, dtype=np.int64), elected(members, opened)


def member_list(value: Any, n_peers: int, group_size: int, initiator: int) -> list[int]:
    """A group's member list: ``group_size`` distinct peer ids, the initiator first."""
    if not isinstance(value, list) or len(value) != group_size:
        raise ProtocolError(f"a group has {group_size} members")
    members = [integer(m, "member", 0, n_peers) for m in value]
    if len(set(members)) != group_size or members[0] != initiator:
        raise ProtocolError(f"bad member list {members[:8]}")
    return members
