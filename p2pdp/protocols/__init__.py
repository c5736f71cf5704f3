"""Protocols: how peers learn from what they receive (``protocol.name``).

``one-shot`` (:class:`OneShot`, the default) is the source document's protocol: every peer
trains once, groups release noisy averages of fixed models, and no peer updates its model from
what it received. Its parties (member, curator, central sampler) are the transport-free
machines of :mod:`p2pdp.protocols.oneshot`, one aggregation's messages those of
:mod:`p2pdp.protocols.groups`; the SimPy world of :mod:`p2pdp.sim.world`, the batched drivers
of :mod:`p2pdp.sim.waves` and the network runtime of :mod:`p2pdp.net` drive them. Gossip
group formation (``groups.sampler = "gossip"``) is another, :mod:`p2pdp.protocols.gossip`,
driven in simulation by :mod:`p2pdp.sim.gossip.formation`. The iterative protocols of
:mod:`p2pdp.protocols.iterative` keep a model per peer and update it from what arrives:

``dpsgd``
    D-PSGD (Lian et al. 2017) with local DP: each round every peer takes one private local
    step, sends the result to its overlay neighbours and averages what it received with
    Metropolis-Hastings weights (:mod:`p2pdp.protocols.mixing`); its rows, like
    ``muffliato``'s, add the pairwise network DP bound. With
    ``protocol.pairwise_noise_multiplier > 0`` neighbours add correlated noise that cancels
    in the network average; its rows add the exact epsilon per threat model
    (:mod:`p2pdp.protocols.correlated_dp`).
``muffliato``
    Noise-then-gossip (Cyffers et al. 2022): a private step, then ``protocol.gossip_steps``
    averagings; its rows add the pairwise network DP bound (:mod:`p2pdp.protocols.network_dp`)
    beside local DP.
``gossip-learning``
    Ormandi, Hegedus & Jelasity 2013: every ``round_period`` each peer sends its model to a
    random neighbour; a peer merges (averages) each model it receives with its own, then takes
    a private step. Asynchronous: one SimPy event per message.

A protocol object holds the peers' state (models, steps taken) as arrays and never touches
SimPy or the transport: the driver (:mod:`p2pdp.sim.iterative`) calls it and moves its
messages. One peer of it alone is a transport-free machine,
:mod:`p2pdp.protocols.iterative_peer`, which the per-peer driver runs (the same rows), with
its own random streams (:mod:`p2pdp.protocols.peer_streams`); both record a run in an
:class:`~p2pdp.protocols.iterative_ledger.IterativeLedger`. Privacy per step:
:mod:`p2pdp.privacy.clipped_gaussian`.

A protocol of your own: an import string ``"package.module:Class"`` for ``protocol.name``,
a subclass of :class:`p2pdp.protocols.iterative.IterativeProtocol` (see its docstring for what
to override).
"""

from __future__ import annotations

import math
from typing import ClassVar

__all__ = ["ITERATIVE_COLUMNS", "OneShot"]


class OneShot:
    """The group protocol of the source document (``protocol.name = "one-shot"``).

    A marker: the SimPy world (:class:`p2pdp.sim.world.World`) runs it (or the network
    runtime); every other setting of ``[protocol]`` is unused. It is also the protocol of the
    tasks that have no ``[protocol]`` table (prevalence, pooled testing).
    """

    name: ClassVar[str] = "one-shot"
    #: The settings the group protocol reads (:mod:`p2pdp.core.reads`): group formation, the
    #: release's budget and mechanism, publication, peers' training time.
    reads: ClassVar[tuple[str, ...]] = (
        "groups.sampler",
        "groups.group_size",
        "groups.max_concurrent_groups",
        "groups.collect_timeout",
        "groups.max_failed_attempts",
        "publication.mode",
        "privacy.epsilon",
        "privacy.epsilon_per_aggregation",
        "privacy.delta",
        "privacy.delta_per_aggregation",
        "privacy.mechanism",
        "privacy.accountant",
        "privacy.secure_aggregation",
        "privacy.noise_multiplier",
        "privacy.min_shard_size",
        "training.seconds_per_row",
    )


#: Columns every results row has (NaN where they do not apply, e.g. one-shot runs):
#: what an iterative run did and what it guarantees beyond ``epsilon_spent`` (local DP);
#: ``network_dp_method`` says how they were computed (``exact``: the semidefinite program's
#: certificate met its feasible point; ``bound``: its certified upper value; "" when empty),
#: ``network_dp_note`` says why an iterative run's network DP columns are empty, and
#: ``correlated_dp_note`` why a ``dpsgd`` run with pair noise has no per-threat-model epsilons;
#: ``central_dp_error`` / ``central_dp_epsilon``: the trusted-curator DP-SGD reference on the
#: pooled rows at the run's budget and relation
#: (:func:`p2pdp.protocols.iterative.central_dp_reference`; NaN for non-private steps).
ITERATIVE_COLUMNS: dict[str, float | str] = {
    "mean_steps_per_peer": math.nan,
    "min_steps_per_peer": math.nan,
    "noise_multiplier_used": math.nan,
    "pairwise_noise_multiplier_used": math.nan,
    "spectral_gap": math.nan,
    "consensus_distance": math.nan,
    "network_dp_epsilon_mean": math.nan,
    "network_dp_epsilon_max": math.nan,
    "network_dp_epsilon_max_beyond_neighbours": math.nan,
    "network_dp_method": "",
    "network_dp_note": "",
    "correlated_dp_eavesdropper_epsilon": math.nan,
    "correlated_dp_curious_peer_epsilon": math.nan,
    "correlated_dp_note": "",
    "central_dp_error": math.nan,
    "central_dp_epsilon": math.nan,
}
