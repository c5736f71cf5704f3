"""The SimPy driver of the iterative protocols (:mod:`p2pdp.protocols.iterative`).

The same clock, transport model (latency, bandwidth, loss) and overlay as the one-shot world;
the protocol object holds the peers' models and budgets, this module moves their messages:

* **Synchronous** (``dpsgd``, ``muffliato``): a round lasts ``protocol.round_period``
  simulated seconds, split into ``gossip_steps`` exchanges. In each exchange every peer sends
  its model to each overlay neighbour; :meth:`Transport.exchange
  <p2pdp.sim.transport.Transport.exchange>` draws every message's delay and loss at once, and
  a message that is lost or arrives after the exchange's deadline is not averaged (its weight
  stays on the receiver's own model). One SimPy event per exchange, not per message: the
  messages of an exchange cannot interleave with anything.
* **Asynchronous** (``gossip-learning``): every peer wakes every ``round_period`` seconds
  (a uniform random phase in the first period) and sends its model with
  :meth:`Transport.send <p2pdp.sim.transport.Transport.send>`, one event per message; the
  receiver merges and steps when it arrives. Messages still in flight at the end are dropped.

With ``gossip.churn`` peers alternate online sessions and offline downtimes as in gossip
group formation (:class:`~p2pdp.sim.gossip.faults.Faults`, switches applied at each round's
start): an offline peer takes no step and sends nothing, and a message to an offline peer is
lost. The crash probabilities of ``[gossip]`` belong to group formation and are not used here.

After every round (and before the first) the driver records one row of the ``rounds`` table:
consensus distance, bytes sent so far, steps, epsilon spent, and every ``eval_every`` rounds
(and the last) the mean and worst peer test error (NaN on the other rows).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.protocols.groups import model_bytes
from p2pdp.protocols.iterative import IterativeProtocol
from p2pdp.protocols.network_dp import ViewTrace
from p2pdp.sim.transport import Transport


def consensus_distance(models: np.ndarray) -> float:
    """Mean squared distance of the peers' models to their average: ``mean_i ||w_i - w_bar||^2``."""
    return float(((models - models.mean(axis=0)) ** 2).sum(axis=1).mean())


class _Online:
    """Which peers are online, switched by :class:`~p2pdp.sim.gossip.faults.Faults`."""

    def __init__(self, env: simpy.Environment, n_peers: int) -> None:
        self.env = env
        self.online = np.ones(n_peers, dtype=bool)

    def set_online(self, peers: np.ndarray, online: bool) -> None:
        self.online[peers] = online


def _no_crash() -> float:
    return 1.0  # the crash draws of group formation: never used by the iterative driver


@dataclass(slots=True)
class IterativeRun:
    """What a driver leaves: the transport's counters and one record per round (0 included)."""

    transport: Transport
    rounds: list[dict[str, Any]] = field(default_factory=list)
    end_time: float = 0.0


