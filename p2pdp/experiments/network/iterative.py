"""The iterative protocols (D-PSGD, Muffliato) on the network runtime: the experiment's side.

:func:`run_on_network` is what :func:`~p2pdp.experiments.run.iterative.simulate_iterative` calls
instead of the SimPy driver with ``runtime = "network"``: it starts the cell's hosts
(given by :func:`~p2pdp.experiments.network.launch.network_session`: the run's host processes,
each cell a session of its own) and coordinates them (:class:`~p2pdp.net.iterative_coordinator.
IterativeNetworkWorld`). Each host process runs :func:`iterative_host_main`: its own peers'
rows (from its shard file, ``p2pdp split``, or derived from the seed as the simulator does:
the simulation shortcut), the overlay (public, from the seed), one machine per peer
(:class:`~p2pdp.net.iterative_host.SyncPeer`), served by
:func:`~p2pdp.net.iterative_host.serve_iterative`.

``protocol.round_period`` is wall seconds on the network (a simulated second is a wall
second, as ``groups.collect_timeout`` is on the one-shot runtime): a round's exchanges end
at wall-clock deadlines, and a model that misses one is late.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError, P2PDPError
from p2pdp.core.rng import generator
from p2pdp.learning.local_problem import LocalProblem, gradient_model
from p2pdp.net.hosts import EXPLAINED, HostError, HostSettings, Ticket, hosts_of
from p2pdp.net.iterative_coordinator import IterativeNetworkWorld, IterativeTransport
from p2pdp.net.iterative_host import IterativeSettings, Machine, serve_iterative
from p2pdp.net.pair_keys import PairKeys, session_id
from p2pdp.net.wire import ProtocolError
from p2pdp.protocols.groups import model_bytes
from p2pdp.protocols.iterative import StepPrivacy, applied_pair_noise, step_privacy
from p2pdp.protocols.iterative_peer import GossipPeer, SynchronousPeer, make_peer
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.peer_streams import StreamSeeds
from p2pdp.protocols.views import ViewTrace
from p2pdp.sim.iterative import consensus_distance

__all__ = [
    "NetworkIterativeRun",
    "iterative_host_main",
    "run_on_network",
]

#: Seconds any wait for a frame's body, a connection or a host's report may take.
TIMEOUT = 10.0


def _mixing(config: ScenarioConfig, fold: int, repetition: int) -> Mixing:
    """The cell's overlay weights, from the seed (public: every party builds the same)."""
    from p2pdp.sim.overlay import build_overlay

    n_peers = config.partition.n_peers
    overlay = build_overlay(
        config.gossip, n_peers, rng=generator(config.seed, "overlay", fold, repetition)
    )
    return Mixing.metropolis_hastings(overlay.indptr, overlay.indices)


def _exchanges(config: ScenarioConfig) -> int:
    """Averagings per round: Muffliato's ``protocol.gossip_steps``, else 1."""
    protocol = config.protocol
    return protocol.gossip_steps if protocol.name == "muffliato" else 1


def pair_noise(config: ScenarioConfig, privacy: StepPrivacy) -> float:
    """D-PSGD's ``z_p`` as applied (0: no pair noise, no key agreement)."""
    if config.protocol.name != "dpsgd":
        return 0.0
    return applied_pair_noise(config.protocol, privacy.mechanism)


def _settings(
    config: ScenarioConfig,
    hosts: int,
    allowed: tuple[str, ...],
    dim: int,
    privacy: StepPrivacy,
) -> tuple[IterativeSettings, HostSettings]:
    """(IterativeSettings, HostSettings) of a cell: the rounds' timing, and the session's."""
    protocol = config.protocol
    exchanges = _exchanges(config)
    run = protocol.rounds * protocol.round_period
    iterative = IterativeSettings(
        n_peers=config.partition.n_peers,
        hosts=hosts,
        rounds=protocol.rounds,
        exchanges=exchanges,
        period=protocol.round_period,
        dim=dim,
        timeout=TIMEOUT,
        idle_timeout=run + 6 * TIMEOUT,  # the control connection is silent at most a run
        allowed=allowed,
        pair_keys=pair_noise(config, privacy) > 0,
    )
    session = HostSettings(
        n_peers=config.partition.n_peers,
        hosts=hosts,
        full_publication=False,
        timeout=TIMEOUT,
        idle_timeout=run + 6 * TIMEOUT,
        seeded_noise=config.network.seeded_noise,
        allowed=allowed,
    )
    return iterative, session


