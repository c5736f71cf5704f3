"""End-to-end audit of D-PSGD with correlated noise, per threat model: canaries, one run.

What is audited is the claim :mod:`p2pdp.protocols.correlated_dp` makes for a run: the
epsilon (at ``privacy.delta``, replace-one, full sampling) of peer 0 against an eavesdropper
(every message sent) or against its curious neighbour, peer 1 (the messages it receives, its
own noise and its edges' pair secrets). The noise multiplier ``z`` is calibrated so that the
claim is :data:`CORRELATED_TARGET_EPSILON` against that threat model
(:func:`~p2pdp.protocols.correlated_dp.calibrated_noise_multiplier`, ``z_p / z`` fixed to
:data:`CORRELATED_PAIR_RATIO`): far below local DP, so the pair noise must do its work.

The experiment (one run; :data:`CORRELATED_RUNS` runs pooled):

* **Peers and overlay.** :data:`CORRELATED_PEERS` peers on a ring, loss-free transport (every
  message arrives, so the run's trace, and the claim, are the same in every run),
  :data:`CORRELATED_ROUNDS` rounds, every peer stepping every round.
* **Canaries** as in :mod:`p2pdp.experiments.audit.iterative`: peer 0 holds
  ``AUDIT_CANARIES`` records ``e_k`` with labels ``S_k = +-1``; on coordinate ``k`` the
  clipped gradient of peer 0's step is ``-S_k C`` at every step, nothing else has data there,
  so the coordinate is exactly the linear Gaussian model of
  :class:`~p2pdp.protocols.correlated_dp.CorrelatedRun`: ``messages / C = R xi + D g``.
* **The adversary** takes its rows of the view (what it sees, in the order
  :meth:`CorrelatedRun.view` lists them), subtracts what it knows (the values of the noises it
  knows, recorded from the run's own draws), and scores canary ``k`` with the Neyman-Pearson
  statistic of a constant shift: ``-d^T (A A^T)^+ y_k``, ``d`` the view's response to a unit
  gradient at each of peer 0's steps, ``A`` the unknown noises' columns. It guesses as
  :mod:`~p2pdp.experiments.audit.iterative` does, and the one-run bound turns the guesses into
  ``eps_lb``; ``passed = eps_lb <= claimed``. (A constant shift is the worst case of these
  views, see the test: the bound can come close to the claim.)

Negative controls, all against the curious neighbour, switched here and nowhere else (the
claim stays the one the accountant makes for correct pair noise; the adversary uses the
implementation's real noise model, which a worst-case adversary may know):

``reused-pairs``
    every edge draws its pair noise once and adds the same value every round;
``weighted-pairs``
    the pair noise is scaled by the mixing weight ``W_ab`` (DECOR's public code);
``leaked-secret``
    peer 0 leaks the secret of its other edge (to peer ``P - 1``) to peer 1.

``guarantee_epsilon`` is what the run really guarantees against that adversary, by the same
exact computation on the real noise model.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError, P2PDPError
from p2pdp.core.rng import generator
from p2pdp.core.validation import require_count
from p2pdp.experiments.audit.iterative import (
    AUDIT_CANARIES,
    AUDIT_CONFIDENCE,
    AUDIT_FEATURES,
    AUDIT_GUESS_FRACTION,
    AUDIT_RECORDS,
    audit_problem,
    line_mixing,
    one_run_result,
)
from p2pdp.learning.local_problem import LocalProblem
from p2pdp.privacy.audit import AuditResult
from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.protocols import correlated_dp
from p2pdp.protocols.correlated_dp import CorrelatedRun
from p2pdp.protocols.iterative import DecentralizedSGD, StepPrivacy
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.peer_streams import PeerStreams
from p2pdp.protocols.views import worst_case_shifts

CORRELATED_PEERS = 6
CORRELATED_ROUNDS = 8
CORRELATED_PAIR_RATIO = 30.0  # z_p / z
CORRELATED_TARGET_EPSILON = 2.0
CORRELATED_RUNS = 100
#: The adversaries: observers of the view (None: the eavesdropper).
THREATS: dict[str, list[int] | None] = {"eavesdropper": None, "curious": [1]}
CORRELATED_CONTROLS: dict[str, str] = {
    "reused-pairs": "pair noise reused across rounds",
    "weighted-pairs": "pair noise scaled by the mixing weight",
    "leaked-secret": "peer 0 leaks an edge secret to the curious peer",
}
CORRELATED_AUDIT_NAMES: tuple[str, ...] = (
    *(f"dpsgd-correlated-{threat}" for threat in THREATS),
    *(f"dpsgd-correlated-curious-{control}" for control in CORRELATED_CONTROLS),
)
CORRELATED_EXPECTED_TO_FAIL: dict[str, str] = {
    f"dpsgd-correlated-curious-{control}": reason for control, reason in CORRELATED_CONTROLS.items()
}

#: The scenario of the audited runs (the noise multipliers are calibrated, not read from it).
CORRELATED_SCENARIO: dict[str, Any] = {
    "training": {"lam": 0.01},
    "privacy": {"mechanism": "gaussian", "epsilon": CORRELATED_TARGET_EPSILON, "delta": 1e-5},
    "protocol": {
        "name": "dpsgd",
        "rounds": CORRELATED_ROUNDS,
        "clip_norm": 0.1,
        "step_size": 1.0,
        "eval_every": CORRELATED_ROUNDS,
        "noise_multiplier": 1.0,
        "pairwise_noise_multiplier": CORRELATED_PAIR_RATIO,
    },
}


class _Recorder:
    """A generator's stand-in that keeps every normal draw; ``reuse`` (negative control
    only): every ``standard_normal`` call after the first returns the first draw again."""

    def __init__(self, rng: np.random.Generator, *, reuse: bool = False) -> None:
        self.rng, self.reuse = rng, reuse
        self.draws: list[np.ndarray] = []

    def standard_normal(self, size: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        if out is not None:  # a step's own noise, drawn in place (never reused)
            self.draws.append(self.rng.standard_normal(out=out).copy())
            return out
        if not (self.reuse and self.draws):
            self.draws.append(self.rng.standard_normal(size))
        return self.draws[-1]


class _AuditedSGD(DecentralizedSGD):
    """D-PSGD whose noise draws are recorded and whose messages are kept (``sent``: every
    peer's model at each exchange; ``active``: each step's edges that drew pair noise);
    ``control`` switches a negative control's pair noise."""

    def __init__(self, *args: Any, control: str | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.control = control
        self.sent: list[np.ndarray] = []
        self.active: list[np.ndarray] = []

    @functools.cached_property
    def _pair_streams(self) -> list[np.random.Generator]:
        reuse = self.control == "reused-pairs"
        streams = DecentralizedSGD._pair_streams.func(self)  # type: ignore[attr-defined]
        return [_Recorder(g, reuse=reuse) for g in streams]  # type: ignore[misc]

    @functools.cached_property
    def pair_std(self) -> np.ndarray:
        std: np.ndarray = DecentralizedSGD.pair_std.func(self)  # type: ignore[attr-defined]
        if self.control == "weighted-pairs":
            return std * _pair_weights(self.mixing, self.pairs)
        return std

    @functools.cached_property
    def peer_streams(self) -> list[PeerStreams]:
        streams = DecentralizedSGD.peer_streams.func(self)  # type: ignore[attr-defined]
        return [s.replaced(noise=_Recorder(s.noise)) for s in streams]

    def pair_terms(self, peers: np.ndarray, dim: int) -> np.ndarray | float:
        stepping = np.zeros(self.problem.n_peers, dtype=bool)
        stepping[peers] = True
        a, b = self.pairs[:, 0], self.pairs[:, 1]
        self.active.append(np.flatnonzero(stepping[a] | stepping[b]))  # the edges drawn
        return super().pair_terms(peers, dim)

    def average(self, delivered: np.ndarray, late: np.ndarray | None = None) -> None:
        if not delivered.all():
            raise P2PDPError("the audit's transport is loss-free, yet a message was lost")
        self.sent.append(self.models.copy())
        super().average(delivered, late)


def _pair_weights(mixing: Mixing, pairs: np.ndarray) -> np.ndarray:
    """(U,) ``W_ab`` of each edge of ``pairs``."""
    W = mixing.matrix()
    return np.asarray(W[pairs[:, 0], pairs[:, 1]]).ravel()


def _padded(problem: LocalProblem) -> LocalProblem:
    """``problem`` with every peer's shard padded to the largest by records ``x = 0`` (their
    gradient is 0: they change only the public denominators, equal for all peers, so the pair
    terms and the peers' own noises have the same scale)."""
    sizes = problem.sizes
    largest = int(sizes.max())
    X, y, shards, start = [problem.X], [problem.y], [], len(problem.y)
    for peer, size in enumerate(sizes.tolist()):
        pad = largest - size
        X.append(np.zeros((pad, problem.X.shape[1])))
        y.append(np.ones(pad))
        own = np.arange(problem.indptr[peer], problem.indptr[peer + 1])
        shards.append(np.concatenate([own, start + np.arange(pad)]))
        start += pad
    return LocalProblem.from_shards(
        np.concatenate(X), np.concatenate(y), tuple(shards), problem.lam
    )


def _privacy(z: float) -> StepPrivacy:
    """Steps of noise multiplier ``z`` that every peer takes every round (the claim is the
    threat model's, not local DP's: no local budget stops them)."""
    settings = CORRELATED_SCENARIO["protocol"]
    mechanism = ClippedGaussianSum(clip_norm=settings["clip_norm"], noise_multiplier=z)
    return StepPrivacy(
        mechanism=mechanism,
        event=mechanism.event(),
        accountant="gdp",
        max_steps=CORRELATED_ROUNDS,
        delta_total=CORRELATED_SCENARIO["privacy"]["delta"],
    )


def _linear_map(z: float, ratio: float, sizes: np.ndarray, mixing: Mixing) -> CorrelatedRun:
    """The audited runs' :class:`CorrelatedRun` at noise ``z`` and ``z_p = ratio z``."""
    settings, lam = CORRELATED_SCENARIO["protocol"], CORRELATED_SCENARIO["training"]["lam"]
    eta = settings["step_size"]
    return CorrelatedRun.build(
        correlated_dp.loss_free_trace(mixing, CORRELATED_ROUNDS),
        mixing,
        scales=eta / sizes.astype(float),
        decay=1.0 - eta * lam,
        noise_multiplier=z,
        pair_noise_multiplier=ratio * z,
    )


def _merged(run: CorrelatedRun, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` (R, N) with every edge's pair columns summed into one (its noise reused every
    round), and the merged columns' pair (-1 for independent noises)."""
    own = run.noise_pair < 0
    edges = np.unique(run.noise_pair[~own])
    merged = [rows[:, own], *(rows[:, run.noise_pair == e].sum(axis=1, keepdims=True)
                              for e in edges)]  # fmt: skip
    pair = np.concatenate([np.full(int(own.sum()), -1), edges])
    return np.concatenate(merged, axis=1), pair


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Model:
    """The adversary's noise model: ``R`` (rows x noises), ``D`` (rows x peer 0's steps),
    ``known`` (noises it knows); its weights ``-(A A^T)^+ d``; the exact ``kappa``."""

    R: np.ndarray
    D: np.ndarray
    known: np.ndarray
    kappa: float

    @property
    def weights(self) -> np.ndarray:
        A = self.R[:, ~self.known]
        return -np.linalg.pinv(A @ A.T, hermitian=True) @ self.D.sum(axis=1)


def _kappa(R: np.ndarray, D: np.ndarray, known: np.ndarray) -> float:
    """``sup_a a^T M a`` of peer 0 (its ``D`` columns) against noise ``R[:, ~known]``."""
    A = R[:, ~known]
    G = D
    M = G.T @ np.linalg.pinv(A @ A.T, hermitian=True) @ G
    return float(worst_case_shifts(M[None])[0][0])


def parse_name(name: str) -> tuple[str, str | None]:
    """``(threat, control)`` of one of :data:`CORRELATED_AUDIT_NAMES` (control None: honest)."""
    threat, _, control = name.removeprefix("dpsgd-correlated-").partition("-")
    return threat, control or None


def audit_correlated(
    name: str,
    *,
    seed: int,
    runs: int = CORRELATED_RUNS,
    confidence: float = AUDIT_CONFIDENCE,
) -> AuditResult:
    """The one-run audit (pooled over ``runs`` runs) of one of :data:`CORRELATED_AUDIT_NAMES`."""
    if name not in CORRELATED_AUDIT_NAMES:
        raise ConfigError(f"mechanism must be one of {CORRELATED_AUDIT_NAMES}, got {name!r}")
    runs = require_count("runs", runs)
    threat, control = parse_name(name)
    observers = THREATS[threat]
    mixing = line_mixing(CORRELATED_PEERS, ring=True)
    sizes = np.full(CORRELATED_PEERS, AUDIT_RECORDS + AUDIT_CANARIES)  # padded (_padded)
    delta = CORRELATED_SCENARIO["privacy"]["delta"]
    unit = _linear_map(1.0, CORRELATED_PAIR_RATIO, sizes, mixing)
    z = correlated_dp.calibrated_noise_multiplier(
        float(unit.kappa(observers, np.array([0]))[0]),
        epsilon=CORRELATED_TARGET_EPSILON,
        delta=delta,
        sensitivity_over_clip=2.0,
    )
    claimed_run = _linear_map(z, CORRELATED_PAIR_RATIO, sizes, mixing)
    claimed = float(
        correlated_dp.epsilon_of_kappa(
            claimed_run.kappa(observers, np.array([0])), sensitivity_over_clip=2.0, delta=delta
        )[0]
    )
    model = _adversary_model(claimed_run, observers, control, z, sizes, mixing)
    config = ScenarioConfig(
        **{
            **CORRELATED_SCENARIO,
            "protocol": {**CORRELATED_SCENARIO["protocol"], "noise_multiplier": z,
                         "pairwise_noise_multiplier": CORRELATED_PAIR_RATIO * z},
        }
    )  # fmt: skip
    labels, scores, weights = [], [], model.weights
    for run in range(runs):
        states, observed, values = correlated_run(
            config, claimed_run, observers, control=control, seed=seed, name=name, run_index=run
        )
        labels.append(states)
        # what the adversary knows removed, then the constant shift's test statistic
        scores.append(weights @ (observed - model.R[:, model.known] @ values[model.known]))
    states, score = np.concatenate(labels), np.concatenate(scores)
    guarantee = float(
        correlated_dp.epsilon_of_kappa(
            np.array([model.kappa]), sensitivity_over_clip=2.0, delta=delta
        )[0]
    )
    return one_run_result(
        name,
        states,
        score,
        guesses_per_side=max(1, int(AUDIT_GUESS_FRACTION * states.size)),
        claimed=claimed,
        delta=delta,
        confidence=confidence,
        expected_pass=name not in CORRELATED_EXPECTED_TO_FAIL,
        guarantee_epsilon=guarantee,
    )


def _adversary_model(
    run: CorrelatedRun,
    observers: list[int] | None,
    control: str | None,
    z: float,
    sizes: np.ndarray,
    mixing: Mixing,
) -> _Model:
    """The real noise model of the run as the adversary sees it (the claimed one, honest)."""
    R, D, known = run.view(observers)
    D = D[:, run.data_peer == 0]
    if control == "weighted-pairs":  # on a ring every edge has the same weight
        weights = _pair_weights(mixing, run.pairs)
        if np.ptp(weights) > 0:
            raise P2PDPError("the weighted-pairs control assumes equal mixing weights")
        real = _linear_map(z, CORRELATED_PAIR_RATIO * float(weights[0]), sizes, mixing)
        R, _, known = real.view(observers)
    elif control == "reused-pairs":
        R, pair = _merged(run, R)
        own = run.noise_pair < 0
        edges = pair[pair >= 0]
        known = np.concatenate([known[own], [bool(known[run.noise_pair == e][0]) for e in edges]])
    elif control == "leaked-secret":
        assert observers is not None
        leaked = np.flatnonzero((run.pairs[:, 0] == 0) & (run.pairs[:, 1] == mixing.n_peers - 1))
        known = known | np.isin(run.noise_pair, leaked)
    return _Model(R=R, D=D, known=known, kappa=_kappa(R, D, known))


def noise_values(
    protocol: _AuditedSGD, run: CorrelatedRun, coordinates: slice, control: str | None
) -> np.ndarray:
    """(N', K) the standard-normal value of every noise column of the adversary's model on
    ``coordinates``, from the run's recorded draws (in the column order of
    :meth:`CorrelatedRun.build`; reused pairs: the independent noises, then one column per
    edge)."""
    own = [s.noise.draws for s in protocol.peer_streams]  # type: ignore[attr-defined]
    streams: list[_Recorder] = protocol._pair_streams  # type: ignore[assignment]
    taken = [0] * len(streams)
    values = []
    for step, active in enumerate(protocol.active):  # every peer steps every round
        drawn = np.stack([draws[step] for draws in own])  # standard normals
        values.append(drawn[:, coordinates])
        if control == "reused-pairs":
            continue
        for e in active.tolist():
            values.append(streams[e].draws[taken[e]][None, coordinates])
            taken[e] += 1
    if control == "reused-pairs":
        edges = np.unique(run.noise_pair[run.noise_pair >= 0]).tolist()
        values += [streams[e].draws[0][None, coordinates] for e in edges]
    return np.concatenate(values)


def correlated_run(
    config: ScenarioConfig,
    run: CorrelatedRun,
    observers: list[int] | None,
    *,
    control: str | None,
    seed: int,
    name: str,
    run_index: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One audited run of the real D-PSGD code (its steps, pair terms and averaging, driven
    by :func:`~p2pdp.sim.iterative.run_iterative`); streams ``(seed, "audit", name,
    run_index, stream)``.

    Returns
    -------
    labels : (m,) array of -1.0 / +1.0
        The canaries' states.
    observed : (R, m) array
        The view of ``observers`` (rows as :meth:`CorrelatedRun.view` lists them) on the
        canaries' coordinates, in units of ``C``.
    values : (N', m) array
        The standard-normal value of every noise column of the adversary's model
        (:func:`noise_values`).
    """
    from p2pdp.sim.iterative import run_iterative

    streams = {key: generator(seed, "audit", name, run_index, key) for key in (
        "canaries", "data", "network", "noise", "sampling", "gossip", "pairs")}  # fmt: skip
    labels = np.where(streams["canaries"].random(AUDIT_CANARIES) < 0.5, -1.0, 1.0)
    problem = _padded(
        audit_problem(
            labels, n_peers=CORRELATED_PEERS, canary_norm=1.0, lam=config.training.lam,
            rng=streams["data"],
        )
    )  # fmt: skip
    rngs: dict[str, Any] = streams
    z = config.protocol.noise_multiplier or 0.0
    protocol = _AuditedSGD(
        config.protocol, problem, line_mixing(CORRELATED_PEERS, ring=True), _privacy(z), rngs=rngs,
        control=control,
    )  # fmt: skip
    run_iterative(config, protocol, errors=lambda m: np.zeros(len(m)), rng=streams["network"])
    if not all(active.size == len(protocol.pairs) for active in protocol.active):
        raise P2PDPError("the audit's peers must all step every round")
    canaries = slice(AUDIT_FEATURES, AUDIT_FEATURES + AUDIT_CANARIES)
    clip = protocol.privacy.mechanism.clip_norm
    seen = [models[:, canaries] / clip for models in protocol.sent]
    observed, _, _ = dataclasses.replace(run, messages=seen, data=seen).view(observers)
    return labels, observed, noise_values(protocol, run, canaries, control)


def run_correlated_audit(
    names: Sequence[str] = CORRELATED_AUDIT_NAMES, *, seed: int, runs: int = CORRELATED_RUNS
) -> list[AuditResult]:
    """:func:`audit_correlated` of each of ``names``."""
    return [audit_correlated(name, seed=seed, runs=runs) for name in names]
