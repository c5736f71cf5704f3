"""End-to-end audit of the iterative protocols: whole runs, canaries, a neighbour as adversary.

What is audited is the row's claim: the audited peer's local DP ``epsilon_spent`` at
``privacy.delta`` (the composition of the private steps it took, under the step's neighbouring
relation: replace one record of its shard for full sampling; add or remove one for the
``dpsgd-poisson`` rows, D-PSGD with Poisson sampling at :data:`AUDIT_SAMPLING_RATE`).

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
  Under Poisson sampling (add/remove) state ``+1`` is the canary ``e_k`` present, ``-1`` it
  absent (a row of zeros: no gradient, and the step's divisor is public, so it is the same
  output law as a shard without it).
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
  (the fraction is fixed in advance). Full sampling claims ``mu``-GDP (the ``gdp``
  accountant, ``mu = sqrt(steps) / z``): :func:`p2pdp.privacy.audit.one_run_gdp_lower_bound`
  (the f-DP one-run bound, :data:`AUDIT_GUESS_FRACTION_GDP`, 10^6 canaries for the honest
  rows) turns the correct guesses into a lower bound on ``mu`` at :data:`AUDIT_CONFIDENCE`,
  reported as its epsilon ``eps_lb`` at ``privacy.delta``; ``passed`` when that ``mu`` is at
  most the claim's. Poisson sampling claims one ``(epsilon, delta)`` (``pld``):
  :func:`p2pdp.privacy.audit.one_run_epsilon_lower_bound`, ``passed = eps_lb <= claimed``.

Negative controls (switched here and nowhere else): ``-unclipped``, the step sums unclipped
gradients (canaries of norm :data:`AUDIT_UNCLIPPED_NORM`, 1000 times the clipping norm) under
the noise calibrated for clipped ones; ``-half-noise``, the noise multiplier is halved while
the accountant keeps charging the calibrated one; ``-inverted-sampling`` (Poisson), each record
is kept with probability ``1 - q`` while ``q`` is charged. All must fail.

Passing is evidence, not proof: ``eps_lb`` is a lower bound on what this adversary achieves
with these canaries, and a bug that this experiment does not exercise (another relation, a
data-dependent divisor, fixed-size sampling) stays invisible.
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
from p2pdp.learning.local_problem import LocalProblem
from p2pdp.privacy.audit import (
    AuditResult,
    one_run_epsilon_lower_bound,
    one_run_gdp_lower_bound,
    one_run_guesses,
)
from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.privacy.events import GaussianEvent
from p2pdp.privacy.gdp import gdp_epsilon
from p2pdp.protocols.iterative import IterativeProtocol, StepPrivacy, step_privacy
from p2pdp.protocols.mixing import Mixing

#: The audited protocols (full sampling, replace-one, the ``gdp`` accountant's mu-GDP claim).
AUDIT_PROTOCOLS: tuple[str, ...] = ("dpsgd", "muffliato", "gossip-learning")
#: Every audited variant: the protocols, and D-PSGD with Poisson sampling (add/remove, the
#: ``pld`` accountant's claim; :data:`AUDIT_SAMPLING_RATE`).
AUDIT_VARIANTS: tuple[str, ...] = (*AUDIT_PROTOCOLS, "dpsgd-poisson")
CONTROLS: dict[str, str] = {
    "unclipped": "gradients not clipped",
    "half-noise": "half the calibrated noise",
    "inverted-sampling": "records kept w.p. 1 - q, charged q",
}
#: The negative controls of each variant.
_VARIANT_CONTROLS: dict[str, tuple[str, ...]] = {
    **{protocol: ("unclipped", "half-noise") for protocol in AUDIT_PROTOCOLS},
    "dpsgd-poisson": ("inverted-sampling",),
}
ITERATIVE_AUDIT_NAMES: tuple[str, ...] = tuple(
    f"{variant}-run{suffix}"
    for variant in AUDIT_VARIANTS
    for suffix in ("", *(f"-{control}" for control in _VARIANT_CONTROLS[variant]))
)
#: Negative controls of this audit and why they must fail.
ITERATIVE_EXPECTED_TO_FAIL: dict[str, str] = {
    f"{variant}-run-{control}": CONTROLS[control]
    for variant in AUDIT_VARIANTS
    for control in _VARIANT_CONTROLS[variant]
}

#: Peers on the path: gossip learning's on two, so that peer 0 hears from peer 1 every period
#: and takes the same number of steps in every run (the claim is the most any run took).
AUDIT_PEERS = {"dpsgd": 4, "muffliato": 4, "gossip-learning": 2}
AUDIT_RECORDS = 16  # ordinary records per peer
AUDIT_FEATURES = 4  # their coordinates (the canaries' come after)
AUDIT_CANARIES = 500  # canaries per run
AUDIT_RUNS = 100  # independent runs pooled by a negative control and the Poisson row (50,000)
#: Runs pooled by the honest rows of a mu-GDP claim (10^6 canaries, 75-90 s a row): what the
#: f-DP bound needs to catch a 25% noise shortfall (in 20 simulated audits at 0.75 x noise,
#: against the claim's mu 0.502: 5 x 10^5 canaries, smallest bound 0.506, mean 0.544; 10^6,
#: smallest 0.523, mean 0.552; the real run of seed 0, epsilon 2.21 against 2).
AUDIT_RUNS_GDP = 2000
AUDIT_GUESS_FRACTION = 0.01  # of the canaries guessed +1, and as many guessed -1
#: The guess fraction of the f-DP (mu-GDP) bound, at its best around 10^-3 for 10^6 canaries.
AUDIT_GUESS_FRACTION_GDP = 0.001
#: Fewest guesses a side (a fraction of few canaries leaves too few to reject anything): at
#: 50,000 canaries, the smallest of 10 simulated f-DP bounds of a half-noise run was epsilon
#: 2.29 with 50 guesses a side, 2.93 with 250 (the claim: 2).
AUDIT_MIN_GUESSES = 250
#: Poisson sampling rate of the ``dpsgd-poisson`` rows (each peer's shard is at least
#: :data:`AUDIT_RECORDS`, its public ``privacy.min_shard_size``).
AUDIT_SAMPLING_RATE = 0.25
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
    """The scenario of ``protocol``'s audited runs (:data:`AUDIT_SCENARIO`), one of
    :data:`AUDIT_VARIANTS` (``dpsgd-poisson``: D-PSGD at :data:`AUDIT_SAMPLING_RATE`)."""
    if protocol not in AUDIT_VARIANTS:
        raise ConfigError(f"protocol must be one of {AUDIT_VARIANTS}, got {protocol!r}")
    name = protocol.removesuffix("-poisson")
    settings = {
        **AUDIT_SCENARIO["protocol"],
        "name": name,
        "gossip_steps": _GOSSIP_STEPS.get(name, 1),
    }
    privacy = AUDIT_SCENARIO["privacy"]
    if protocol.endswith("-poisson"):
        settings.update(sampling="poisson", sampling_rate=AUDIT_SAMPLING_RATE)
        privacy = {**privacy, "min_shard_size": AUDIT_RECORDS}
    return ScenarioConfig(**{**AUDIT_SCENARIO, "protocol": settings, "privacy": privacy})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _UnclippedSum(ClippedGaussianSum):
    """Negative control only: the noise of ``clip_norm`` on sums of unclipped vectors."""

    def clip_factors(self, norms: np.ndarray) -> np.ndarray:
        return np.ones(np.shape(norms))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _InvertedSampling(ClippedGaussianSum):
    """Negative control only: Poisson sampling that keeps each record with probability
    ``1 - sampling_rate`` (the accountant still charges ``sampling_rate``)."""

    def select(
        self, indptr: np.ndarray, rng: np.random.Generator | Sequence[np.random.Generator]
    ) -> np.ndarray:
        return self.uniforms(indptr, rng) >= self.sampling_rate


def _controlled(privacy: StepPrivacy, control: str | None) -> StepPrivacy:
    """``privacy`` with the negative control's step; the claim (event, budget) unchanged."""
    mechanism = privacy.mechanism
    fields = {f.name: getattr(mechanism, f.name) for f in dataclasses.fields(mechanism)}
    if control == "unclipped":
        mechanism = _UnclippedSum(**fields)
    elif control == "half-noise":
        mechanism = dataclasses.replace(mechanism, noise_multiplier=mechanism.noise_multiplier / 2)
    elif control == "inverted-sampling":
        mechanism = _InvertedSampling(**fields)
    return dataclasses.replace(privacy, mechanism=mechanism)


