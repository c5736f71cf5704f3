"""Differentially private posterior sampling (after Nguyễn): the exponential mechanism over
mean-field Gaussian posteriors, sampled by (tamed, preconditioned) Langevin dynamics.

The mechanism
-------------
A model has parameters ``theta`` in R^p and a per-record log-likelihood ``l(theta; x_i)``. The
released object is ``z = (mu, rho)`` in R^{2p}, the means and log standard deviations of a
mean-field Gaussian ``Q(theta | z) = prod_j N(theta_j; mu_j, exp(rho_j)^2)``.

1. **Bounded log-likelihood.** Each record's log-likelihood is passed through
   ``gamma = tau * tanh(l / tau)``, so ``gamma`` lies in ``(-tau, tau)`` (in ``(-tau, 0]`` when
   ``l <= 0``, as for logistic regression).
2. **Utility.** The evidence lower bound with ``L`` reparameterised draws,
   ``theta_k = mu + exp(rho) * r_k``, ``r_k`` standard normal draws made antithetic and
   moment-matched (:func:`~p2pdp.privacy.posterior_sampling.utility.common_random_numbers`)::

       U(z; x) = (1/L) sum_k [ sum_i gamma(theta_k; x_i) + log p(theta_k) ] + H(Q(. | z))

   with the Gaussian entropy ``H = sum_j rho_j + p/2 (1 + log 2 pi)`` in closed form (the Monte
   Carlo estimate of ``-E_Q log Q`` differs from it by a constant in ``z`` only).
   **The draws ``r_1..r_L`` are common random numbers**, drawn from the mechanism's ``rng``
   *before and independently of the data* and held fixed for the whole run. ``U`` is therefore a
   deterministic function of ``(z, x)`` given ``r``; its gradient is exact (no stochastic
   gradient), and for every fixed ``r`` the sensitivity bound below holds. Since ``r`` does not
   depend on the data, the mixture over ``r`` of epsilon-DP mechanisms is epsilon-DP.
3. **Exponential mechanism.** Release one ``z`` drawn from the density on R^{2p} (Lebesgue base
   measure; proper because the priors and the entropy make ``exp(c U)`` integrable)::

       f(z) ~ exp(epsilon * U(z; x) / (2 Delta_U))

**Neighbouring relation and sensitivity.** Data sets ``x, x'`` of the same size ``n`` that differ
by *replacing* one record (the unit protected is one record of the data set, e.g. of one peer's
shard). The prior does not depend on the records (for logistic regression its precision is
``n * lambda``, and ``n`` is the same for neighbours), nor does the entropy or ``r``, so for every
``z``: ``|U(z; x) - U(z; x')| = |(1/L) sum_k gamma(theta_k; x_n) - gamma(theta_k; x'_n)|``, at
most the width of the range of ``gamma``: ``Delta_U = 2 tau`` in general, and ``Delta_U = tau``
for a log-likelihood that is never positive (logistic regression). Then for every ``z``,
``f_x(z) / f_x'(z) <= exp(eps Delta_U / (2 Delta_U)) * Z(x') / Z(x) <= e^eps`` (McSherry &
Talwar 2007).

**What is released to whom.** The data holder (a peer, on its own shard) runs the sampler and
publishes only the final state ``z`` of *one* chain (chain 0). Everything else (the other chains,
the traces, the chain diagnostics, the non-private MAP) stays with the holder / the simulator's
evaluation: they are functions of the data and are **not** covered by the guarantee.

**The guarantee is approximate.** epsilon-DP holds for an *exact* draw from ``f``. A finite
Langevin chain only approximates ``f`` (discretisation bias, finite burn-in, imperfect mixing),
and its output law can differ from ``f`` by an amount we do not bound: the label of every
result is :data:`GUARANTEE_LABEL`. The chain diagnostics (split R-hat across chains, effective
sample size, final step size) say how far from converged a run looks; they do not certify
privacy.

The parts
---------
The utility, its models and its sensitivity are :mod:`~p2pdp.privacy.posterior_sampling.utility`;
the Langevin sampler and its schedule :mod:`~p2pdp.privacy.posterior_sampling.langevin`; the
chain diagnostics :mod:`~p2pdp.privacy.posterior_sampling.diagnostics`. This module draws and
releases: :func:`private_posterior` (one data set), :func:`private_logistic_peers` (every
peer's own release, in one batch), and the non-private reference :func:`map_estimate`.

numpy generators are not cryptographically secure: fine for a simulator, not for deployment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from p2pdp.core.validation import require_count, require_positive
from p2pdp.privacy.posterior_sampling.diagnostics import (
    ChainDiagnostics,
    effective_sample_size,
    split_rhat,
)
from p2pdp.privacy.posterior_sampling.langevin import LangevinRun, SamplerSettings, langevin
from p2pdp.privacy.posterior_sampling.utility import (
    LogisticRegression,
    Model,
    _Batch,
    common_random_numbers,
    elbo,
    utility_sensitivity,
)

__all__ = [
    "GUARANTEE_LABEL",
    "NEIGHBOURING_RELATION",
    "PEER_SETTINGS",
    "PeerPosteriorSamples",
    "PosteriorSample",
    "map_estimate",
    "private_logistic_peers",
    "private_peer_model",
    "private_posterior",
]

GUARANTEE_LABEL = "approximate: exact only for exact sampling"
NEIGHBOURING_RELATION = "replace one record of the data set (same n)"

#: Shorter schedule for a peer's logistic release (a few dozen records, well-conditioned
#: posterior): used by :func:`private_logistic_peers` and :func:`private_peer_model` by default.
PEER_SETTINGS = SamplerSettings(n_optimise=100, n_burnin=300, n_samples=500, trace_points=100)


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array, dtype=float)
    array.flags.writeable = False
    return array


@dataclass(frozen=True, slots=True, kw_only=True)
class PosteriorSample:
    """One private release of :func:`private_posterior`.

    Attributes
    ----------
    model : str
        ``"linear"`` or ``"logistic"``.
    parameter_names : tuple of str, length p
    means, log_stds : ndarray, shape (p,)
        The released ``z = (mu, rho)``: the final state of chain 0. This is the only part of
        the result the data holder publishes.
    point_estimate : dict
        Derived from ``means`` by post-processing (linear: ``sigma = exp(mean of log sigma)``).
    epsilon, tau, sensitivity : float
        Budget, bound and ``Delta_U``.
    neighbouring : str
        :data:`NEIGHBOURING_RELATION`.
    guarantee : str
        :data:`GUARANTEE_LABEL`: epsilon-DP for an exact draw from ``f``; the finite chain only
        approximates it.
    diagnostics : ChainDiagnostics
        Computed from all chains; not released, not covered by the guarantee.
    """

    model: str
    parameter_names: tuple[str, ...]
    means: np.ndarray
    log_stds: np.ndarray
    point_estimate: dict[str, float]
    epsilon: float
    tau: float
    sensitivity: float
    neighbouring: str = NEIGHBOURING_RELATION
    guarantee: str = GUARANTEE_LABEL
    diagnostics: ChainDiagnostics = field(repr=False)

    @property
    def released(self) -> np.ndarray:
        """The released vector ``z = (mu, rho)``, shape (2p,)."""
        return np.concatenate([self.means, self.log_stds])


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerPosteriorSamples:
    """Releases of :func:`private_logistic_peers`, one per peer.

    Attributes
    ----------
    means, log_stds : ndarray, shape (P, d)
        Peer ``j``'s released ``z_j``; ``means[j]`` is its private logistic model.
    epsilon, tau, sensitivity, lam : float
    rhat, ess : ndarray, shape (P, 2d)
        Per-peer chain diagnostics (not released).
    final_step_size : float
    guarantee : str
    """

    means: np.ndarray
    log_stds: np.ndarray
    epsilon: float
    tau: float
    sensitivity: float
    lam: float
    rhat: np.ndarray
    ess: np.ndarray
    final_step_size: float
    neighbouring: str = NEIGHBOURING_RELATION
    guarantee: str = GUARANTEE_LABEL


def _sample_batch(
    batch: _Batch,
    model: Model,
    *,
    epsilon: float,
    tau: float,
    rng: np.random.Generator,
    chains: int,
    draws: int,
    settings: SamplerSettings,
    noise_factor: float = 2.0,
) -> tuple[LangevinRun, int]:
    """Run ``chains`` Langevin chains on ``f`` for each of the batch's data sets."""
    G, _, d = batch.X.shape
    p = model.n_params(d)
    sensitivity = utility_sensitivity(model, tau)
    temperature = epsilon / (2.0 * sensitivity)
    # Common random numbers and starting points: drawn before, and independently of, the data.
    noise = np.broadcast_to(
        common_random_numbers(draws, p, rng=rng, batch=G), (G, chains, draws, p)
    )
    start = np.concatenate(
        [
            settings.init_std * rng.standard_normal((G, chains, p)),
            np.full((G, chains, p), settings.init_log_std),
        ],
        axis=-1,
    )
    log_factor = math.log(settings.tau_start_factor)

    def target(z: np.ndarray, anneal: float) -> tuple[np.ndarray, np.ndarray]:
        tau_t = tau * math.exp(log_factor * (1.0 - anneal))
        value, grad = elbo(z.reshape(G, chains, 2 * p), noise, batch, model, tau_t)
        return temperature * value.ravel(), temperature * grad.reshape(G * chains, 2 * p)

    run = langevin(
        target,
        start.reshape(G * chains, 2 * p),
        settings=settings,
        rng=rng,
        noise_factor=noise_factor,
    )
    return run, p