@dataclass
class NetworkIterativeRun:
    """What a network run leaves (as :class:`~p2pdp.sim.iterative.IterativeRun`, and the
    peers' state the simulator keeps in the protocol object)."""

    transport: IterativeTransport
    rounds: list[dict[str, Any]]
    end_time: float
    models: np.ndarray
    steps: np.ndarray
    trace: ViewTrace
    wire: list[dict[str, Any]]
    hosts_lost: int

    @property
    def messages_lost(self) -> int:
        """Models not averaged: lost or late (the row's ``messages_lost``, as simulated)."""
        return self.transport.messages_lost + self.transport.messages_late


def run_on_network(
    config: ScenarioConfig,
    mixing: Mixing,
    privacy: StepPrivacy,
    *,
    session: dict[str, Any],
    dim: int,
    errors: Any,
) -> NetworkIterativeRun:
    """Run one cell of an iterative protocol between host processes.

    Parameters
    ----------
    config : ScenarioConfig
    mixing : Mixing
        The cell's overlay weights (the hosts build the same from the seed).
    privacy : StepPrivacy
        The step's mechanism and accountant (the ``epsilon_spent`` of the rounds table).
    session : dict
        The cell's hosts (:func:`~p2pdp.experiments.network.launch.network_session`).
    dim : int
        A model's length d.
    errors : callable
        (P, d) models -> (P,) test errors (the experimenter's measurement).
    """
    session = dict(session)
    allowed = session.pop("allowed")
    iterative, host_settings = _settings(config, session["hosts"], allowed, dim, privacy)
    settings = config.protocol

    def record(round_: int, now: float, world: IterativeNetworkWorld) -> dict[str, Any]:
        models = world.models
        if not np.isfinite(models).all():
            raise ConfigError(
                f"protocol.step_size = {settings.step_size!r}: the {settings.name} models "
                f"diverged by round {round_} (values no longer finite); lower the step size"
            )
        evaluated = round_ % settings.eval_every == 0 or round_ == settings.rounds
        peer_errors = errors(models) if evaluated else None
        sent, missed = world.counts(round_)
        return {
            "round": round_,
            "time": now,
            "mean_error": float(peer_errors.mean()) if peer_errors is not None else np.nan,
            "worst_error": float(peer_errors.max()) if peer_errors is not None else np.nan,
            "consensus_distance": consensus_distance(models),
            "bytes_sent": sent * model_bytes(iterative.dim),
            "messages_lost": missed,
            "mean_steps": float(world.records.steps.mean()),
            "epsilon_spent": float(privacy.epsilon(world.records.steps).max()),
        }

    world = IterativeNetworkWorld(
        config,
        mixing=mixing,
        iterative=iterative,
        record=record,
        settings=host_settings,
        **session,
    )
    world.run()
    return NetworkIterativeRun(
        transport=world.transport_counts,
        rounds=world.rounds,
        end_time=world.end_time,
        models=world.models,
        steps=world.records.steps,
        trace=world.trace() if not world.gossip else ViewTrace(),
        wire=world.wire_rows(),
        hosts_lost=len(world.lost_hosts),
    )