def _real_guarantee(privacy: StepPrivacy, control: str | None, steps: int) -> float:
    """What ``steps`` steps of the control's mechanism really guarantee (the claim's own
    epsilon without a control; inf for unclipped gradients)."""
    mechanism = privacy.mechanism
    if control == "unclipped":
        return math.inf
    if control == "half-noise":
        mechanism = _controlled(privacy, control).mechanism
    elif control == "inverted-sampling":  # the rate it really samples at
        mechanism = dataclasses.replace(mechanism, sampling_rate=1 - mechanism.sampling_rate)
    real = dataclasses.replace(privacy, mechanism=mechanism, event=mechanism.event(), _known={})
    return float(real.epsilon(np.array([steps]))[0])


def line_mixing(n_peers: int, *, ring: bool = False) -> Mixing:
    """Metropolis-Hastings weights of the path ``0 - 1 - ... - (n_peers - 1)`` (this audit's
    overlay), closed into a ring ``... - (n_peers - 1) - 0`` if ``ring`` (the correlated-noise
    audit's, :mod:`p2pdp.experiments.audit.correlated`)."""
    ends = [(i - 1, i + 1) for i in range(n_peers)]
    if ring:
        neighbours = [sorted({j % n_peers for j in pair}) for pair in ends]
    else:
        neighbours = [[j for j in pair if 0 <= j < n_peers] for pair in ends]
    indptr = np.concatenate([[0], np.cumsum([len(row) for row in neighbours])])
    return Mixing.metropolis_hastings(indptr, np.concatenate(neighbours))


