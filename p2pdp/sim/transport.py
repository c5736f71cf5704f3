"""Message transport between peers: latency, bandwidth, loss, and counters.

A message is delivered by a SimPy timeout event whose callback hands it to the receiver: no
process per message. Messages that arrive at the same instant and were scheduled one after
another (a curator's ``g - 1`` submissions under a constant latency, say) share one event:
SimPy would process their events back to back anyway, so delivering them from one callback,
in the order they were sent, changes nothing but the number of events (see :meth:`send`).
Latencies and loss decisions are drawn from the transport's own generator in batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import numpy as np
import simpy
from simpy.core import NORMAL, EventPriority, SimTime
from simpy.events import Event

from p2pdp.config import RUNTIME_READS, NetworkConfig

__all__ = ["Environment", "Transport"]

_BATCH = 4096

_M = TypeVar("_M")


class Environment(simpy.Environment):
    """A SimPy environment that counts the events it schedules (:attr:`scheduled`).

    :meth:`Transport.send` reads the count to know whether anything was scheduled since its
    last message (if not, a message arriving at the same instant joins that message's event).
    """

    def __init__(self, initial_time: float = 0) -> None:
        super().__init__(initial_time)
        self.scheduled = 0

    def schedule(self, event: Event, priority: EventPriority = NORMAL, delay: SimTime = 0) -> None:
        self.scheduled += 1
        super().schedule(event, priority, delay)


class _Arrivals:
    """Messages delivered by one event: ``(deliver, message)`` pairs in the order sent."""

    __slots__ = ("at", "items", "mark")

    def __init__(
        self, at: float, mark: int, items: list[tuple[Callable[[Any], None], Any]]
    ) -> None:
        self.at = at  # arrival time (simulated seconds)
        self.mark = mark  # env.scheduled right after its event was scheduled
        self.items = items

    def deliver(self, event: Event) -> None:
        self.mark = -1  # delivered: nothing joins it any more
        for deliver, message in self.items:
            deliver(message)


class Transport:
    """Delivers messages after ``latency + size / bandwidth`` seconds, or loses them.

    Parameters
    ----------
    env : simpy.Environment
        An :class:`Environment` (which counts its events) lets :meth:`send` coalesce.
    config : NetworkConfig
    n_peers : int
        Peers are numbered ``0 .. n_peers-1``; the sender ``-1`` is the central sampler,
        whose messages are counted as ``control_messages``.
    rng : numpy.random.Generator
        Stream for latencies and losses.

    Counters: ``messages_sent``/``bytes_sent`` per peer (attempts, lost ones included),
    ``messages_lost``, ``control_messages``, ``broadcasts``.
    """

    #: The settings the simulator's message model reads (:mod:`p2pdp.core.reads`;
    #: ``network.latency`` adds ``latency_sigma`` for the lognormal model): the simulation
    #: runtime's entry of :data:`p2pdp.config.RUNTIME_READS`, where a config's check finds it.
    reads: ClassVar[tuple[str, ...]] = RUNTIME_READS["simulation"]

    def __init__(
        self,
        env: simpy.Environment,
        config: NetworkConfig,
        n_peers: int,
        *,
        rng: np.random.Generator,
    ) -> None:
        self.env = env
        self.config = config
        self.rng = rng
        self.messages_sent = np.zeros(n_peers, dtype=np.int64)
        self.bytes_sent = np.zeros(n_peers, dtype=np.int64)
        self.messages_lost = 0
        self.messages_late = 0
        self.control_messages = 0
        self.broadcasts = 0
        #: Called with the sender of every lost message (the world's observers), if set.
        self.on_lost: Callable[[int], None] | None = None
        self._latencies: list[float] = []
        self._uniforms: list[float] = []
        self._open: _Arrivals | None = None  # the last message's event, while joinable
        # Joining needs the environment's count of scheduled events (the world gives an
        # Environment only under a constant latency: random latencies never tie).
        self._coalesce = isinstance(env, Environment)

    def _latency(self) -> float:
        if not self._latencies:
            self._latencies = self.latencies(_BATCH).tolist()
        return self._latencies.pop()

    def latencies(self, n: int) -> np.ndarray:
        """``n`` latencies (simulated seconds) drawn from the configured law, (n,)."""
        cfg = self.config
        if cfg.latency == "constant":
            return np.full(n, cfg.latency_mean)
        if cfg.latency == "exponential":
            return self.rng.exponential(cfg.latency_mean, size=n)
        mu = np.log(max(cfg.latency_mean, 1e-300)) - cfg.latency_sigma**2 / 2  # lognormal, mean
        return self.rng.lognormal(mu, cfg.latency_sigma, size=n)

    def _lost(self) -> bool:
        if self.config.loss == 0.0:
            return False
        if not self._uniforms:
            self._uniforms = self.rng.random(_BATCH).tolist()
        return self._uniforms.pop() < self.config.loss

    def delay(self, n_bytes: int) -> float:
        """Simulated seconds for one message of ``n_bytes``: latency + size / bandwidth."""
        return self._latency() + n_bytes / self.config.bandwidth

    def _count(self, sender: int, n_bytes: int, n_messages: int = 1) -> None:
        if sender < 0:
            self.control_messages += n_messages
        else:
            self.messages_sent[sender] += n_messages
            self.bytes_sent[sender] += n_bytes

    def lose(self, senders: int | np.ndarray) -> None:
        """Count messages from ``senders`` (an id or an array of ids) as lost, and report them.

        For losses decided outside :meth:`send`: a message reaching an offline peer, or the
        vectorised view exchanges of gossip peer sampling.
        """
        ids = np.atleast_1d(senders)
        self.messages_lost += int(ids.size)
        if self.on_lost is not None:
            for sender in ids.tolist():
                self.on_lost(sender)

    def send(
        self,
        sender: int,
        deliver: Callable[[_M], None],
        message: _M,
        n_bytes: int,
        *,
        coalesce: bool = False,
    ) -> None:
        """Send ``message`` (``n_bytes`` on the wire); ``deliver(message)`` runs on arrival.

        A lost message is counted and never delivered: receivers rely on timeouts.

        ``coalesce``: the message may share the event of the previous coalescing message if
        both arrive at the same instant and no other event was scheduled in between. SimPy
        orders events by (time, priority, scheduling order), so two such events run back to
        back with nothing between them, and one event delivering both, in sending order, is
        the same run. Only for ``deliver`` callbacks that schedule nothing urgent (no new
        process): an urgent event scheduled while the first message is delivered would run
        before the second one's separate event, but after it here.
        """
        self._count(sender, n_bytes)
        if self._lost():
            self.messages_lost += 1
            if self.on_lost is not None:
                self.on_lost(sender)
            return
        env = self.env
        delay = self.delay(n_bytes)
        if not (coalesce and self._coalesce):
            event = env.timeout(delay, value=message)
            event.callbacks.append(lambda ev: deliver(ev.value))
            return
        assert isinstance(env, Environment)  # self._coalesce says so
        at = env.now + delay  # the time SimPy would schedule the message's own event at
        arrivals = self._open
        if arrivals is not None and arrivals.at == at and arrivals.mark == env.scheduled:
            arrivals.items.append((deliver, message))
            return
        arrivals = _Arrivals(at, 0, [(deliver, message)])
        env.timeout(delay).callbacks.append(arrivals.deliver)
        arrivals.mark = env.scheduled
        self._open = arrivals

    def transmit(self, senders: np.ndarray, n_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        """Messages sent at the same instant, one from each of ``senders``: their fates.

        The vectorised form of :meth:`send`: every message is counted as sent; it is lost
        (counted, reported) with probability ``loss``. Returns two (len(senders),) arrays:
        each message's delay (latency plus ``n_bytes / bandwidth``, seconds) and whether it
        was lost. The latencies are drawn first, then the losses, in the order of ``senders``.
        """
        senders = np.asarray(senders, dtype=np.int64)
        n = senders.size
        counts = np.bincount(senders, minlength=self.messages_sent.size)
        self.messages_sent += counts
        self.bytes_sent += counts * n_bytes
        delays = self.latencies(n) + n_bytes / self.config.bandwidth
        lost = np.zeros(n, dtype=bool)
        if self.config.loss > 0:
            lost = self.rng.random(n) < self.config.loss
            self.lose(senders[lost])
        return delays, lost

    def exchange(
        self, senders: np.ndarray, n_bytes: int, *, within: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`transmit`, then which messages arrive in time.

        For a synchronous round (no event per message): a message not lost is *late*
        (counted in ``messages_late``, not delivered) when its delay exceeds ``within``
        seconds. Returns two (len(senders),) bool masks: the messages delivered in time, and
        the late ones (they reach their receiver, which reads them but does not average
        them); a message in neither was lost.
        """
        delays, lost = self.transmit(senders, n_bytes)
        on_time = delays <= within
        late = ~on_time & ~lost
        self.messages_late += int(late.sum())
        return on_time & ~lost, late

    def broadcast(
        self, sender: int, n_recipients: int, n_bytes: int, deliver: Callable[[], None]
    ) -> None:
        """One dissemination of an ``n_bytes`` message to ``n_recipients`` peers.

        Modelled as what it is, one event: every recipient gets it after one latency plus the
        transfer time of all copies through the sender's link. Bytes count every copy; losses
        are not modelled for a broadcast (an overlay flood retransmits).
        """
        self._count(sender, n_bytes * n_recipients, n_recipients)
        self.broadcasts += 1
        event = self.env.timeout(self._latency() + n_bytes * n_recipients / self.config.bandwidth)
        event.callbacks.append(lambda ev: deliver())