def _check_privacy_args(epsilon: float, tau: float, chains: int, draws: int) -> None:
    require_positive("epsilon", epsilon)
    require_positive("tau", tau)
    require_count("chains", chains)
    require_count("draws", draws)


def private_posterior(
    X: np.ndarray,
    y: np.ndarray,
    *,
    model: Model,
    epsilon: float,
    tau: float,
    rng: np.random.Generator,
    chains: int = 4,
    draws: int = 4,
    settings: SamplerSettings | None = None,
) -> PosteriorSample:
    """Release a mean-field posterior ``z = (mu, rho)`` drawn (approximately) from ``f``.

    Parameters
    ----------
    X : ndarray, shape (n, d)
        Records' features (logistic: rows with ``||x||_2 <= 1``).
    y : ndarray, shape (n,)
        Responses (logistic: labels in {-1, +1}).
    model : LinearRegression or LogisticRegression
    epsilon : float
        Budget of this one release, > 0.
    tau : float
        Bound of each record's log-likelihood, > 0; ``Delta_U = model.range_width * tau``.
    rng : numpy.random.Generator
        Source of the common random numbers, the starting points and the Langevin noise.
    chains : int
        Chains run; chain 0's final state is released, the others only feed the diagnostics
        (releasing more than one draw would cost one epsilon each).
    draws : int
        Monte-Carlo draws ``L`` inside ``U``.
    settings : SamplerSettings, optional

    Returns
    -------
    PosteriorSample
        Neighbouring relation: replace one record (same ``n``). Guarantee: epsilon-DP for an
        exact draw from ``f(z) ~ exp(epsilon U(z; x) / (2 Delta_U))``; the finite chain only
        approximates it (``guarantee`` = :data:`GUARANTEE_LABEL`).
    """
    _check_privacy_args(epsilon, tau, chains, draws)
    settings = settings or SamplerSettings()
    X = np.asarray(X, float)
    y = np.asarray(y, float).ravel()
    model.check_data(X, y)
    batch = _Batch.from_shards([X], [y])
    run, p = _sample_batch(
        batch, model, epsilon=epsilon, tau=tau, rng=rng, chains=chains, draws=draws,
        settings=settings,
    )  # fmt: skip
    names = model.parameter_names(X.shape[1])
    released = run.final[0]
    trace = run.trace  # (chains, T, 2p)
    diagnostics = ChainDiagnostics(
        rhat=_frozen(split_rhat(trace) if chains > 1 else np.full(2 * p, np.nan)),
        ess=_frozen(effective_sample_size(trace)),
        final_step_size=run.final_step_size,
        chains=chains,
        n_burnin=settings.n_burnin,
        n_samples=settings.n_samples,
        draws=draws,
    )
    return PosteriorSample(
        model=model.name,
        parameter_names=names,
        means=_frozen(released[:p]),
        log_stds=_frozen(released[p:]),
        point_estimate=model.point_estimate(released[:p], names),
        epsilon=float(epsilon),
        tau=float(tau),
        sensitivity=utility_sensitivity(model, tau),
        diagnostics=diagnostics,
    )


