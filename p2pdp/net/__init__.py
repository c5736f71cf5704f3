"""The network runtime: the same one-shot protocol between real OS processes over TCP.

``p2pdp run SCENARIO --runtime network`` (or ``simulate(..., runtime="network")``) starts the
peers as OS processes on this machine, several peers per process, each peer on its own
listening socket, and runs the transport-free state machine of one aggregation
(:mod:`p2pdp.protocols.groups`) that the SimPy world runs in simulation:
:mod:`p2pdp.net.wire` is the frame format (msgpack), :mod:`p2pdp.net.host` the peers,
:mod:`p2pdp.net.coordinator` the central sampler and the run's bookkeeping.
"""
