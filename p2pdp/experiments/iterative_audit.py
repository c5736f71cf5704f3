"""End-to-end audit of the iterative protocols: whole runs, canaries, a neighbour as adversary.

What is audited is the row's claim: the audited peer's local DP ``epsilon_spent`` at
``privacy.delta`` (the composition of the private steps it took, under the step's neighbouring
relation: replace one record of its shard, full sampling).

The experiment (one run; :data:`AUDIT_RUNS` independent runs are pooled, each canary
affecting one run only):

* **Peers and overlay.** :data:`AUDIT_PEERS` peers on a path ``0 - 1 - ...``; peer 0 is
  audited, peer 1, its only neighbour, is the adversary. Loss-free transport with constant
  latency (the defaults), so the adversary knows what peer 0 received (only its own messages)
  and in which order.
* **Canaries.** Peer 0's shard holds, besides ordinary records, ``m`` canaries: canary ``k``
  is ``x = e_k`` on a coordinate no other record uses, with label ``S_k = +1`` or ``-1``
  (probability 1/2 each, drawn independently). The two states of a canary are neighbouring
  shards under the claimed relation (one record replaced); the shard size does not change.
  Its logistic gradient is ``-S_k sigmoid(-S_k w_k) e_k``, of norm above the clipping norm
  while ``|w_k| < ln(1 / C - 1)``, so its clipped gradient is ``-S_k C e_k`` and the two
  states move the step's sum by ``2 C``, the full sensitivity.
* **The adversary** sees exactly what peer 1 receives over the run: every model peer 0 sends
  it. Knowing its own models (what peer 0 merged), the mixing weights, the step size,
  lambda, the step count and peer 0's shard size (public), it removes from each received model
  what it can predict; what is left is ``-step_size / n_0`` times peer 0's noisy clipped sums
  since the previous message (exactly one step's for ``dpsgd`` and ``muffliato``; a weighted
  sum of the steps taken between two sends for ``gossip-learning``). Canary ``k``'s score is
  the sum of these residuals on coordinate ``k``: the inner product of the updates with the
  canary's clipped-gradient direction.
* **Guesses and bound.** It guesses ``S_k = +1`` for the :data:`AUDIT_GUESS_FRACTION` of the
  canaries with the highest scores, ``-1`` for as many with the lowest, abstains on the rest
  (the fraction is fixed in advance), and :func:`p2pdp.privacy.audit.
  one_run_epsilon_lower_bound` turns its correct guesses into ``eps_lb`` at
  :data:`AUDIT_CONFIDENCE`. ``passed = eps_lb <= claimed``.

Negative controls (the ``-unclipped`` and ``-half-noise`` rows, switched here and nowhere
else): the step sums unclipped gradients (canaries of norm :data:`AUDIT_UNCLIPPED_NORM`, 1000
times the clipping norm) under the noise calibrated for clipped ones; or the noise multiplier
is halved while the accountant keeps charging the calibrated one. Both must fail.

Passing is evidence, not proof: ``eps_lb`` is a lower bound on what this adversary achieves
with these canaries, and a bug that this experiment does not exercise (another relation, a
data-dependent divisor, another sampling) stays invisible.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError, P2PDPError
from p2pdp.core.rng import generator
from p2pdp.core.validation import require_count
from p2pdp.privacy.audit import AuditResult, one_run_epsilon_lower_bound, one_run_guesses
from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.protocols.iterative import IterativeProtocol, LocalProblem, StepPrivacy, step_privacy
from p2pdp.protocols.mixing import Mixing

#: The audited protocols and, for each, its rows: honest, then the two negative controls.
AUDIT_PROTOCOLS: tuple[str, ...] = ("dpsgd", "muffliato", "gossip-learning")
CONTROLS: dict[str, str] = {
    "unclipped": "gradients not clipped",
    "half-noise": "half the calibrated noise",
}
ITERATIVE_AUDIT_NAMES: tuple[str, ...] = tuple(
    f"{protocol}-run{suffix}"
    for protocol in AUDIT_PROTOCOLS
    for suffix in ("", *(f"-{control}" for control in CONTROLS))
)
#: Negative controls of this audit and why they must fail.
ITERATIVE_EXPECTED_TO_FAIL: dict[str, str] = {
    f"{protocol}-run-{control}": reason
    for protocol in AUDIT_PROTOCOLS
    for control, reason in CONTROLS.items()
}

#: Peers on the path: gossip learning's on two, so that peer 0 hears from peer 1 every period
#: and takes the same number of steps in every run (the claim is the most any run took).
AUDIT_PEERS = {"dpsgd": 4, "muffliato": 4, "gossip-learning": 2}
AUDIT_RECORDS = 16  # ordinary records per peer
AUDIT_FEATURES = 4  # their coordinates (the canaries' come after)
AUDIT_CANARIES = 500  # canaries per run
AUDIT_RUNS = 100  # independent runs pooled (50,000 canaries)
AUDIT_GUESS_FRACTION = 0.01  # of the canaries guessed +1, and as many guessed -1
AUDIT_CONFIDENCE = 0.95
AUDIT_UNCLIPPED_NORM = 100.0  # the unclipped control's canary norm (the clipping norm is 0.1)

#: The scenario of the audited runs (privacy.epsilon is the budget; the row's claim is what the
#: audited peer spent of it).
AUDIT_SCENARIO: dict[str, Any] = {
    "training": {"lam": 0.01},
    "privacy": {"mechanism": "gaussian", "epsilon": 2.0, "delta": 1e-5},
    "protocol": {"rounds": 16, "clip_norm": 0.1, "step_size": 1.0, "eval_every": 16},
}
_GOSSIP_STEPS = {"muffliato": 3}  # averagings per round (the others must have 1)


def audit_config(protocol: str) -> ScenarioConfig:
    """The scenario of ``protocol``'s audited runs (:data:`AUDIT_SCENARIO`)."""
    if protocol not in AUDIT_PROTOCOLS:
        raise ConfigError(f"protocol must be one of {AUDIT_PROTOCOLS}, got {protocol!r}")
    settings = {
        **AUDIT_SCENARIO["protocol"],
        "name": protocol,
        "gossip_steps": _GOSSIP_STEPS.get(protocol, 1),
    }
    return ScenarioConfig(**{**AUDIT_SCENARIO, "protocol": settings})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _UnclippedSum(ClippedGaussianSum):
    """Negative control only: the noise of ``clip_norm`` on sums of unclipped vectors."""

    def clip_factors(self, norms: np.ndarray) -> np.ndarray:
        return np.ones(np.shape(norms))


