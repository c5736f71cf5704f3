"""GroupPool's draws: Floyd's algorithm on the protocol stream, one group or a wave at a time."""

from __future__ import annotations

import numpy as np
import pytest

from p2pdp.core.rng import Uniforms
from p2pdp.protocols.groups import GroupPool


def _floyd(pool: list[int], uniform, g: int) -> tuple[list[int], int]:
    """Floyd's sampling of ``g`` of ``pool`` (taken out by swap-remove) and a uniform
    curator, written out independently of GroupPool: the reference its draws must match."""
    n = len(pool)
    picks: set[int] = set()
    for j in range(n - g, n):
        t = int(uniform() * (j + 1))
        picks.add(j if t in picks else t)
    chosen = [pool[i] for i in picks]
    for i in sorted(picks, reverse=True):
        pool[i] = pool[-1]
        pool.pop()
    return chosen, chosen[int(uniform() * g)]


@pytest.mark.parametrize("g", [1, 2, 3, 7])
@pytest.mark.parametrize("k", [1, 4])
def test_a_wave_of_draws_is_floyd_on_the_same_uniforms(g, k):
    peers = list(range(3, 200, 2))  # 99 peers: room for 3 waves of 4 groups of 7
    pool = GroupPool(Uniforms(np.random.default_rng(g * 10 + k), batch=5))
    pool.add(peers)
    reference_uniform = Uniforms(np.random.default_rng(g * 10 + k), batch=5).draw
    reference = list(peers)
    for wave in range(3):  # the pool changes between waves: members come back
        drawn, curators = pool.draw_many(g, k)
        expected = [_floyd(reference, reference_uniform, g) for _ in range(k)]
        assert drawn == [members for members, _ in expected]
        assert curators == [curator for _, curator in expected]
        assert pool.peers == reference
        back = [m for members in drawn for m in members][:: wave + 1]
        pool.add(back)
        reference.extend(back)
    # the same number of uniforms was used: the streams are at the same point
    assert pool._uniform() == reference_uniform()
    assert all(len(set(members)) == g for members in drawn)


def test_draw_is_one_group_of_a_wave():
    one, many = (GroupPool(Uniforms(np.random.default_rng(5))) for _ in range(2))
    one.add(list(range(40)))
    many.add(list(range(40)))
    drawn, curators = many.draw_many(4, 6)
    for members, curator in zip(drawn, curators, strict=True):
        got, got_curator = one.draw(4)
        assert got.dtype == np.int64 and got.tolist() == members and got_curator == curator
    assert one.peers == many.peers


@pytest.mark.parametrize("g", [1, 2, 5])
@pytest.mark.parametrize("n", [3, 1000])
def test_groups_drawn_in_turn_are_floyd_each_charged_before_the_next(g, n):
    """Waves of one group (the batched driver with max_concurrent_groups = 1): each group is
    Floyd's on the same uniforms, its members charged and the solvent ones back in the pool
    (member order) before the next draw; uneven budgets, so some peers leave early."""
    peers = list(range(0, 60, 2))
    most = 3
    counts = [0] * 60
    for peer in peers[:7]:
        counts[peer] = 2  # one aggregation left
    pool = GroupPool(Uniforms(np.random.default_rng(g + n), batch=7))
    pool.add(peers)
    reference_uniform = Uniforms(np.random.default_rng(g + n), batch=7).draw
    reference, reference_counts = list(peers), list(counts)
    members, curators = pool.draw_in_turn(g, n, counts, most)
    expected_members: list[int] = []
    expected_curators: list[int] = []
    while len(expected_curators) < n and len(reference) >= g:
        chosen, curator = _floyd(reference, reference_uniform, g)
        expected_members.extend(chosen)
        expected_curators.append(curator)
        for peer in chosen:
            reference_counts[peer] += 1
            if reference_counts[peer] < most:
                reference.append(peer)
    assert members == expected_members and curators == expected_curators
    assert counts == reference_counts and pool.peers == reference
    assert pool._uniform() == reference_uniform()  # the streams are at the same point
    assert len(curators) <= n and max(counts) <= most
    if n == 1000:  # the pool ran dry: fewer than g peers can afford another aggregation
        assert len(pool) < g and len(curators) > 3


def test_a_pool_peer_with_no_budget_left_is_a_bug_the_draws_name():
    pool = GroupPool(Uniforms(np.random.default_rng(0)))
    pool.add([0, 1, 2])
    with pytest.raises(RuntimeError, match="no budget left"):
        pool.draw_in_turn(3, 1, [0, 2, 0], 2)