def audit_problem(
    labels: np.ndarray,
    *,
    n_peers: int,
    canary_norm: float | np.ndarray,
    lam: float,
    rng: np.random.Generator,
) -> LocalProblem:
    """Ordinary records (a noisy linear concept on :data:`AUDIT_FEATURES` coordinates, rows
    of norm <= 1) for every peer; peer 0's shard also holds the canaries ``canary_norm e_k``
    (a norm, or one per canary: 0 is a canary absent) with ``labels`` (m,) in {-1, +1}."""
    rows = n_peers * AUDIT_RECORDS
    m = len(labels)
    X = np.zeros((rows + m, AUDIT_FEATURES + m))
    features = rng.normal(size=(rows, AUDIT_FEATURES))
    X[:rows, :AUDIT_FEATURES] = features / np.linalg.norm(features, axis=1, keepdims=True)
    concept = rng.normal(size=AUDIT_FEATURES)
    y = np.where(X[:rows, :AUDIT_FEATURES] @ concept + 0.3 * rng.normal(size=rows) > 0, 1.0, -1.0)
    X[rows:, AUDIT_FEATURES:] = np.diag(np.broadcast_to(canary_norm, m).astype(float))
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

    def average(self, delivered: np.ndarray, late: np.ndarray | None = None) -> None:
        if not delivered[list(self._edges)].all():
            raise P2PDPError("the audit's transport is loss-free, yet a message was lost")
        self.sent.append((self.models[0].copy(), self.models[1].copy()))
        super().average(delivered, late)

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
    norm: float | np.ndarray = AUDIT_UNCLIPPED_NORM if control == "unclipped" else 1.0
    canary_labels = labels
    if privacy.mechanism.sampling == "poisson":  # add/remove: +1 present, -1 absent (a 0 row)
        norm, canary_labels = np.where(labels > 0, norm, 0.0), np.ones_like(labels)
    n_peers = AUDIT_PEERS[config.protocol.name]
    problem = audit_problem(
        canary_labels,
        n_peers=n_peers,
        canary_norm=norm,
        lam=config.training.lam,
        rng=streams["data"],
    )
    cls = resolve("protocol", config.protocol.name, key="protocol.name")
    observed = type(f"Observed{cls.__name__}", (_Observed, cls), {})
    protocol = observed(
        config.protocol,
        problem,
        line_mixing(n_peers),
        _controlled(privacy, control),
        rngs=streams,
    )
    protocol.observe()
    run_iterative(config, protocol, errors=lambda m: np.zeros(len(m)), rng=streams["network"])
    canaries = slice(AUDIT_FEATURES, AUDIT_FEATURES + AUDIT_CANARIES)
    return labels, adversary_scores(protocol, canaries), int(protocol.steps[0])


