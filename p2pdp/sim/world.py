"""The SimPy world of seed 002: peers, a central group sampler, curators, a completion monitor.

Protocol of one aggregation (the seed's Algorithms 1 and 2, with DESIGN.md's fixes):

1. The group sampler (:mod:`p2pdp.sim.sampler`; by default the seed's GroupAgent,
   :class:`~p2pdp.sim.central.CentralSampler`) draws ``g`` peers uniformly at random
   from the idle peers whose remaining budget covers one more aggregation, picks the curator
   uniformly among them, and sends each member an ``ASSIGN`` message.
2. A member that receives ``ASSIGN`` sends its local model and shard size to the curator.
   (With secure aggregation, members exchange additive shares instead and the curator only
   receives partial sums; see :mod:`p2pdp.secure_aggregation`.)
3. The :func:`curator_process` waits until all ``g`` models arrived (or ``collect_timeout``
   passes: the group is aborted and nobody is charged, since nothing was released), averages
   them, calibrates the noise on the group's sensitivity, **checks** every member's budget,
   draws the noise, releases the model and **spends** every member's budget.
4. The published model goes to the members (``group`` publication) or, as one broadcast, to
   every peer (``full`` publication). Publication is post-processing: it costs no budget.
5. The :class:`CompletionMonitor` (the seed's CompletionAgent) ends the run when fewer than
   ``g`` peers can still afford an aggregation and no group is in flight.

The noise draws come from a dedicated stream, so the same seed gives the same models whatever
the publication mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from p2pdp.accounting import BudgetLedger
from p2pdp.config import ScenarioConfig
from p2pdp.learning import GRADIENT_TOLERANCE
from p2pdp.mechanisms import Mechanism, group_sensitivity
from p2pdp.secure_aggregation import draw_noise_shares, secure_noisy_mean
from p2pdp.sim.central import CentralSampler
from p2pdp.sim.sampler import GroupSampler
from p2pdp.sim.transport import HEADER_BYTES, Transport, model_bytes

SAMPLER = -1  # sender id of the central sampler

ASSIGN = "assign"
SUBMIT = "submit"
SHARE = "share"  # secure aggregation: one additive share of a member's masked contribution
PARTIAL = "partial"  # secure aggregation: a member's sum of the shares it received
PUBLISH = "publish"


@dataclass(slots=True)
class Message:
    kind: str
    sender: int
    group: int
    payload: object = None


@dataclass(slots=True)
class Group:
    """An aggregation in flight: members, curator, and what the curator has received."""

    group_id: int
    members: np.ndarray
    curator: int
    total: np.ndarray | float = 0.0  # running sum of the received models
    sizes: list[int] = field(default_factory=list)
    complete: simpy.Event | None = None
    shares_received: dict[int, int] = field(default_factory=dict)  # secure aggregation
    partials: int = 0  # secure aggregation: partial sums the curator holds


class Peer:
    """A peer: reacts to the messages delivered to it.

    A message is handled when its delivery event fires (:meth:`receive`, an actor served by
    the event loop) rather than through a :class:`simpy.Store` and a waiting process: one
    event per message instead of three, which is what lets 100,000 peers run in a minute.
    The peer's model and shard size are row ``peer_id`` of the world's arrays, its budget row
    ``peer_id`` of the shared, vectorised :class:`BudgetLedger`, and its ensemble the world's
    receipt log. A peer with simulated training time runs a SimPy process that makes it
    available to the group sampler only when its training is done.
    """

    __slots__ = ("peer_id", "world")

    def __init__(self, world: World, peer_id: int, ready_at: float) -> None:
        self.world = world
        self.peer_id = peer_id
        if ready_at > 0:
            world.env.process(self.train(ready_at))

    def train(self, seconds: float):
        yield self.world.env.timeout(seconds)  # simulated local training
        self.world.sampler.peer_ready(self.peer_id)

    def receive(self, message: Message) -> None:
        world = self.world
        if not world.online[self.peer_id]:  # arrived while this peer was offline
            world.transport.messages_lost += 1
        elif message.kind == ASSIGN:
            world.submit(self.peer_id, message.payload)
        elif message.kind == SUBMIT:
            world.receive_submission(message)
        elif message.kind == SHARE:
            world.receive_share(self.peer_id, message)
        elif message.kind == PARTIAL:
            world.receive_partial(message)
        elif message.kind == PUBLISH:
            world.receipts.append((self.peer_id, message.payload))


class CompletionMonitor:
    """The seed's CompletionAgent: counts published aggregations and records the end."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.aggregations = 0
        self.aborted = 0
        self.end_time = 0.0
        self.stop_reason = ""
        world.env.process(self.run())

    def notify(self, *, published: bool) -> None:
        if published:
            self.aggregations += 1
        else:
            self.aborted += 1

    def run(self):
        self.stop_reason = yield self.world.sampler.done
        self.end_time = float(self.world.env.now)


