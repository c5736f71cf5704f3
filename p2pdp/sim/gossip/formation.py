"""The SimPy driver of gossip group formation (:mod:`p2pdp.protocols.gossip`).

The protocol itself (states, locks, invitations, commit-reveal, attempts) is the
transport-free :class:`~p2pdp.protocols.gossip.GossipFormation`; :class:`GroupFormation` runs
it in simulation: messages go through the world's transport (delayed, lost and counted like any
other; a message that reaches an offline peer is lost), each attempt's coroutine is a SimPy
process (its :class:`~p2pdp.protocols.gossip.StartTimer` a timeout, its
:class:`~p2pdp.protocols.gossip.Wait` a wait for a wake-up or the timer), initiations are
timeouts scheduled at each tick, and a formed group goes to the world.

Message sizes (the simulator's model of the wire): a header, plus ``ACCEPT``: a commitment
(hash) and its signature; ``GROUP``: per member its id, commitment and signature; ``REVEAL``: a
nonce and its signature; ``START``: per member a nonce and a signature (Ed25519 signatures).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import simpy

from p2pdp.protocols.gossip import (
    ACCEPT,
    ACK,
    DECLINE,
    GROUP,
    INVITE,
    RELEASE,
    REVEAL,
    START,
    Attempt,
    Envelope,
    GossipFormation,
    StartTimer,
)
from p2pdp.protocols.groups import HEADER_BYTES
from p2pdp.sim.gossip.views import ID_BYTES

if TYPE_CHECKING:
    from p2pdp.sim.gossip.views import Newscast
    from p2pdp.sim.sampler import SamplerWorld

__all__ = ["FormationDriver", "GroupFormation", "message_bytes"]

#: Wire sizes (bytes): hash (commitment), nonce, signature (Ed25519).
HASH_BYTES, NONCE_BYTES, SIGNATURE_BYTES = 32, 32, 64


def message_bytes(group_size: int) -> dict[str, int]:
    """Wire size (bytes) of each kind of formation message, for groups of ``group_size``."""
    g = group_size
    return {
        INVITE: HEADER_BYTES,
        ACCEPT: HEADER_BYTES + HASH_BYTES + SIGNATURE_BYTES,
        DECLINE: HEADER_BYTES,
        GROUP: HEADER_BYTES + g * (ID_BYTES + HASH_BYTES + SIGNATURE_BYTES),
        REVEAL: HEADER_BYTES + NONCE_BYTES + SIGNATURE_BYTES,
        START: HEADER_BYTES + g * (NONCE_BYTES + SIGNATURE_BYTES),
        ACK: HEADER_BYTES,
        RELEASE: HEADER_BYTES,
    }


class _Timer:
    """A timeout as the protocol sees it: ``fired`` once processed."""

    __slots__ = ("event",)

    def __init__(self, event: simpy.Event) -> None:
        self.event = event

    @property
    def fired(self) -> bool:
        return bool(self.event.processed)


class FormationDriver(GossipFormation):
    """The formation protocol over a simulated world, whichever driver advances it: per
    message (:class:`GroupFormation`) or in rounds over arrays
    (:class:`~p2pdp.sim.gossip.rounds.RoundFormation`).

    Parameters
    ----------
    world : SamplerWorld
        Reads ``world.config`` (``groups``, ``gossip``), ``world.online``,
        ``world.ledger.can_afford``; its transport carries (or counts) the messages.
    views : Newscast
        Whom an initiator invites; it forgets the peers that retired.
    uniform : callable
        ``uniform()`` gives the next buffered uniform of the protocol stream
        (:class:`~p2pdp.core.rng.Uniforms`; backoffs, nonces), shared with the faults.
    rng : numpy.random.Generator
        The protocol stream (the order of invitations).
    take : callable, optional
        ``take(n)``: the next ``n`` values of ``uniform()`` at once (None: ``n`` calls).
    on_formed : callable
        ``on_formed(members, curator)``: a group formed ((g,) int64 members, initiator first,
        and its curator); the caller starts its aggregation.
    on_attempt_over : callable
        ``on_attempt_over()``: an attempt ended, formed or not (the observer may stop); in
        rounds, once for the attempts that ended together.
    """

    def __init__(
        self,
        world: SamplerWorld,
        views: Newscast,
        *,
        uniform: Callable[[], float],
        rng: np.random.Generator,
        take: Callable[[int], list[float]] | None = None,
        on_formed: Callable[[np.ndarray, int], None],
        on_attempt_over: Callable[[], None],
    ) -> None:
        config, env = world.config, world.env
        super().__init__(
            group_size=config.groups.group_size,
            max_failed=config.groups.max_failed_attempts,
            params=config.gossip,
            collect_timeout=config.groups.collect_timeout,
            views=views,
            clock=lambda: env.now,
            online=world.online,
            can_afford=world.ledger.can_afford,
            solvent=int(np.count_nonzero(world.ledger.active_mask())),
            uniform=uniform,
            rng=rng,
            take=take,
        )
        self.world = world
        self._on_formed = on_formed
        self._on_attempt_over = on_attempt_over
        self._bytes = message_bytes(self.group_size)


class GroupFormation(FormationDriver):
    """The formation protocol, every peer's side, driven by the world's clock and transport:
    each message goes through ``world.transport`` (parameters: :class:`FormationDriver`)."""

    def __init__(self, world: SamplerWorld, views: Newscast, **driver: Any) -> None:
        super().__init__(world, views, **driver)
        self.env = world.env
        self._wakes: dict[int, simpy.Event] = {}  # attempt -> the event its initiator awaits

    def advance(self, tick: float) -> None:
        """At a tick of the sampler's clock: schedule the initiations due before the next
        tick, each at its own time (not in lockstep); messages drive the rest."""
        now = self.env.now
        for peer, at in self.due(now + tick):
            timer = self.env.timeout(max(0.0, at - now))
            timer.callbacks.append(partial(self._initiate, peer, at))

    def _initiate(self, peer: int, at: float, _timer: simpy.Event | None = None) -> None:
        attempt = self.initiate(peer, at)
        if attempt is not None:
            self.env.process(self._drive(attempt))

    def _drive(self, attempt: Attempt) -> Generator[simpy.Event, Any, None]:
        """The initiator's coroutine as a SimPy process: its effects are carried out before
        each of its commands, in the order it decided them."""
        coroutine = self.run_attempt(attempt)
        reply = None
        while True:
            try:
                command = coroutine.send(reply)
            except StopIteration:
                break
            self._flush()
            if isinstance(command, StartTimer):
                reply = _Timer(self.env.timeout(command.seconds))
            else:
                wake = self._wakes[attempt.attempt_id] = self.env.event()
                yield wake | cast(_Timer, command.timer).event  # the driver's own timer
                reply = None
        self._wakes.pop(attempt.attempt_id, None)
        self._flush()

    def _deliver(self, message: Envelope) -> None:
        if not self.online[message.receiver]:  # arrived while the receiver was offline
            self.world.transport.lose(message.sender)
            return
        self.handle(message)
        self._flush()

    def _flush(self) -> None:
        """Carry out the protocol's effects, in order."""
        for kind, value in self.effects():
            if kind == "send":
                # handlers schedule nothing urgent (no process): same-instant messages share
                self.world.transport.send(
                    value.sender, self._deliver, value, self._bytes[value.kind], coalesce=True
                )
            elif kind == "wake":
                wake = self._wakes.get(value.attempt_id)
                if wake is not None and not wake.triggered:
                    wake.succeed()
            elif kind == "formed":
                self._on_formed(*value)
            else:  # "over"
                self._on_attempt_over()