def private_logistic_peers(
    Xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray],
    *,
    lam: float,
    epsilon: float,
    tau: float,
    rng: np.random.Generator,
    chains: int = 2,
    draws: int = 4,
    settings: SamplerSettings | None = None,
) -> PeerPosteriorSamples:
    """Every peer's private logistic posterior from its own shard, all peers in one batch.

    Peer ``j`` releases ``z_j`` drawn (approximately) from ``f_j(z) ~ exp(epsilon U(z; x_j) /
    (2 tau))`` on its own shard ``x_j`` only (logistic: ``Delta_U = tau``). The peers' chains are
    independent (their own common random numbers and noise); running them in one numpy batch is
    only a speed-up. Neighbouring relation: replace one record of one peer's shard; each peer's
    release is (for exact sampling) epsilon-DP for its own records and does not depend on any
    other peer's. Released to whoever receives the peer's model: ``means[j]`` and
    ``log_stds[j]``.

    Parameters
    ----------
    Xs, ys : sequences of length P
        Peer ``j``'s rows (n_j, d), ``||x|| <= 1``, and labels (n_j,) in {-1, +1}.
    lam : float
        L2 regularisation (prior precision ``n_j lam``).
    epsilon, tau : float
    rng : numpy.random.Generator
    chains, draws : int
    settings : SamplerSettings, optional
        Default :data:`PEER_SETTINGS`.

    Returns
    -------
    PeerPosteriorSamples
    """
    _check_privacy_args(epsilon, tau, chains, draws)
    settings = settings or PEER_SETTINGS
    model = LogisticRegression(lam=lam)
    for X, y in zip(Xs, ys, strict=True):
        model.check_data(np.asarray(X, float), np.asarray(y, float))
    batch = _Batch.from_shards(Xs, ys)
    run, p = _sample_batch(
        batch, model, epsilon=epsilon, tau=tau, rng=rng, chains=chains, draws=draws,
        settings=settings,
    )  # fmt: skip
    G = len(Xs)
    final = run.final.reshape(G, chains, 2 * p)[:, 0]
    trace = run.trace.reshape(G, chains, *run.trace.shape[1:])
    if chains > 1:
        rhat = np.stack([split_rhat(trace[j]) for j in range(G)])
    else:
        rhat = np.full((G, 2 * p), np.nan)
    ess = np.stack([effective_sample_size(trace[j]) for j in range(G)])
    return PeerPosteriorSamples(
        means=_frozen(final[:, :p]),
        log_stds=_frozen(final[:, p:]),
        epsilon=float(epsilon),
        tau=float(tau),
        sensitivity=utility_sensitivity(model, tau),
        lam=float(lam),
        rhat=_frozen(rhat),
        ess=_frozen(ess),
        final_step_size=run.final_step_size,
    )