class NoiseStream:
    """Noise for one run, drawn in batches of unit-sensitivity vectors.

    Every mechanism here is a scale family in the sensitivity: noise for ``Delta_2`` is
    ``Delta_2`` times noise for sensitivity 1 (vector Laplace: Gamma norm scale ``Delta/eps``;
    coordinate Laplace: scale ``sqrt(d) Delta/eps``; Gaussian: the analytic ``sigma`` is
    proportional to ``Delta``). Drawing a batch of unit vectors and scaling each by its group's
    sensitivity is therefore the same distribution as one call per group, and much faster.
    """

    _BATCH = 256

    def __init__(self, mechanism: Mechanism, dim: int, *, rng: np.random.Generator) -> None:
        self.mechanism = mechanism
        self.dim = dim
        self.rng = rng
        self._unit: list[np.ndarray] = []

    def draw(self, sensitivity: float) -> np.ndarray:
        """One noise vector (dim,) for a release of L2 sensitivity ``sensitivity``."""
        if not self._unit:
            batch = self.mechanism.sample(1.0, self.dim, rng=self.rng, size=self._BATCH)
            self._unit = list(batch[::-1])
        return sensitivity * self._unit.pop()


class World:
    """One simulated network: the environment, transport, peers, sampler, ledger and logs.

    Parameters
    ----------
    config : ScenarioConfig
    local_weights : (P, d) array
        Exact local models (trained before the simulation starts).
    shard_sizes : (P,) int array
    mechanism : Mechanism
        Noise added to every released aggregate, calibrated per group.
    rngs : dict
        Generators ``"protocol"`` (sampling, curator choice), ``"network"`` (latency, loss),
        ``"noise"`` (mechanism draws) and ``"shares"`` (secure-aggregation masks).
    """

    def __init__(
        self,
        config: ScenarioConfig,
        local_weights: np.ndarray,
        shard_sizes: np.ndarray,
        mechanism: Mechanism,
        *,
        rngs: dict[str, np.random.Generator],
    ) -> None:
        self.config = config
        self.env = simpy.Environment()
        self.local_weights = local_weights
        self.shard_sizes = np.asarray(shard_sizes, dtype=np.int64)
        n_peers, dim = local_weights.shape
        self.noise = NoiseStream(mechanism, dim, rng=rngs["noise"])
        self.share_rng = rngs["shares"]
        self.dim = dim
        self.model_bytes = model_bytes(dim)
        privacy = config.privacy
        self.ledger = BudgetLedger(
            n_peers,
            epsilon_total=privacy.epsilon,
            epsilon_per_aggregation=privacy.epsilon_per_aggregation,
            delta_total=privacy.delta,
            delta_per_aggregation=privacy.delta_per_aggregation,
            accountant=privacy.accountant,
        )
        self.transport = Transport(self.env, config.network, n_peers, rng=rngs["network"])
        self.online = np.ones(n_peers, dtype=bool)  # a group sampler with churn updates it
        self.sampler = make_sampler(self, rng=rngs["protocol"])
        self.monitor = CompletionMonitor(self)
        self.groups: dict[int, Group] = {}
        self.published: list[np.ndarray] = []
        self.shared: list[bool] = []
        self.receipts: list[tuple[int, int]] = []
        self._next_group = 0
        ready_at = self.shard_sizes * config.training.seconds_per_row
        self.peers = [Peer(self, j, float(ready_at[j])) for j in range(n_peers)]
        ready = np.flatnonzero(ready_at <= 0).tolist() if self.ledger.max_aggregations else []
        self.sampler.start(ready, int(np.count_nonzero(ready_at > 0)))

    # -- group lifecycle --------------------------------------------------------------------
    def start_group(self, members: np.ndarray, curator: int, *, announce: bool = True) -> Group:
        """Start an aggregation of ``members`` led by ``curator``.

        ``announce``: the central sampler tells every member its group with an ``ASSIGN``
        message; a decentralised protocol whose members already agreed passes False and the
        members submit at once.
        """
        group = Group(self._next_group, members, curator, complete=self.env.event())
        self._next_group += 1
        self.groups[group.group_id] = group
        for member in members.tolist():
            if announce:
                message = Message(ASSIGN, SAMPLER, group.group_id, group)
                self.transport.send(SAMPLER, self.peers[member].receive, message, HEADER_BYTES)
            else:
                self.submit(member, group)
        self.env.process(curator_process(self, group))
        return group

    def submit(self, member: int, group: Group) -> None:
        """``member`` sends its local model and shard size to the group's curator.

        With secure aggregation it instead sends one additive share of its noisy, fixed-point
        encoded contribution to every other member (:mod:`p2pdp.secure_aggregation`).
        An offline (crashed) member sends nothing.
        """
        if not self.online[member]:
            return
        if self.config.privacy.secure_aggregation:
            others = [m for m in group.members.tolist() if m != member]
            for other in others:
                message = Message(SHARE, member, group.group_id)
                self.transport.send(member, self.peers[other].receive, message, self.model_bytes)
            if not others:  # a group of one: its own contribution is its partial sum
                self._partial_ready(member, group)
            return
        reply = Message(
            SUBMIT,
            member,
            group.group_id,
            (self.local_weights[member], int(self.shard_sizes[member])),
        )
        if member == group.curator:  # the curator holds its own model: no message
            self.receive_submission(reply)
        else:
            curator = self.peers[group.curator]
            self.transport.send(member, curator.receive, reply, self.model_bytes)

    def receive_submission(self, message: Message) -> None:
        group = self.groups.get(message.group)
        if group is None:  # the group already timed out
            return
        model, size = message.payload
        group.total = group.total + model
        group.sizes.append(size)
        if len(group.sizes) == len(group.members):
            group.complete.succeed()

    def receive_share(self, member: int, message: Message) -> None:
        """Secure aggregation: once a member holds a share from every other member (its own
        share it keeps), it sends their sum, its partial sum, to the curator."""
        group = self.groups.get(message.group)
        if group is None:
            return
        count = group.shares_received.get(member, 0) + 1
        group.shares_received[member] = count
        if count == len(group.members) - 1:
            self._partial_ready(member, group)

    def _partial_ready(self, member: int, group: Group) -> None:
        if member == group.curator:
            self.receive_partial(Message(PARTIAL, member, group.group_id))
        else:
            message = Message(PARTIAL, member, group.group_id)
            self.transport.send(
                member, self.peers[group.curator].receive, message, self.model_bytes
            )

    def receive_partial(self, message: Message) -> None:
        group = self.groups.get(message.group)
        if group is None:
            return
        group.partials += 1
        if group.partials == len(group.members):
            group.sizes = self.shard_sizes[group.members].tolist()  # known inside the group
            group.complete.succeed()

    def publish(self, group: Group, model: np.ndarray) -> None:
        """Release ``model`` to the group or to everyone (post-processing: no budget)."""
        index = len(self.published)
        self.published.append(model)
        if self.config.publication.mode == "full":
            everyone = bool(self.online.all())
            recipients = [] if everyone else np.flatnonzero(self.online).tolist()
            self.shared.append(everyone)

            def deliver() -> None:  # offline peers miss a broadcast
                self.receipts.extend((peer, index) for peer in recipients)

            n_recipients = len(self.peers) if everyone else len(recipients)
            self.transport.broadcast(group.curator, n_recipients - 1, self.model_bytes, deliver)
            return
        self.shared.append(False)
        for member in group.members.tolist():
            if member == group.curator:  # the curator already holds the model
                self.receipts.append((member, index))
                continue
            message = Message(PUBLISH, group.curator, group.group_id, index)
            self.transport.send(
                group.curator, self.peers[member].receive, message, self.model_bytes
            )

    def secure_release(self, group: Group, sensitivity: float) -> np.ndarray:
        """The arithmetic of the secure round whose messages the transport has carried.

        Every member adds its noise share to ``w_i / K`` (any K - 1 shares carry the
        mechanism's full noise), encodes it in fixed point, splits it into additive shares
        mod 2^64; the curator adds the partial sums and decodes only the noisy mean.
        """
        members = group.members
        shares = draw_noise_shares(
            self.noise.mechanism,
            sensitivity=sensitivity,
            n_members=len(members),
            dim=self.dim,
            rng=self.noise.rng,
        )
        curator_index = int(np.flatnonzero(members == group.curator)[0])
        result = secure_noisy_mean(
            self.local_weights[members], shares, curator=curator_index, rng=self.share_rng
        )
        return result.total

    def finish_group(self, group: Group, *, published: bool) -> None:
        del self.groups[group.group_id]
        self.monitor.notify(published=published)
        self.sampler.group_finished(group, published=published)

    def run(self) -> None:
        """Run until no group can form and every message in flight has been delivered."""
        self.env.run()