def _controlled(privacy: StepPrivacy, control: str | None) -> StepPrivacy:
    """``privacy`` with the negative control's step; the claim (event, budget) unchanged."""
    mechanism = privacy.mechanism
    if control == "unclipped":
        fields = {f.name: getattr(mechanism, f.name) for f in dataclasses.fields(mechanism)}
        mechanism = _UnclippedSum(**fields)
    elif control == "half-noise":
        mechanism = dataclasses.replace(mechanism, noise_multiplier=mechanism.noise_multiplier / 2)
    return dataclasses.replace(privacy, mechanism=mechanism)


def _path_mixing(n_peers: int) -> Mixing:
    """Metropolis-Hastings weights of the path ``0 - 1 - ... - (n_peers - 1)``."""
    neighbours = [[j for j in (i - 1, i + 1) if 0 <= j < n_peers] for i in range(n_peers)]
    indptr = np.concatenate([[0], np.cumsum([len(row) for row in neighbours])])
    return Mixing.metropolis_hastings(indptr, np.concatenate(neighbours))


def _problem(
    labels: np.ndarray, *, n_peers: int, canary_norm: float, lam: float, rng: np.random.Generator
) -> LocalProblem:
    """Ordinary records (a noisy linear concept on :data:`AUDIT_FEATURES` coordinates, rows
    of norm <= 1) for every peer; peer 0's shard also holds the canaries ``canary_norm e_k``
    with ``labels`` (m,) in {-1, +1}."""
    rows = n_peers * AUDIT_RECORDS
    m = len(labels)
    X = np.zeros((rows + m, AUDIT_FEATURES + m))
    features = rng.normal(size=(rows, AUDIT_FEATURES))
    X[:rows, :AUDIT_FEATURES] = features / np.linalg.norm(features, axis=1, keepdims=True)
    concept = rng.normal(size=AUDIT_FEATURES)
    y = np.where(X[:rows, :AUDIT_FEATURES] @ concept + 0.3 * rng.normal(size=rows) > 0, 1.0, -1.0)
    X[rows:, AUDIT_FEATURES:] = canary_norm * np.eye(m)
    shards = tuple(np.arange(j * AUDIT_RECORDS, (j + 1) * AUDIT_RECORDS) for j in range(n_peers))
    shards = (np.concatenate([shards[0], rows + np.arange(m)]), *shards[1:])
    return LocalProblem.from_shards(X, np.concatenate([y, labels]), shards, lam=lam)


