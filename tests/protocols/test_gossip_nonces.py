"""A gossip member's nonce (p2pdp.protocols.gossip.GossipFormation): the machine, not a
driver, decides which nonce a member reveals. On the network a member commits to its nonce
when it first accepts, so a member invited to the same attempt again (its lock ran out
before its acceptance reached the initiator) must reveal the nonce it drew first."""

from __future__ import annotations

import numpy as np

from p2pdp.protocols.gossip import (
    ACCEPT,
    GROUP,
    INVITE,
    LOCKED,
    REVEAL,
    Attempt,
    Envelope,
    GossipFormation,
)
from p2pdp.protocols.settings import GossipConfig

N_PEERS = 4


class _Views:
    def view(self, peer: int) -> np.ndarray:
        return np.array([q for q in range(N_PEERS) if q != peer])

    def forget(self, peer: int, other: int) -> None:
        pass


def _machine(rng: np.random.Generator) -> tuple[GossipFormation, list[float], list[float]]:
    """A machine on a clock the test sets (``now[0]``), and the uniforms it drew, in order."""
    now, drawn = [0.0], []

    def uniform() -> float:
        drawn.append(float(rng.random()))
        return drawn[-1]

    machine = GossipFormation(
        group_size=3,
        max_failed=3,
        params=GossipConfig(lock_timeout=1.0),
        collect_timeout=1.0,
        views=_Views(),
        clock=lambda: now[0],
        online=np.ones(N_PEERS, dtype=bool),
        can_afford=lambda peers: np.ones(len(peers), dtype=bool),
        solvent=N_PEERS,
        uniform=uniform,
        rng=rng,
    )
    return machine, now, drawn


def _sent(machine: GossipFormation) -> list[Envelope]:
    return [value for kind, value in machine.effects() if kind == "send"]


def test_a_member_invited_again_after_its_lock_ran_out_reveals_the_nonce_it_drew_first():
    machine, now, drawn = _machine(np.random.default_rng(3))
    machine.become_free(1)
    attempt = Attempt(attempt_id=7, initiator=0)
    machine.handle(Envelope(INVITE, 0, 1, attempt))
    first = attempt.nonces[1]
    assert [e.kind for e in _sent(machine)] == [ACCEPT] and machine.state[1] == LOCKED
    now[0] = 2.0  # its lock (1 s) ran out before its acceptance reached the initiator
    machine.expire_locks()
    before = len(drawn)
    machine.handle(Envelope(INVITE, 0, 1, attempt))  # the initiator's next round asks again
    assert [e.kind for e in _sent(machine)] == [ACCEPT] and machine.state[1] == LOCKED
    assert len(drawn) == before + 1  # the draw is still taken: later draws stay in place
    assert int(drawn[-1] * 2**53) != first  # so keeping the first nonce is a decision
    machine.handle(Envelope(GROUP, 0, 1, attempt))
    (reveal,) = _sent(machine)
    assert reveal.kind == REVEAL and reveal.payload == first == attempt.nonces[1]


def test_members_of_different_attempts_draw_their_own_nonces():
    """Keeping a nonce is per attempt: the same peer in a new attempt draws a new one."""
    machine, now, drawn = _machine(np.random.default_rng(4))
    machine.become_free(1)
    attempts = [Attempt(attempt_id=k, initiator=0) for k in range(2)]
    for attempt in attempts:
        machine.handle(Envelope(INVITE, 0, 1, attempt))
        now[0] += 2.0
        machine.expire_locks()
    # its draws: a backoff whenever it becomes free, a nonce whenever it accepts
    assert [a.nonces[1] for a in attempts] == [int(u * 2**53) for u in drawn[1:4:2]]
    assert attempts[0].nonces[1] != attempts[1].nonces[1]