def audit_iterative(
    name: str, *, seed: int, runs: int | None = None, confidence: float = AUDIT_CONFIDENCE
) -> AuditResult:
    """The one-run audit (pooled over ``runs`` runs) of one of :data:`ITERATIVE_AUDIT_NAMES`.

    The claim is the largest ``epsilon_spent`` of peer 0 over the runs (each canary's run is
    at most that private towards it), at ``privacy.delta``. Full sampling (the ``gdp``
    accountant) claims ``mu``-GDP, ``mu = sqrt(steps) / z``: audited by the f-DP bound
    (:func:`~p2pdp.privacy.audit.one_run_gdp_lower_bound`, :data:`AUDIT_GUESS_FRACTION_GDP`),
    ``eps_lb`` its ``mu`` lower bound's epsilon at ``privacy.delta``, ``passed`` when that
    ``mu`` is at most the claim's. Poisson sampling (``pld``) claims one ``(epsilon, delta)``:
    audited by :func:`~p2pdp.privacy.audit.one_run_epsilon_lower_bound`. ``runs`` defaults to
    :data:`AUDIT_RUNS_GDP` for the honest rows of a GDP claim, else :data:`AUDIT_RUNS`.
    """
    if name not in ITERATIVE_AUDIT_NAMES:
        raise ConfigError(f"mechanism must be one of {ITERATIVE_AUDIT_NAMES}, got {name!r}")
    protocol, _, suffix = name.partition("-run")
    config = audit_config(protocol)
    control = suffix.lstrip("-") or None
    privacy = step_privacy(config)
    event = privacy.event
    gaussian = isinstance(event, GaussianEvent)  # the gdp accountant's mu-GDP claim
    if runs is None:
        runs = AUDIT_RUNS_GDP if gaussian and control is None else AUDIT_RUNS
    runs = require_count("runs", runs)
    labels, scores, steps = [], [], 0
    for run in range(runs):
        states, score, taken = audited_run(
            config, privacy, control=control, seed=seed, name=name, run=run
        )
        labels.append(states)
        scores.append(score)
        steps = max(steps, taken)
    states, score = np.concatenate(labels), np.concatenate(scores)
    fraction = AUDIT_GUESS_FRACTION_GDP if gaussian else AUDIT_GUESS_FRACTION
    k = min(states.size // 2, max(AUDIT_MIN_GUESSES, int(fraction * states.size)))
    return one_run_result(
        name,
        states,
        score,
        guesses_per_side=k,
        claimed=float(privacy.epsilon(np.array([steps]))[0]),
        delta=config.privacy.delta,
        confidence=confidence,
        expected_pass=name not in ITERATIVE_EXPECTED_TO_FAIL,
        guarantee_epsilon=_real_guarantee(privacy, control, steps),
        claimed_mu=(
            math.sqrt(steps) / event.noise_multiplier if isinstance(event, GaussianEvent) else None
        ),
    )


def one_run_result(
    name: str,
    states: np.ndarray,
    scores: np.ndarray,
    *,
    guesses_per_side: int,
    claimed: float,
    delta: float,
    confidence: float,
    expected_pass: bool,
    guarantee_epsilon: float,
    claimed_mu: float | None = None,
) -> AuditResult:
    """The audit row of pooled canaries: their guesses, the one-run bound and the verdict.

    Shared by :func:`audit_iterative` and
    :func:`~p2pdp.experiments.audit.correlated.audit_correlated`.

    Parameters
    ----------
    name : str
        The row's mechanism.
    states, scores : (m,) arrays
        The canaries' states (-1.0 / +1.0) and the adversary's scores, over all runs.
    guesses_per_side : int
        ``k``: the ``k`` highest scores are guessed +1, the ``k`` lowest -1
        (:func:`~p2pdp.privacy.audit.one_run_guesses`).
    claimed, delta : float
        The claimed epsilon, at ``delta``.
    confidence : float
        The bound's confidence.
    expected_pass : bool
        False for a negative control.
    guarantee_epsilon : float
        What the run really guarantees.
    claimed_mu : float or None
        The claimed ``mu`` of a mu-GDP claim: audited by the f-DP bound
        (:func:`~p2pdp.privacy.audit.one_run_gdp_lower_bound`), ``eps_lb`` its ``mu``'s
        epsilon at ``delta``, passed when that ``mu`` is at most ``claimed_mu``. None: by
        :func:`~p2pdp.privacy.audit.one_run_epsilon_lower_bound`, passed when ``eps_lb <=
        claimed``.

    Returns
    -------
    AuditResult
        The row, ``canaries`` the size of ``states``.
    """
    plus, minus = one_run_guesses(scores, guesses_per_side=guesses_per_side)
    correct = int((states[plus] > 0).sum() + (states[minus] < 0).sum())
    canaries, guesses = states.size, 2 * guesses_per_side
    if claimed_mu is None:
        eps_lb = one_run_epsilon_lower_bound(
            canaries=canaries, guesses=guesses, correct=correct, delta=delta,
            confidence=confidence,
        )  # fmt: skip
        passed = eps_lb <= claimed
    else:
        mu = one_run_gdp_lower_bound(
            canaries=canaries, guesses=guesses, correct=correct, confidence=confidence
        )
        eps_lb = float(gdp_epsilon(mu, delta)) if mu > 0 else 0.0
        passed = mu <= claimed_mu
    return AuditResult(
        mechanism=name,
        epsilon=claimed,
        delta=delta,
        eps_lb=eps_lb,
        passed=passed,
        expected_pass=expected_pass,
        guarantee_epsilon=guarantee_epsilon,
        method="one-run" if claimed_mu is None else "one-run f-DP (GDP)",
        canaries=int(canaries),
        confidence=confidence,
    )


def run_iterative_audit(
    names: Sequence[str] = ITERATIVE_AUDIT_NAMES, *, seed: int, runs: int | None = None
) -> list[AuditResult]:
    """:func:`audit_iterative` of each of ``names`` (``runs``: each row's default if None)."""
    return [audit_iterative(name, seed=seed, runs=runs) for name in names]