def _own_rows(
    config: ScenarioConfig, fold: int, repetition: int, host: int, hosts: int, data: str | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """Host ``host``'s peers (m,), their training rows X (n, d) and labels y (n,), and one
    index array into them per peer: from its shard file ``data``, else from the whole fold
    derived from the seed (the simulation shortcut)."""
    from p2pdp.experiments.network.shards import read_host_shards
    from p2pdp.tasks import make_task, prepared

    if data is not None:
        rows = read_host_shards(
            data, config, host=host, hosts=hosts, fold=fold, repetition=repetition
        )
        return rows.peers, rows.X, rows.y, rows.shards
    trained = prepared(make_task(config), fold=fold, repetition=repetition)
    peers = np.flatnonzero(hosts_of(config.partition.n_peers, hosts) == host)
    shards = tuple(trained.shards[int(p)] for p in peers)
    return peers, trained.fold.X_train, trained.fold.y_train, shards


def _machines(
    config: ScenarioConfig,
    peers: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    shards: tuple[np.ndarray, ...],
    mixing: Mixing,
    privacy: StepPrivacy,
    seeds: StreamSeeds,
) -> tuple[dict[int, Machine], dict[tuple[int, int], int]]:
    """This host's machines, one per peer over its own shard with its own streams from
    ``seeds`` (:func:`~p2pdp.protocols.iterative_peer.make_peer`), and the overlay edges
    into them: ``(sender, receiver) -> edge``."""
    protocol = config.protocol
    exchanges = _exchanges(config)
    # a peer's public step denominator: its own only (its neighbours' come with their keys)
    denominators = np.full(config.partition.n_peers, np.nan)
    machines: dict[int, Machine] = {}
    kind: Literal["synchronous", "gossip"] = (
        "gossip" if protocol.name == "gossip-learning" else "synchronous"
    )
    edges: dict[tuple[int, int], int] = {}
    model = gradient_model(config.training.model, protocol.name)
    for peer, shard in zip(peers.tolist(), shards, strict=True):
        problem = LocalProblem.from_shards(X, y, (shard,), config.training.lam, model)
        denominators[peer] = privacy.mechanism.denominators(problem.sizes)[0]
        machine = make_peer(
            kind,
            peer,
            settings=protocol,
            privacy=privacy,
            problem=problem,
            mixing=mixing,
            denominators=denominators,
            seeds=seeds,
            exchanges=exchanges,
        )
        assert isinstance(machine, SynchronousPeer | GossipPeer)
        machines[peer] = machine
        for edge in range(int(mixing.indptr[peer]), int(mixing.indptr[peer + 1])):
            edges[(int(mixing.indices[edge]), peer)] = edge
    return machines, edges


def phases_of(config: ScenarioConfig, fold: int, repetition: int) -> np.ndarray:
    """(P,) gossip learning's wake-up phases in ``[0, round_period)``: the simulator's draw
    from the run's ``network`` stream (a public schedule, not a secret)."""
    rng = generator(config.seed, "network", fold, repetition)
    n_peers = config.partition.n_peers
    return rng.uniform(0.0, config.protocol.round_period, size=n_peers)


def seeds_of(config: ScenarioConfig, fold: int, repetition: int) -> StreamSeeds:
    """The roots of a host's peers' streams: the run's seeded streams (as the simulator's,
    ``network.seeded_noise``: NOT private) or the operating system's CSPRNG."""
    if config.network.seeded_noise:
        names = ("noise", "sampling", "gossip", "pairs")
        return StreamSeeds.from_rngs(
            {name: generator(config.seed, name, fold, repetition) for name in names}
        )
    return StreamSeeds.fresh()


def iterative_host_main(
    config: ScenarioConfig,
    fold: int,
    repetition: int,
    host: int,
    hosts: int,
    ticket: Ticket,
    *,
    coordinator: str = "127.0.0.1",
    address: str = "127.0.0.1",
    allowed: tuple[str, ...] = (),
    data: str | None = None,
) -> None:
    """Host process ``host`` of ``hosts``, one iterative cell (see the module docstring);
    a one-line error (exit status EXPLAINED) for what the host cannot do."""
    try:
        peers, X, y, shards = _own_rows(config, fold, repetition, host, hosts, data)
        mixing = _mixing(config, fold, repetition)
        privacy = step_privacy(config)
        iterative, _ = _settings(config, hosts, allowed, X.shape[1], privacy)
        seeds = seeds_of(config, fold, repetition)
        machines, edges = _machines(config, peers, X, y, shards, mixing, privacy, seeds)
        pair_keys = None
        if iterative.pair_keys:  # each peer's X25519 key pair, made here, kept here
            pair_keys = PairKeys(
                machines,
                mixing,
                hosts_of(config.partition.n_peers, hosts),
                session=session_id(ticket.authority),
                denominators={p: float(m.denominator[0]) for p, m in machines.items()},
                pair_noise_multiplier=pair_noise(config, privacy),
                clip_norm=privacy.mechanism.clip_norm,
                seeds=seeds if config.network.seeded_noise else None,
            )
    except P2PDPError as error:
        print(f"p2pdp host {host}: {error}", file=sys.stderr)
        sys.exit(EXPLAINED)
    # gossip learning: the simulator's wake-up phases (public) and its constant latency
    gossip = config.protocol.name == "gossip-learning"
    phases = phases_of(config, fold, repetition) if gossip else None
    try:
        asyncio.run(
            serve_iterative(
                machines,
                edges,
                iterative,
                host_index=host,
                ticket=ticket,
                coordinator=coordinator,
                address=address,
                phases=phases,
                hold=config.network.latency_mean,
                pair_keys=pair_keys,
            )
        )
    except (HostError, P2PDPError, ProtocolError) as error:
        print(f"p2pdp host {host}: {error}", file=sys.stderr)
        sys.exit(EXPLAINED)
