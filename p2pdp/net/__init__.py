"""The network runtime: the same one-shot protocol between real OS processes over TCP.

``p2pdp run SCENARIO --runtime network`` (or ``simulate(..., runtime="network")``) starts the
peers as OS processes on this machine, several peers per process, each peer on its own
listening socket, and runs the transport-free state machine of one aggregation
(:mod:`p2pdp.protocols.groups`) that the SimPy world runs in simulation:
:mod:`p2pdp.net.wire` is the frame format (msgpack), :mod:`p2pdp.net.host` the peers
(:mod:`~p2pdp.net.connections` their sockets, :mod:`~p2pdp.net.host_process` one host
process, :mod:`~p2pdp.net.hosts` what hosts and coordinator share),
:mod:`p2pdp.net.coordinator` the central sampler (:mod:`~p2pdp.net.control` the hosts'
control frames, :mod:`~p2pdp.net.bookkeeping` the run's counts); :mod:`~p2pdp.net.failures`
ends a party's run at a fault of its own code. Gossip formation:
:mod:`~p2pdp.net.gossip_host` (a host's peers), :mod:`~p2pdp.net.gossip_views`,
:mod:`~p2pdp.net.commitments`, :mod:`~p2pdp.net.gossip_coordinator`; the iterative protocols:
:mod:`~p2pdp.net.iterative_host`, :mod:`~p2pdp.net.iterative_coordinator`.
"""
