"""What a network run counts: its clock, its completion monitor, its messages, its wire table.

The coordinator's (:class:`p2pdp.net.coordinator.NetworkWorld`) counterparts of the
simulator's bookkeeping, under the simulator's attribute names so that the experiment code
scores a network run as it scores a simulated one: :class:`Clock` (``env.now``: wall seconds
since the run began), :class:`Monitor` (the completion monitor's counts), :class:`MessageCounts`
(the transport's), and :class:`WireStats`, what travelled on the wire, measured (the run's
``wire`` table). :data:`LOST` and :data:`REFUSED` say which of the refusal reasons the hosts
report are the run's messages lost and which are messages refused as outside the protocol.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2pdp.net.gossip_host import FORMED, STATUS
from p2pdp.net.hosts import DONE, ENROLL, HELLO, KINDS, PRE_EMPTED, STATS

__all__ = ["LOST", "REFUSED", "Clock", "MessageCounts", "Monitor", "WireStats"]

#: Refusal reasons (the ``wire`` table's) that are the run's own messages lost: a frame that
#: could not be delivered, or that reached its curator past its group's timer.
LOST = ("unreachable", "expired", PRE_EMPTED)
#: Refusal reasons that are messages refused as outside the protocol (replayed, forged,
#: malformed, from a party the protocol's state does not entitle to send them), counted per
#: kind (the row's ``messages_refused``); refused connections are not messages.
REFUSED = (*KINDS, HELLO, DONE, STATS, FORMED, STATUS, ENROLL, "unknown")


@dataclass
class Monitor:
    """The completion monitor's counts (as :class:`p2pdp.sim.world.CompletionMonitor`)."""

    aggregations: int = 0
    aborted: int = 0
    end_time: float = 0.0
    stop_reason: str = ""


@dataclass
class MessageCounts:
    """Messages as the simulator counts them (attribute names of its Transport)."""

    messages_sent: np.ndarray
    bytes_sent: np.ndarray
    control_messages: int = 0
    messages_lost: int = 0
    messages_refused: int = 0


class Clock:
    """``now``: wall seconds since the run began (observers read ``world.env.now``)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def now(self) -> float:
        return time.perf_counter() - self.start


@dataclass
class WireStats:
    """What travelled on the wire, measured: frames and bytes per message kind (every
    sender: coordinator, peers, reports) and frames refused per reason."""

    frames: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)

    def add(self, kind: str, n_bytes: int) -> None:
        self.frames[kind] += 1
        self.bytes[kind] += n_bytes

    def rows(self, lost_hosts: int = 0) -> list[dict[str, Any]]:
        """One row per kind: ``kind``, ``frames``, ``wire_bytes``; then ``refused`` (frames
        refused, and late releases) and ``hosts lost`` (in ``frames``: host processes)."""
        rows = [
            {"kind": kind, "frames": self.frames[kind], "wire_bytes": self.bytes[kind]}
            for kind in sorted(self.frames)
        ]
        rows.append({"kind": "refused", "frames": sum(self.refused.values()), "wire_bytes": 0})
        rows.append({"kind": "hosts lost", "frames": lost_hosts, "wire_bytes": 0})
        return rows