class _Observed(IterativeProtocol):
    """Records what peer 1 (the adversary) receives from peer 0 and what peer 0 received.

    ``sent`` (synchronous): per exchange, peer 0's and peer 1's models as sent. ``events``
    (asynchronous): peer 0's timeline, ``["merge", model, True]`` for each model it received
    from peer 1 and ``["send", model, arrived]`` for each model it sent peer 1 (``arrived``
    set when peer 1 receives it; the latency is constant, so peer 1 knows when it was sent).
    """

    sent: list[tuple[np.ndarray, np.ndarray]]
    events: list[list[Any]]
    _in_flight: list[list[Any]]

    def observe(self) -> None:
        """Start recording (after ``__init__``)."""
        self.sent, self.events, self._in_flight = [], [], []
        indptr, indices = self.mixing.indptr, self.mixing.indices
        self._edges = (  # peer 0's model to peer 1, peer 1's to peer 0
            int(indptr[1] + np.flatnonzero(indices[indptr[1] : indptr[2]] == 0)[0]),
            int(indptr[0]),
        )

    def average(self, delivered: np.ndarray) -> None:
        if not delivered[list(self._edges)].all():
            raise P2PDPError("the audit's transport is loss-free, yet a message was lost")
        self.sent.append((self.models[0].copy(), self.models[1].copy()))
        super().average(delivered)

    def wake(self, peer: int) -> int | None:
        target = super().wake(peer)
        if peer == 0 and target is not None:
            self.events.append(["send", self.models[0].copy(), False])
            self._in_flight.append(self.events[-1])
        return target

    def receive(self, peer: int, model: np.ndarray) -> None:
        if peer == 0:
            self.events.append(["merge", model.copy(), True])
        elif peer == 1 and self._in_flight and np.array_equal(model, self._in_flight[0][1]):
            self._in_flight.pop(0)[2] = True
        super().receive(peer, model)


def adversary_scores(protocol: _Observed, canaries: slice) -> np.ndarray:
    """Peer 1's score of each canary coordinate: the sum of the residuals of peer 0's models.

    Returns
    -------
    (m,) array: ``sum_t residual_t[k]``, in model units (``-step_size / n_0`` times the noisy
    clipped sums; the ``+1`` state of a canary adds ``step_size C / n_0`` per step).
    """
    settings, max_steps = protocol.settings, protocol.privacy.max_steps
    decay = 1.0 - settings.step_size * protocol.problem.lam
    budget = math.inf if max_steps is None else max_steps
    scores = np.zeros(canaries.stop - canaries.start)
    predicted = np.zeros_like(scores)  # peer 0's model on the canary coordinates, as known
    steps = 0
    if protocol.synchronous:
        weight = protocol.mixing.weights[protocol.mixing.indptr[0]]  # W[0, 1]
        per_round = settings.gossip_steps  # public: what the adversary knows
        for exchange, (own, other) in enumerate(protocol.sent):
            own, other = own[canaries], other[canaries]
            if exchange % per_round == 0 and steps < budget:  # a step came before it
                scores += own - decay * predicted
                steps += 1
            predicted = own + weight * (other - own)
        return scores
    stepped = False
    for kind, model, arrived in protocol.events:
        if kind == "merge":
            predicted = (predicted + model[canaries]) / 2
            if steps < budget:
                predicted, steps, stepped = decay * predicted, steps + 1, True
        elif arrived:
            if stepped:
                scores += model[canaries] - predicted
            predicted, stepped = model[canaries], False
    return scores