def make_sampler(world: World, *, rng: np.random.Generator) -> GroupSampler:
    """The group sampler ``world.config.groups.sampler`` names."""
    if world.config.groups.sampler == "gossip":
        from p2pdp.sim.gossip import GossipSampler  # imports networkx: only when used

        return GossipSampler(world, rng=rng)
    return CentralSampler(world, rng=rng)


def curator_process(world: World, group: Group):
    """The seed's Algorithm 1 run by the group's curator, as a SimPy process."""
    env = world.env
    yield group.complete | env.timeout(world.config.groups.collect_timeout)
    if not group.complete.triggered or not world.online[group.curator]:
        # a message was lost or the curator crashed: abort, nothing released, nobody charged
        world.finish_group(group, published=False)
        return
    privacy = world.config.privacy
    sensitivity = group_sensitivity(
        group.sizes,
        world.config.training.lam,
        mode=privacy.sensitivity,
        gradient_tolerance=GRADIENT_TOLERANCE,
    )
    world.ledger.check(group.members)  # before any noise is drawn
    if privacy.secure_aggregation:
        noisy = world.secure_release(group, sensitivity)
    else:
        noisy = group.total / len(group.sizes) + world.noise.draw(sensitivity)
    world.ledger.spend(group.members)  # the release happens now
    world.publish(group, noisy)
    world.finish_group(group, published=True)
