"""The wire format of the network runtime: msgpack maps in length-prefixed frames.

A frame is a 4-byte big-endian length followed by that many bytes of one msgpack map
(`msgpack <https://msgpack.org>`_: no home-made encoding). A map has a ``"kind"`` (str) and
the fields of its kind; a vector travels as ``{"shape": [...], "data": bytes}`` of
little-endian float64, or uint64 for secure aggregation's shares (:func:`pack_vector`), so a
model or a share is ``8 d`` bytes plus ~20 of framing.

Every read waits at most ``timeout`` seconds (:func:`read_frame`); a frame longer than
``max_bytes``, bytes that are not one msgpack map, or a map without a string ``kind`` raise
:class:`ProtocolError`, which a receiver logs and survives (it closes that connection only).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

__all__ = [
    "MAX_FRAME_BYTES",
    "MODEL",
    "IdleTimeout",
    "ModelFrame",
    "ProtocolError",
    "encode",
    "error_reason",
    "frame_bytes",
    "integer",
    "model_frame",
    "pack_vector",
    "parse_model",
    "read_frame",
    "unpack_vector",
]

#: Largest frame a peer accepts by default (bytes): a model of 10^5 float64 and its fields.
MAX_FRAME_BYTES = 1 << 20
_LENGTH = struct.Struct(">I")


def frame_bytes(dim: int, n_peers: int) -> int:
    """The largest frame (bytes) the peer protocol sends in a run of ``n_peers`` peers and
    statistics of length ``dim``: one vector of ``dim`` 8-byte numbers (a statistic, a share, a
    model), a member list of at most ``n_peers`` ids (at most 9 bytes each in msgpack) and a
    few scalar fields (1 KiB is ample). A peer refuses anything longer before reading it."""
    return 8 * dim + 9 * n_peers + 1024


class ProtocolError(Exception):
    """A frame that breaks the wire format (too long, not msgpack, no kind, bad vector)."""


class IdleTimeout(TimeoutError):
    """No frame began within a connection's idle time (:func:`read_frame`): its sender
    stopped using it (a sender drops a connection it left unused, and connects afresh), so
    closing it is an ordinary end, not a refusal."""


def integer(value: Any, name: str, low: int = 0, high: int = 2**63) -> int:
    """``value`` if it is an int in ``[low, high)`` (msgpack's integers: not a bool, a
    number-like string or a float); else ProtocolError naming the field ``name``."""
    if type(value) is not int or not low <= value < high:
        raise ProtocolError(f"{name} must be an integer in [{low}, {high}), got {value!r:.40}")
    return value


def encode(message: dict[str, Any]) -> bytes:
    """One frame: the length prefix and the msgpack bytes of ``message``."""
    body = msgpack.packb(message, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


async def read_frame(
    reader: asyncio.StreamReader,
    *,
    timeout: float,
    idle: float | None = None,
    max_bytes: int = MAX_FRAME_BYTES,
) -> dict[str, Any] | None:
    """The next message from ``reader``; None at a clean end of stream.

    Waits up to ``idle`` seconds (default ``timeout``) for a frame to begin, then up to
    ``timeout`` for the rest of it.

    Raises
    ------
    IdleTimeout
        No frame began within ``idle`` seconds (a :class:`TimeoutError`).
    TimeoutError
        A frame began and did not end within ``timeout``.
    ProtocolError
        Oversize, truncated or malformed frame.
    """
    wait = timeout if idle is None else idle
    try:
        header = await asyncio.wait_for(reader.readexactly(_LENGTH.size), wait)
    except asyncio.IncompleteReadError as error:
        if not error.partial:
            return None
        raise ProtocolError("connection closed inside a frame's length") from None
    except TimeoutError:
        raise IdleTimeout(f"no frame began within {wait:g} s") from None
    (length,) = _LENGTH.unpack(header)
    if length > max_bytes:
        raise ProtocolError(f"frame of {length} bytes exceeds the maximum of {max_bytes}")
    try:
        body = await asyncio.wait_for(reader.readexactly(length), timeout)
    except asyncio.IncompleteReadError:
        raise ProtocolError(f"connection closed inside a frame of {length} bytes") from None
    except TimeoutError:
        raise TimeoutError(f"a frame of {length} bytes did not end within {timeout:g} s") from None
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (ValueError, msgpack.exceptions.ExtraData, msgpack.exceptions.FormatError) as error:
        raise ProtocolError(f"frame is not msgpack: {error}") from None
    if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
        raise ProtocolError(f"frame is not a map with a string 'kind': {message!r:.80}")
    return message


def pack_vector(vector: np.ndarray, *, ring: bool = False) -> dict[str, Any]:
    """An array as a msgpack-able map: its shape and its little-endian bytes, float64 (or,
    ``ring``, uint64: secure aggregation's fixed-point shares)."""
    array = np.ascontiguousarray(vector, dtype="<u8" if ring else "<f8")
    return {"shape": list(array.shape), "data": array.tobytes()}


def unpack_vector(
    value: Any, *, shape: tuple[int, ...] | None = None, ring: bool = False
) -> np.ndarray:
    """The array of :func:`pack_vector` (float64, or uint64 with ``ring``); ProtocolError if
    malformed, not of ``shape``, or (floats) not finite."""
    try:
        declared = tuple(int(n) for n in value["shape"])
        array = np.frombuffer(value["data"], dtype="<u8" if ring else "<f8").reshape(declared)
    except (KeyError, TypeError, ValueError) as error:
        raise ProtocolError(f"malformed vector: {error}") from None
    if shape is not None and array.shape != shape:
        raise ProtocolError(f"vector of shape {array.shape}, expected {shape}")
    if ring:
        return array.astype(np.uint64)
    if not np.all(np.isfinite(array)):
        raise ProtocolError("vector holds NaN or infinity")
    return array.astype(np.float64)


#: A model from one peer to an overlay neighbour, for one exchange of one round of an
#: iterative protocol (:mod:`p2pdp.net.iterative_host`).
MODEL = "model"


@dataclass(frozen=True, slots=True)
class ModelFrame:
    """A :data:`MODEL` frame, its fields checked (:func:`parse_model`).

    Attributes
    ----------
    sender, receiver : int
        Peer ids in ``[0, P)``.
    round : int
        The round it belongs to, in ``[1, rounds]``.
    exchange : int
        The averaging of that round, in ``[0, exchanges)``.
    model : (d,) float64 array
        The sender's model, finite.
    """

    sender: int
    receiver: int
    round: int
    exchange: int
    model: np.ndarray


def model_frame(frame: ModelFrame) -> bytes:
    """The encoded :data:`MODEL` frame of ``frame`` (``8 d`` bytes of model and ~60 more)."""
    return encode(
        {
            "kind": MODEL,
            "sender": frame.sender,
            "receiver": frame.receiver,
            "round": frame.round,
            "exchange": frame.exchange,
            "model": pack_vector(frame.model),
        }
    )


def parse_model(
    message: dict[str, Any], *, n_peers: int, rounds: int, exchanges: int, dim: int
) -> ModelFrame:
    """The fields of a :data:`MODEL` map, each checked (type, range, the model's shape and
    finiteness); ProtocolError naming the first that is wrong. Whether its sender may send
    it, for that round, to that receiver, once, is the receiving host's to check."""
    if message.get("kind") != MODEL:
        raise ProtocolError(f"not a model frame: {message.get('kind')!r:.40}")
    try:
        return ModelFrame(
            sender=integer(message["sender"], "sender", 0, n_peers),
            receiver=integer(message["receiver"], "receiver", 0, n_peers),
            round=integer(message["round"], "round", 1, rounds + 1),
            exchange=integer(message["exchange"], "exchange", 0, exchanges),
            model=unpack_vector(message["model"], shape=(dim,)),
        )
    except KeyError as error:
        raise ProtocolError(f"model frame without {error}") from None


def error_reason(error: BaseException) -> str:
    """What a log line says about ``error``: its message, else its class's name (a timeout
    or a reset may carry no message, and a refusal always says why)."""
    return str(error) or type(error).__name__
