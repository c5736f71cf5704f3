"""The formation protocol's backoffs (:class:`p2pdp.protocols.gossip.GossipFormation`): the
drivers free many peers at once (:meth:`become_free_all`), which must schedule exactly what
one :meth:`become_free` per peer, in order, would (same draws, same floats)."""

from __future__ import annotations

import numpy as np
import pytest

from p2pdp.core.rng import Uniforms
from p2pdp.protocols.gossip import FREE, GossipFormation


class _Params:
    def __init__(self, backoff: float) -> None:
        self.backoff = backoff


def _formation(n_peers: int, backoff: float, now: float, *, seed: int) -> GossipFormation:
    uniforms = Uniforms(np.random.default_rng(seed), batch=7)  # several batches a call
    formation = GossipFormation(
        group_size=3,
        max_failed=5,
        params=_Params(backoff),
        collect_timeout=1.0,
        views=None,  # type: ignore[arg-type]  # not read when freeing peers
        clock=lambda: now,
        online=np.ones(n_peers, dtype=bool),
        can_afford=lambda peers: np.ones(np.size(peers), dtype=bool),
        solvent=n_peers,
        uniform=uniforms.draw,
        rng=np.random.default_rng(seed),
        take=uniforms.take,
    )
    # failures in a row from 0 to past max_failed: backoffs doubled 0-3 times, or none
    formation.failures[:] = np.random.default_rng(seed + 1).integers(0, 7, n_peers)
    return formation


@pytest.mark.parametrize(("backoff", "now", "seed"), [(2.0, 0, 1), (0.37, 12.3, 2), (5.1, 1e4, 3)])
def test_freeing_peers_at_once_schedules_what_freeing_each_in_turn_does(backoff, now, seed):
    peers = np.random.default_rng(seed).permutation(40)[:29]
    one_by_one, at_once = (_formation(40, backoff, now, seed=seed) for _ in range(2))
    for peer in peers.tolist():
        one_by_one.become_free(peer)
    at_once.become_free_all(peers)
    assert (at_once.state[peers] == FREE).all()
    assert (at_once.failures >= 5).any() and np.isinf(at_once.initiate_at[peers]).any()
    # the same floats (math.log1p in both; correctly rounded arithmetic around it)
    np.testing.assert_array_equal(at_once.initiate_at, one_by_one.initiate_at)
    assert at_once._uniform() == one_by_one._uniform()  # the stream left at the same point