def private_peer_model(
    X: np.ndarray,
    y: np.ndarray,
    *,
    lam: float,
    epsilon: float,
    tau: float,
    rng: np.random.Generator,
    chains: int = 2,
    draws: int = 4,
    settings: SamplerSettings | None = None,
) -> np.ndarray:
    """One peer's released model vector (the mean of its private posterior sample), shape (d,).

    The vector a peer publishes in place of an output-perturbed model. ``X`` (n, d) and ``y``
    (n,) are the peer's OWN records: the mechanism needs the records, not a model or an
    average, so it cannot run on a group's aggregate. Guarantee: epsilon-DP per record of the
    peer's shard (replace one record) for exact sampling; approximate for the finite chain.
    """
    samples = private_logistic_peers(
        [X], [y], lam=lam, epsilon=epsilon, tau=tau, rng=rng, chains=chains, draws=draws,
        settings=settings,
    )  # fmt: skip
    return np.array(samples.means[0])


def map_estimate(
    X: np.ndarray, y: np.ndarray, *, model: Model, start: np.ndarray | None = None
) -> np.ndarray:
    """Non-private MAP of the unbounded posterior (L-BFGS with the analytic gradient).

    Returns ``theta`` of shape (p,). Not private: for reference lines only.
    """
    from scipy.optimize import minimize

    X = np.asarray(X, float)
    y = np.asarray(y, float).ravel()
    p = model.n_params(X.shape[1])
    theta = np.zeros(p) if start is None else np.asarray(start, float)
    if start is None and model.name == "linear":
        theta[-1] = math.log(max(float(np.std(y)), 1e-12))  # non-private start: MAP only
    for _ in range(10):  # L-BFGS restarts: it can stop early on this ill-conditioned objective
        result = minimize(
            model.negative_log_posterior,
            theta,
            args=(X, y),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 10_000, "gtol": 1e-10, "ftol": 1e-15},
        )
        converged = np.allclose(result.x, theta, rtol=0, atol=1e-10)
        theta = result.x
        if converged:
            break
    return theta
