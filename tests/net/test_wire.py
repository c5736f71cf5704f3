"""The wire format (p2pdp.net.wire): frames, their bounds and refusals, msgpack, log reasons."""

from __future__ import annotations

import asyncio
import struct

import msgpack
import numpy as np
import pytest

from p2pdp.net.wire import (
    ProtocolError,
    encode,
    error_reason,
    pack_vector,
    read_frame,
    unpack_vector,
)


def _read(data: bytes, **kwargs):
    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_frame(reader, timeout=1.0, **kwargs)

    return asyncio.run(go())


def test_a_frame_round_trips_and_an_empty_stream_ends_cleanly():
    vector = np.array([0.5, -1.25, 3.0])
    message = _read(encode({"kind": "submit", "statistic": pack_vector(vector)}))
    assert message["kind"] == "submit"
    np.testing.assert_array_equal(unpack_vector(message["statistic"], shape=(3,)), vector)
    assert _read(b"") is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (struct.pack(">I", 1 << 21) + b"x", "exceeds the maximum"),
        (struct.pack(">I", 3) + b"\xc1\xc1\xc1", "not msgpack"),
        (encode({"no": "kind"}), "string 'kind'"),
        (encode([1, 2]), "string 'kind'"),
        (struct.pack(">I", 10) + b"abc", "closed inside a frame"),
        (b"\x00\x00", "closed inside a frame's length"),
    ],
)
def test_oversize_malformed_and_truncated_frames_are_refused(data, reason):
    with pytest.raises(ProtocolError, match=reason):
        _read(data)


def test_a_silent_connection_times_out():
    async def go():
        reader = asyncio.StreamReader()
        return await read_frame(reader, timeout=0.05)

    with pytest.raises(TimeoutError):
        asyncio.run(go())


@pytest.mark.parametrize(
    "value",
    [
        {"shape": [2], "data": b"\x00" * 8},  # too few bytes
        {"shape": [1], "data": np.array([np.nan]).tobytes()},
        {"data": b""},
    ],
)
def test_malformed_vectors_are_refused(value):
    with pytest.raises(ProtocolError):
        unpack_vector(value, shape=(1,) if value.get("shape") == [1] else None)


def test_msgpack_is_the_encoding():
    frame = encode({"kind": "x", "n": 1})
    assert msgpack.unpackb(frame[4:]) == {"kind": "x", "n": 1}


def test_a_log_lines_reason_is_never_empty():
    assert error_reason(TimeoutError()) == "TimeoutError"
    assert error_reason(ConnectionResetError("reset by peer")) == "reset by peer"
