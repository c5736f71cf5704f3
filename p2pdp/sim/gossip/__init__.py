"""Decentralised group formation: Newscast peer sampling and a commit-reveal group protocol.

:class:`GossipSampler` replaces the seed's central GroupAgent (``groups.sampler = "gossip"``).
No component knows every peer: each peer's *view* (``gossip.view_size`` = c entries of
``(peer id, timestamp)``) is its only knowledge of the network, and every protocol message
goes through the world's transport, so it is delayed, lost and counted like any other.

=====================================  ======================================================
module                                 holds
=====================================  ======================================================
:mod:`p2pdp.sim.gossip.views`          peer sampling: Newscast views (:func:`merge_views`,
                                       :func:`bootstrap_views`, :class:`Newscast`) and the
                                       vectorised view exchanges over the transport
:mod:`p2pdp.sim.gossip.formation`      the group-formation protocol: invitations and locks,
                                       commit-reveal curator election, attempts, backoff
:mod:`p2pdp.sim.gossip.faults`         churn and crashes (``world.online``)
:mod:`p2pdp.sim.gossip.sampler`        :class:`GossipSampler`: composes the three, one clock
                                       process, the termination rule
=====================================  ======================================================
"""

from p2pdp.sim.gossip.sampler import GossipSampler
from p2pdp.sim.gossip.views import TICKS_PER_PERIOD, Newscast, bootstrap_views, merge_views

__all__ = ["TICKS_PER_PERIOD", "GossipSampler", "Newscast", "bootstrap_views", "merge_views"]