def run_iterative(
    config: ScenarioConfig,
    protocol: IterativeProtocol,
    *,
    errors: Callable[[np.ndarray], np.ndarray],
    rng: np.random.Generator,
    churn_rng: np.random.Generator | None = None,
    on_round: Callable[[int], None] | None = None,
    trace: ViewTrace | None = None,
) -> IterativeRun:
    """Run ``protocol`` for ``protocol.rounds`` rounds in a SimPy world.

    Parameters
    ----------
    config : ScenarioConfig
        ``[protocol]`` (rounds, period, eval_every) and ``[network]`` (the transport).
    protocol : IterativeProtocol
        Its peers' state is updated in place.
    errors : callable
        (P, d) models -> (P,) test error of each peer's model (for the ``rounds`` table).
    rng : numpy.random.Generator
        The network's stream (latencies, losses, wake-up phases).
    churn_rng : numpy.random.Generator, optional
        The churn's stream (sessions, downtimes; default ``rng``).
    on_round : callable, optional
        Called with each round's number once it is recorded (progress).
    trace : ViewTrace, optional
        Receives, for a synchronous protocol, the peers of every step and the delivered and
        late messages of every exchange (for :mod:`p2pdp.protocols.network_dp`).

    Raises
    ------
    ConfigError
        Naming ``protocol.step_size`` when a model stops being finite (the steps diverge).
    """
    settings = config.protocol
    env = simpy.Environment()
    n_peers = protocol.problem.n_peers
    transport = Transport(env, config.network, n_peers, rng=rng)
    run = IterativeRun(transport=transport)
    state = _Online(env, n_peers)
    online = state.online
    faults = None
    if config.gossip.churn:
        from p2pdp.sim.gossip.faults import Faults

        faults = Faults(state, config.gossip, uniform=_no_crash, rng=churn_rng or rng)
    n_bytes = model_bytes(protocol.models.shape[1])
    epsilon = protocol.privacy.epsilon

    def record(round_: int) -> None:
        if not np.isfinite(protocol.models).all():
            raise ConfigError(
                f"protocol.step_size = {settings.step_size!r}: the {protocol.name} models "
                f"diverged by round {round_} (values no longer finite); lower the step size"
            )
        if on_round is not None:
            on_round(round_)
        evaluated = round_ % settings.eval_every == 0 or round_ == settings.rounds
        peer_errors = errors(protocol.models) if evaluated else None
        run.rounds.append(
            {
                "round": round_,
                "time": float(env.now),
                "mean_error": float(peer_errors.mean()) if peer_errors is not None else np.nan,
                "worst_error": float(peer_errors.max()) if peer_errors is not None else np.nan,
                "consensus_distance": consensus_distance(protocol.models),
                "bytes_sent": int(transport.bytes_sent.sum()),
                "messages_lost": transport.messages_lost + transport.messages_late,
                "mean_steps": float(protocol.steps.mean()),
                "epsilon_spent": float(epsilon(protocol.steps).max()),
            }
        )

    def exchange(
        senders: np.ndarray, receivers: np.ndarray, within: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """One message along every edge whose sender is online: which arrive in time, which
        late (read by the receiver, not averaged)."""
        if faults is None:
            return transport.exchange(senders, n_bytes, within=within)
        sending = online[senders]
        delivered = np.zeros(senders.size, dtype=bool)
        late = np.zeros(senders.size, dtype=bool)
        delivered[sending], late[sending] = transport.exchange(
            senders[sending], n_bytes, within=within
        )
        missed = delivered & ~online[receivers]  # the receiver is offline: lost
        transport.lose(senders[missed])
        return delivered & ~missed, late

    def synchronous() -> Generator[simpy.Event, Any, None]:
        exchanges = protocol.gossip_steps
        period = settings.round_period / exchanges
        senders, receivers = protocol.mixing.indices, protocol.mixing.receivers
        for round_ in range(1, settings.rounds + 1):
            if faults is None:
                stepped = protocol.step()
            else:
                faults.apply_churn()
                stepped = protocol.step(np.flatnonzero(online))
            if trace is not None:
                trace.step(stepped)
            for _ in range(exchanges):
                delivered, late = exchange(senders, receivers, period)
                yield env.timeout(period)
                protocol.average(delivered)
                if trace is not None:
                    trace.exchange(delivered, late)
            record(round_)

    def wake_ups(peer: int, phase: float) -> Generator[simpy.Event, Any, None]:
        yield env.timeout(phase)
        while True:
            target = protocol.wake(peer) if online[peer] else None
            if target is not None:
                message = (peer, target, protocol.models[peer].copy())
                transport.send(peer, deliver, message, n_bytes)
            yield env.timeout(settings.round_period)

    def deliver(message: tuple[int, int, np.ndarray]) -> None:
        sender, target, model = message
        if online[target]:
            protocol.receive(target, model)
        else:
            transport.lose(sender)

    def clock() -> Generator[simpy.Event, Any, None]:
        for round_ in range(1, settings.rounds + 1):
            yield env.timeout(settings.round_period)
            record(round_)
            if faults is not None:
                faults.apply_churn()

    record(0)
    if faults is not None and not protocol.synchronous:
        faults.apply_churn()
    if protocol.synchronous:
        env.process(synchronous())
        env.run()
    else:
        phases = rng.uniform(0.0, settings.round_period, size=protocol.problem.n_peers)
        for peer, phase in enumerate(phases.tolist()):
            env.process(wake_ups(peer, phase))
        env.process(clock())
        env.run(until=settings.rounds * settings.round_period + 1e-9)
    run.end_time = float(env.now)
    return run
