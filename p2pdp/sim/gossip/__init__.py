"""Decentralised group formation: Newscast peer sampling and a commit-reveal group protocol.

:class:`~p2pdp.sim.gossip.sampler.GossipSampler` replaces the seed's central GroupAgent
(``groups.sampler = "gossip"``).
No component knows every peer: each peer's *view* (``gossip.view_size`` = c entries of
``(peer id, timestamp)``) is its only knowledge of the network, and every protocol message
goes through the world's transport, so it is delayed, lost and counted like any other.

=====================================  ======================================================
module                                 holds
=====================================  ======================================================
:mod:`p2pdp.sim.gossip.views`          peer sampling: Newscast views (``merge_views``,
                                       ``bootstrap_views``, ``Newscast``) and the
                                       vectorised view exchanges over the transport
:mod:`p2pdp.sim.gossip.compiled`       a large tick's view exchanges one after the other in
                                       compiled code (numba; the same views)
:mod:`p2pdp.sim.gossip.formation`      the SimPy driver of the group-formation protocol
                                       (:mod:`p2pdp.protocols.gossip`: invitations and
                                       locks, commit-reveal election, attempts, backoff)
:mod:`p2pdp.sim.gossip.rounds`         the same protocol advanced in rounds over arrays,
                                       one round trip per tick (large P, fault-free;
                                       ``gossip.formation``)
:mod:`p2pdp.sim.gossip.faults`         churn and crashes (``world.online``)
:mod:`p2pdp.sim.gossip.sampler`        ``GossipSampler``: composes the three, one clock
                                       process, the termination rule
=====================================  ======================================================
"""

# Re-exported for convenience (``as`` marks them so); documented in their own modules.
from p2pdp.sim.gossip.sampler import GossipSampler as GossipSampler
from p2pdp.sim.gossip.views import TICKS_PER_PERIOD as TICKS_PER_PERIOD
from p2pdp.sim.gossip.views import Newscast as Newscast
from p2pdp.sim.gossip.views import bootstrap_views as bootstrap_views
from p2pdp.sim.gossip.views import merge_views as merge_views
