"""The gossip observer's stop rule (p2pdp.protocols.gossip.stop_reason), which both drivers
call: the simulator's GossipSampler (tests/sim/test_gossip.py) and the network coordinator
(tests/net/test_network_gossip.py)."""

from __future__ import annotations

import itertools

from p2pdp.protocols.gossip import stop_reason
from p2pdp.protocols.groups import failed_in_a_row, stopped_initiating, too_few_solvent


def _reason(solvent=5, aborted=0, trying=0, under_way=0):
    return stop_reason(
        solvent=solvent,
        aborted_in_a_row=aborted,
        trying=trying,
        under_way=under_way,
        group_size=3,
        max_failed=4,
    )


def test_each_rule_stops_the_run_in_order_and_nothing_else_does():
    """Checked against the rule written out, over a grid around each threshold: too few
    solvent first, then aborts in a row, then nobody trying with nothing under way."""
    for solvent, aborted, trying, under_way in itertools.product(
        range(5), range(6), range(3), range(3)
    ):
        if solvent < 3:
            expected = too_few_solvent(3)
        elif aborted >= 4:
            expected = failed_in_a_row(4)
        elif trying == 0 and under_way == 0:
            expected = stopped_initiating(4)
        else:
            expected = ""
        assert _reason(solvent, aborted, trying, under_way) == expected, (
            solvent,
            aborted,
            trying,
            under_way,
        )