def audited_run(
    config: ScenarioConfig,
    privacy: StepPrivacy,
    *,
    control: str | None,
    seed: int,
    name: str,
    run: int,
) -> tuple[np.ndarray, np.ndarray, int]:
    """One audited run of ``config`` (from :func:`audit_config`) with the step of ``privacy``.

    Parameters
    ----------
    config : ScenarioConfig
    privacy : StepPrivacy
        The run's step and claim (:func:`~p2pdp.protocols.iterative.step_privacy`);
        ``control`` (None, ``"unclipped"`` or ``"half-noise"``) changes the step, not the
        claim.
    seed, name, run : the random streams are ``(seed, "audit", name, run, stream)``.

    Returns
    -------
    states : (m,) array of -1.0 / +1.0
        The canaries' labels.
    scores : (m,) array
        The adversary's scores (:func:`adversary_scores`).
    steps : int
        Private steps peer 0 took.
    """
    from p2pdp.core.components import resolve
    from p2pdp.sim.iterative import run_iterative

    streams = {key: generator(seed, "audit", name, run, key) for key in (
        "canaries", "data", "network", "noise", "sampling", "gossip")}  # fmt: skip
    labels = np.where(streams["canaries"].random(AUDIT_CANARIES) < 0.5, -1.0, 1.0)
    norm = AUDIT_UNCLIPPED_NORM if control == "unclipped" else 1.0
    n_peers = AUDIT_PEERS[config.protocol.name]
    problem = _problem(
        labels, n_peers=n_peers, canary_norm=norm, lam=config.training.lam, rng=streams["data"]
    )
    cls = resolve("protocol", config.protocol.name, key="protocol.name")
    observed = type(f"Observed{cls.__name__}", (_Observed, cls), {})
    protocol = observed(
        config.protocol,
        problem,
        _path_mixing(n_peers),
        _controlled(privacy, control),
        rngs=streams,
    )
    protocol.observe()
    run_iterative(config, protocol, errors=lambda m: np.zeros(len(m)), rng=streams["network"])
    canaries = slice(AUDIT_FEATURES, AUDIT_FEATURES + AUDIT_CANARIES)
    return labels, adversary_scores(protocol, canaries), int(protocol.steps[0])


def audit_iterative(
    name: str, *, seed: int, runs: int = AUDIT_RUNS, confidence: float = AUDIT_CONFIDENCE
) -> AuditResult:
    """The one-run audit (pooled over ``runs`` runs) of one of :data:`ITERATIVE_AUDIT_NAMES`.

    The claim is the largest ``epsilon_spent`` of peer 0 over the runs (each canary's run is
    at most that private towards it), at ``privacy.delta``.
    """
    if name not in ITERATIVE_AUDIT_NAMES:
        raise ConfigError(f"mechanism must be one of {ITERATIVE_AUDIT_NAMES}, got {name!r}")
    runs = require_count("runs", runs)
    protocol, _, suffix = name.partition("-run")
    config = audit_config(protocol)
    control = suffix.lstrip("-") or None
    privacy = step_privacy(config)
    labels, scores, steps = [], [], 0
    for run in range(runs):
        states, score, taken = audited_run(
            config, privacy, control=control, seed=seed, name=name, run=run
        )
        labels.append(states)
        scores.append(score)
        steps = max(steps, taken)
    states, score = np.concatenate(labels), np.concatenate(scores)
    k = max(1, int(AUDIT_GUESS_FRACTION * states.size))
    plus, minus = one_run_guesses(score, guesses_per_side=k)
    correct = int((states[plus] > 0).sum() + (states[minus] < 0).sum())
    delta = config.privacy.delta
    eps_lb = one_run_epsilon_lower_bound(
        canaries=states.size, guesses=2 * k, correct=correct, delta=delta, confidence=confidence
    )
    claimed = float(privacy.epsilon(np.array([steps]))[0])
    if control == "unclipped":
        guarantee = math.inf
    elif control == "half-noise":  # what the halved noise really guarantees for those steps
        half = _controlled(privacy, control).mechanism
        real = dataclasses.replace(privacy, mechanism=half, event=half.event(), _known={})
        guarantee = float(real.epsilon(np.array([steps]))[0])
    else:
        guarantee = claimed
    return AuditResult(
        mechanism=name,
        epsilon=claimed,
        delta=delta,
        eps_lb=eps_lb,
        passed=eps_lb <= claimed,
        expected_pass=name not in ITERATIVE_EXPECTED_TO_FAIL,
        guarantee_epsilon=guarantee,
        method="one-run",
        canaries=int(states.size),
        confidence=confidence,
    )


def run_iterative_audit(
    names: Sequence[str] = ITERATIVE_AUDIT_NAMES, *, seed: int, runs: int = AUDIT_RUNS
) -> list[AuditResult]:
    """:func:`audit_iterative` of each of ``names``."""
    return [audit_iterative(name, seed=seed, runs=runs) for name in names]
