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
   moment-matched (:func:`common_random_numbers`)::

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

The sampler
-----------
:func:`langevin` runs the overdamped Langevin diffusion ``dz = M grad log f dt + sqrt(2M) dW``
with a diagonal preconditioner ``M``, discretised with coordinate-wise taming (tULAc, Brosse et al.
2019) in the preconditioned coordinates ``y = z / sqrt(M)``::

    g = sqrt(M) * grad log f(z);   z <- z + sqrt(M) * (h g / (1 + h |g|) + sqrt(2 h) xi)

Taming bounds every drift step by one preconditioned unit and vanishes as ``h -> 0``; it keeps
the chain stable where the gradient grows exponentially (large ``rho``, small ``sigma``).
Schedule (:class:`SamplerSettings`):

* **burn-in, stage 1** (optimisation): L-BFGS maximises ``log f`` from the data-independent
  start in ``continuation_stages`` stages with the bound relaxed to ``tau * tau_start_factor``
  and tightened geometrically back to ``tau``: far from the data the bounded likelihood is flat
  (every record saturates at ``-tau``) and gives no gradient, and chains started there widen
  ``Q`` (the entropy term) and stay stuck; the relaxed bound leads them to the data's basin.
* **burn-in, stage 2** (``n_burnin`` Langevin steps, step ``h = step_burnin``):
  ``M = 1 / (v + 1/max_preconditioner)`` with ``v`` started at the absolute diagonal Hessian
  plus the squared gradient at the mode, and then an exponential moving average (window
  ``preconditioner_window`` steps) of the squared gradient, an estimate of the diagonal Fisher
  information, so that ``M`` approximates each coordinate's variance under ``f`` (``v`` is
  floored at a tenth of its value at the mode, so ``M`` grows at most 10-fold). Burn-in only
  moves the chain's starting point; it starts from a data-dependent mode, which an exact
  sampler would forget (a finite chain partly remembers it in its slowest directions: another
  reason the guarantee is approximate).
* **sampling** (``n_samples`` steps): ``M`` frozen, the step decays geometrically from
  ``step_burnin`` to ``step_final`` (the reported final step size); the chain then targets ``f``
  with the bounded likelihood at the requested ``tau`` only.

Chains start from data-independent points: ``mu ~ N(0, init_std^2)``, ``rho = init_log_std``.

numpy generators are not cryptographically secure: fine for a simulator, not for deployment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import require_count, require_positive

__all__ = [
    "GUARANTEE_LABEL",
    "NEIGHBOURING_RELATION",
    "PEER_SETTINGS",
    "ChainDiagnostics",
    "LinearRegression",
    "LogisticRegression",
    "PeerPosteriorSamples",
    "PosteriorSample",
    "SamplerSettings",
    "bounded_log_likelihood",
    "common_random_numbers",
    "effective_sample_size",
    "elbo",
    "langevin",
    "map_estimate",
    "private_logistic_peers",
    "private_peer_model",
    "private_posterior",
    "split_rhat",
    "utility_sensitivity",
]

GUARANTEE_LABEL = "approximate: exact only for exact sampling"
NEIGHBOURING_RELATION = "replace one record of the data set (same n)"
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
#: Log-scale ``log sigma`` of a linear-regression draw is clipped to this range inside the
#: likelihood (a data-independent change of the model; ``|gamma| <= tau`` still holds).
LOG_SIGMA_CLIP = 30.0


# --- bounded log-likelihood ---------------------------------------------------------------------
def bounded_log_likelihood(l: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """``gamma = tau * tanh(l / tau)`` and its derivative ``d gamma / d l = 1 - tanh^2(l / tau)``.

    Parameters
    ----------
    l : ndarray, any shape
        Per-record log-likelihoods (nats); may be ``-inf``.
    tau : float
        Bound, > 0 (``inf`` gives ``gamma = l``).

    Returns
    -------
    gamma : ndarray, same shape, in ``(-tau, tau)`` (``[-tau, tau]`` after float rounding)
    slope : ndarray, same shape, in ``[0, 1]``
    """
    if math.isinf(tau):
        return np.asarray(l, float), np.ones_like(l, dtype=float)
    with np.errstate(over="ignore"):
        a = np.asarray(l, float) / tau
    # tanh and sech^2 from one exp (cheaper than np.tanh, no overflow): e = exp(-2|a|)
    e = np.exp(-2.0 * np.abs(a))
    inverse = 1.0 / (1.0 + e)
    return tau * np.copysign((1.0 - e) * inverse, a), np.minimum(4.0 * e * inverse * inverse, 1.0)


@dataclass(frozen=True, slots=True)
class _Batch:
    """G data sets padded to a common number of rows: X (G, n, d), y (G, n), mask (G, n)."""

    X: np.ndarray
    y: np.ndarray
    mask: np.ndarray
    n_records: np.ndarray  # (G,)
    Xt: np.ndarray = field(init=False)  # X transposed, (G, d, n), contiguous for matmul

    def __post_init__(self) -> None:
        object.__setattr__(self, "Xt", np.ascontiguousarray(self.X.transpose(0, 2, 1)))

    @classmethod
    def from_shards(cls, Xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> _Batch:
        if len(Xs) != len(ys) or len(Xs) == 0:
            raise ConfigError(f"need as many X as y shards (>= 1), got {len(Xs)} and {len(ys)}")
        Xs = [np.asarray(X, float) for X in Xs]
        ys = [np.asarray(y, float).ravel() for y in ys]
        d = Xs[0].shape[1] if Xs[0].ndim == 2 else -1
        for j, (X, y) in enumerate(zip(Xs, ys, strict=True)):
            if X.ndim != 2 or X.shape[1] != d or len(X) != len(y) or len(y) == 0:
                raise ConfigError(
                    f"shard {j}: X must be (n, {d}) with n >= 1 rows matching y, got X "
                    f"{X.shape} and y {y.shape}"
                )
            if not (np.isfinite(X).all() and np.isfinite(y).all()):
                raise ConfigError(f"shard {j}: X and y must be finite")
        sizes = np.array([len(y) for y in ys])
        n_max = int(sizes.max())
        X = np.zeros((len(Xs), n_max, d))
        y = np.zeros((len(Xs), n_max))
        mask = np.zeros((len(Xs), n_max))
        for j, (Xj, yj) in enumerate(zip(Xs, ys, strict=True)):
            X[j, : len(yj)], y[j, : len(yj)], mask[j, : len(yj)] = Xj, yj, 1.0
        return cls(X=X, y=y, mask=mask, n_records=sizes)


# --- models -------------------------------------------------------------------------------------
class _PosteriorModel:
    """What both models share: the unbounded negative log-posterior of the non-private MAP."""

    __slots__ = ()

    def bounded_log_likelihood(
        self, theta: np.ndarray, batch: _Batch, tau: float
    ) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def log_prior(self, theta: np.ndarray, batch: _Batch) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def negative_log_posterior(
        self, theta: np.ndarray, X: np.ndarray, y: np.ndarray
    ) -> tuple[float, np.ndarray]:
        """Unbounded ``-(sum_i l_i + log prior)`` and its gradient (the non-private MAP's)."""
        batch = _Batch.from_shards([X], [y])
        ll, gll = self.bounded_log_likelihood(theta[None, None], batch, math.inf)
        lp, glp = self.log_prior(theta[None, None], batch)
        return -float(ll[0, 0] + lp[0, 0]), -(gll + glp)[0, 0]


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearRegression(_PosteriorModel):
    """``y = x . beta + intercept + N(0, sigma^2)``; parameters ``(beta, intercept, log sigma)``.

    Per record ``l = -0.5 ((y - x.beta - intercept) / sigma)^2 - log sigma - 0.5 log(2 pi)``
    (the full Gaussian log-density; the seed drops the constant, which matters once the
    log-likelihood is bounded). Priors (the seed's): ``beta_j, intercept ~ N(0, prior_std^2)``
    and ``sigma ~ half-Cauchy(0, sigma_prior_scale)``, written as a density of ``log sigma``
    (Jacobian included). ``Delta_U = 2 tau``.
    """

    prior_std: float = 10.0
    sigma_prior_scale: float = 10.0

    name = "linear"
    range_width = 2.0  # width of gamma's range in units of tau

    def __post_init__(self) -> None:
        require_positive("model.prior_std", self.prior_std)
        require_positive("model.sigma_prior_scale", self.sigma_prior_scale)

    def n_params(self, n_features: int) -> int:
        return n_features + 2

    def parameter_names(self, n_features: int) -> tuple[str, ...]:
        return (*(f"x{j + 1}" for j in range(n_features)), "intercept", "log_sigma")

    def check_data(self, X: np.ndarray, y: np.ndarray) -> None:
        """Any finite rows and responses are allowed (the bound on gamma needs nothing)."""

    def bounded_log_likelihood(
        self, theta: np.ndarray, batch: _Batch, tau: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sum over records of ``gamma`` and its gradient; theta (G, K, p) -> (G, K), (G, K, p)."""
        d = batch.X.shape[2]
        raw = theta[..., d + 1]
        log_sigma = np.clip(raw, -LOG_SIGMA_CLIP, LOG_SIGMA_CLIP)
        inside = (np.abs(raw) < LOG_SIGMA_CLIP).astype(float)
        prediction = np.matmul(theta[..., :d], batch.Xt) + theta[..., d, None]
        residual = batch.y[:, None, :] - prediction
        precision = np.exp(-2.0 * log_sigma)[..., None]
        scaled = residual * precision
        l = -0.5 * residual * scaled - log_sigma[..., None] - _HALF_LOG_2PI
        gamma, slope = bounded_log_likelihood(l, tau)
        weight = slope * batch.mask[:, None, :]
        grad = np.empty(theta.shape)
        weighted = weight * scaled
        grad[..., :d] = np.matmul(weighted, batch.X)
        grad[..., d] = weighted.sum(axis=-1)
        grad[..., d + 1] = (weight * (residual * scaled - 1.0)).sum(axis=-1) * inside
        return (gamma * batch.mask[:, None, :]).sum(axis=-1), grad

    def log_prior(self, theta: np.ndarray, batch: _Batch) -> tuple[np.ndarray, np.ndarray]:
        """Log prior density and gradient; theta (G, K, p)."""
        from scipy.special import expit

        coefficients, log_sigma = theta[..., :-1], theta[..., -1]
        var = self.prior_std**2
        n_coef = coefficients.shape[-1]
        value = -0.5 * (coefficients**2).sum(axis=-1) / var - n_coef * (
            math.log(self.prior_std) + _HALF_LOG_2PI
        )
        shifted = 2.0 * (log_sigma - math.log(self.sigma_prior_scale))
        value = value + (
            math.log(2.0 / (math.pi * self.sigma_prior_scale))
            - np.logaddexp(0.0, shifted)
            + log_sigma
        )
        grad = np.empty(theta.shape)
        grad[..., :-1] = -coefficients / var
        grad[..., -1] = 1.0 - 2.0 * expit(shifted)
        return value, grad

    def point_estimate(self, means: np.ndarray, names: Sequence[str]) -> dict[str, float]:
        """Coefficients and intercept as they are; ``sigma = exp(mean of log sigma)``."""
        estimate = {name: float(v) for name, v in zip(names[:-1], means[:-1], strict=True)}
        estimate["sigma"] = float(np.exp(means[-1]))
        return estimate


@dataclass(frozen=True, slots=True, kw_only=True)
class LogisticRegression(_PosteriorModel):
    """L2-regularised logistic regression: labels in {-1, +1}, rows with ``||x||_2 <= 1``.

    ``l = log sigmoid(y w.x) <= 0`` and the prior ``w ~ N(0, I / (n lam))``, so that the MAP is
    the minimiser of ``(1/n) sum log(1 + exp(-y w.x)) + (lam/2) ||w||^2``, the objective of
    :mod:`p2pdp.learning.models`. ``gamma`` lies in ``(-tau, 0]``, so ``Delta_U = tau``.
    """

    lam: float

    name = "logistic"
    range_width = 1.0

    def __post_init__(self) -> None:
        require_positive("model.lam", self.lam)

    def n_params(self, n_features: int) -> int:
        return n_features

    def parameter_names(self, n_features: int) -> tuple[str, ...]:
        return tuple(f"w{j}" for j in range(n_features))

    def check_data(self, X: np.ndarray, y: np.ndarray) -> None:
        if not np.isin(y, (-1, 1)).all():
            raise ConfigError(f"y must be in {{-1, +1}}, got values {np.unique(y)}")
        norm = float(np.linalg.norm(X, axis=1).max())
        if norm > 1 + 1e-9:
            raise ConfigError(f"rows of X must have L2 norm <= 1, got {norm:.6g}")

    def bounded_log_likelihood(
        self, theta: np.ndarray, batch: _Batch, tau: float
    ) -> tuple[np.ndarray, np.ndarray]:
        from scipy.special import expit, log_expit

        margins = batch.y[:, None, :] * np.matmul(theta, batch.Xt)
        gamma, slope = bounded_log_likelihood(log_expit(margins), tau)
        weighted = slope * batch.mask[:, None, :] * batch.y[:, None, :] * expit(-margins)
        grad = np.matmul(weighted, batch.X)
        return (gamma * batch.mask[:, None, :]).sum(axis=-1), grad

    def log_prior(self, theta: np.ndarray, batch: _Batch) -> tuple[np.ndarray, np.ndarray]:
        precision = (batch.n_records * self.lam)[:, None, None]
        value = -0.5 * precision[..., 0] * (theta**2).sum(axis=-1) + 0.5 * theta.shape[-1] * (
            np.log(precision[..., 0]) - math.log(2 * math.pi)
        )
        return value, -precision * theta

    def point_estimate(self, means: np.ndarray, names: Sequence[str]) -> dict[str, float]:
        return {name: float(v) for name, v in zip(names, means, strict=True)}


Model = LinearRegression | LogisticRegression


def utility_sensitivity(model: Model, tau: float) -> float:
    """``Delta_U``: ``2 tau`` (linear regression), ``tau`` (logistic, whose ``l <= 0``)."""
    return model.range_width * require_positive("tau", tau)


def common_random_numbers(
    draws: int, n_params: int, *, rng: np.random.Generator, batch: int = 1
) -> np.ndarray:
    """The fixed draws ``r_1..r_L`` of ``U``: antithetic pairs, moment-matched per coordinate.

    ``a_1..a_{L/2} ~ N(0, I_p)`` iid, ``r = (a_1, -a_1, a_2, -a_2, ...)``, then each coordinate
    is rescaled so that ``(1/L) sum_k r_kj^2 = 1``. The pairs make ``mean_k theta_k = mu``
    exactly and the rescaling makes the spread penalty of a quadratic log-likelihood exact on
    the diagonal; with plain iid draws and small ``L`` the mean-field parameters of the
    coordinates whose draws happen to be small are badly biased. Drawn from ``rng`` only,
    before and independently of the data, so ``U`` stays a deterministic function of
    ``(z, x)`` with the same sensitivity.

    Returns
    -------
    ndarray, shape (batch, 1, draws, n_params); ``draws`` must be even.
    """
    draws = require_count("draws", draws)
    if draws % 2:
        raise ConfigError(f"draws must be even (antithetic pairs), got {draws}")
    half = rng.standard_normal((batch, 1, draws // 2, n_params))
    noise = np.concatenate([half, -half], axis=2)
    return noise / np.sqrt((noise**2).mean(axis=2, keepdims=True))


# --- utility ------------------------------------------------------------------------------------
def elbo(
    z: np.ndarray, noise: np.ndarray, batch: _Batch, model: Model, tau: float
) -> tuple[np.ndarray, np.ndarray]:
    """Monte-Carlo ELBO ``U(z; x)`` with common random numbers, and its analytic gradient.

    Parameters
    ----------
    z : ndarray, shape (G, C, 2p)
        ``(mu, rho)`` of ``C`` chains for each of ``G`` data sets.
    noise : ndarray, shape (G, C, L, p)
        The fixed draws ``r_k`` (common random numbers, independent of the data).
    batch : _Batch
        The ``G`` data sets.
    model : LinearRegression or LogisticRegression
    tau : float
        Bound of the log-likelihood (``inf``: unbounded).

    Returns
    -------
    U : ndarray, shape (G, C)
    grad : ndarray, shape (G, C, 2p)
        ``dU/dmu = mean_k g_k``, ``dU/drho = exp(rho) * mean_k g_k * r_k + 1`` with ``g_k`` the
        gradient of ``sum_i gamma + log p`` at ``theta_k = mu + exp(rho) * r_k``.
    """
    G, C, L, p = noise.shape
    mu, rho = z[..., :p], z[..., p:]
    scale = np.exp(rho)
    theta = (mu[:, :, None, :] + scale[:, :, None, :] * noise).reshape(G, C * L, p)
    ll, gll = model.bounded_log_likelihood(theta, batch, tau)
    lp, glp = model.log_prior(theta, batch)
    value = (ll + lp).reshape(G, C, L).mean(axis=2)
    g = (gll + glp).reshape(G, C, L, p)
    entropy = rho.sum(axis=-1) + 0.5 * p * (1.0 + math.log(2 * math.pi))
    grad = np.concatenate([g.mean(axis=2), scale * (g * noise).mean(axis=2) + 1.0], axis=-1)
    return value + entropy, grad


# --- sampler ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SamplerSettings:
    """Step-size schedule, burn-in and chain length of :func:`langevin` (see the module doc).

    Attributes
    ----------
    n_optimise : int
        Burn-in stage 1: L-BFGS iterations (at most) per continuation stage, maximising
        ``log f`` jointly for all chains from their data-independent starts.
    n_burnin : int
        Burn-in stage 2: Langevin steps at ``step_burnin`` adapting the preconditioner.
    n_samples : int
        Sampling steps (frozen preconditioner); the step decays geometrically from
        ``step_burnin`` to ``step_final``. The final state is the sample.
    step_burnin, step_final : float
        Langevin step ``h`` in preconditioned units (relative to each coordinate's variance
        under ``f``).
    preconditioner_window : int
        Effective window (steps) of the moving average of squared gradients.
    max_preconditioner : float
        Cap on ``M`` (a coordinate's assumed variance under ``f``), data-independent.
    continuation_stages : int
        Stage 1 maximises ``log f`` with the bound ``tau * tau_start_factor^(1 - s/(S-1))`` for
        ``s = 0..S-1`` (the last stage is the target); 1 disables the continuation.
    tau_start_factor : float
        >= 1.
    init_std, init_log_std : float
        Chains start at ``mu ~ N(0, init_std^2)``, ``rho = init_log_std`` (data-independent).
    trace_points : int
        States kept per chain during sampling (evenly spaced, last one included) for the
        diagnostics.
    """

    n_optimise: int = 200
    n_burnin: int = 1000
    n_samples: int = 1500
    step_burnin: float = 0.05
    step_final: float = 0.005
    preconditioner_window: int = 100
    max_preconditioner: float = 1e4
    continuation_stages: int = 4
    tau_start_factor: float = 100.0
    init_std: float = 1.0
    init_log_std: float = -2.0
    trace_points: int = 300

    def __post_init__(self) -> None:
        require_count("sampler.n_optimise", self.n_optimise, minimum=0)
        require_count("sampler.n_burnin", self.n_burnin, minimum=0)
        require_count("sampler.n_samples", self.n_samples, minimum=1)
        require_positive("sampler.step_burnin", self.step_burnin)
        require_positive("sampler.step_final", self.step_final)
        require_count("sampler.preconditioner_window", self.preconditioner_window)
        require_positive("sampler.max_preconditioner", self.max_preconditioner)
        require_count("sampler.continuation_stages", self.continuation_stages)
        if not (math.isfinite(self.tau_start_factor) and self.tau_start_factor >= 1.0):
            raise ConfigError(
                f"sampler.tau_start_factor must be >= 1 and finite, got {self.tau_start_factor!r}"
            )
        require_positive("sampler.init_std", self.init_std)
        if not math.isfinite(self.init_log_std):
            raise ConfigError(f"sampler.init_log_std must be finite, got {self.init_log_std!r}")
        require_count("sampler.trace_points", self.trace_points, minimum=4)

    def step_sizes(self) -> np.ndarray:
        """Step ``h_t`` of every sampling step, shape (n_samples,)."""
        if self.n_samples == 1:
            return np.array([self.step_final])
        fraction = np.arange(self.n_samples) / (self.n_samples - 1)
        return self.step_burnin * (self.step_final / self.step_burnin) ** fraction


#: Shorter schedule for a peer's logistic release (a few dozen records, well-conditioned
#: posterior): used by :func:`private_logistic_peers` and :func:`private_peer_model` by default.
PEER_SETTINGS = SamplerSettings(n_optimise=100, n_burnin=300, n_samples=500, trace_points=100)


@dataclass(frozen=True, slots=True, kw_only=True)
class LangevinRun:
    """Final states (B, D), kept trace (B, T, D), final step size, frozen preconditioner (B, D)."""

    final: np.ndarray
    trace: np.ndarray
    final_step_size: float
    preconditioner: np.ndarray


#: ``target(z (B, D), anneal in [0, 1]) -> (log f (B,), grad log f (B, D))``, each chain's
#: unnormalised log density and its gradient; ``anneal = 1`` is the target itself.
Target = Callable[[np.ndarray, float], tuple[np.ndarray, np.ndarray]]

_FD_STEP = 1e-4  # finite-difference step of the curvature estimate


def _finite(g: np.ndarray) -> np.ndarray:
    """Gradients clipped to +-1e150 (so that squares stay finite; taming bounds the move)."""
    return np.clip(g, -1e150, 1e150)


def _diagonal_curvature(target: Target, z: np.ndarray) -> np.ndarray:
    """``|d^2 log f / dz_i^2|`` by central differences of the gradient, shape (B, D)."""
    curvature = np.empty(z.shape)
    for i in range(z.shape[1]):
        shifted = z.copy()
        shifted[:, i] += _FD_STEP
        upper = target(shifted, 1.0)[1][:, i]
        shifted[:, i] -= 2 * _FD_STEP
        curvature[:, i] = np.abs(upper - target(shifted, 1.0)[1][:, i]) / (2 * _FD_STEP)
    return curvature


def langevin(
    target: Target,
    z0: np.ndarray,
    *,
    settings: SamplerSettings,
    rng: np.random.Generator,
    noise_factor: float = 2.0,
) -> LangevinRun:
    """Tamed, diagonally preconditioned Langevin chains (the schedule of :class:`SamplerSettings`).

    1. L-BFGS ascent of ``log f`` (``continuation_stages`` stages with ``anneal`` from 0 to 1,
       at most ``n_optimise`` iterations each) moves every chain from its start towards a mode.
    2. The preconditioner starts at ``M = 1 / (|diag Hessian| + 1/max_preconditioner)`` (central
       differences), then ``n_burnin`` Langevin steps at ``step_burnin`` update it with a moving
       average of squared gradients (the diagonal Fisher information, ``E_f g^2 = -E_f H``).
    3. ``M`` is frozen and ``n_samples`` steps are taken with ``h`` decaying geometrically to
       ``step_final``; the last state of each chain is its sample.

    Each Langevin step, with ``g = sqrt(M) grad log f(z)`` and ``xi ~ N(0, I)``::

        z <- z + sqrt(M) * (h g / (1 + h |g|) + sqrt(noise_factor * h) * xi)

    Parameters
    ----------
    target : callable ``(z, anneal) -> (ndarray (B,), ndarray (B, D))``
        ``log f`` (up to a constant) and its gradient for a batch of states (B, D).
    z0 : ndarray, shape (B, D)
        Starting states (B independent chains), chosen without looking at the data.
    settings : SamplerSettings
    rng : numpy.random.Generator
    noise_factor : float
        2 is Langevin dynamics. Any other value targets another law (``f^(2/noise_factor)``):
        exposed only so the audit can show that its stationarity test catches a wrong step.

    Returns
    -------
    LangevinRun
    """
    from scipy.optimize import minimize

    z = np.array(z0, dtype=float)
    if z.ndim != 2:
        raise ConfigError(f"z0 must be a (chains, dim) array, got shape {z.shape}")
    cap = 1.0 / settings.max_preconditioner

    # Stage 1: L-BFGS ascent with the bound continuation (all chains in one separable problem).
    shape = z.shape
    stages = settings.continuation_stages
    for stage in range(stages if settings.n_optimise else 0):
        anneal = stage / (stages - 1) if stages > 1 else 1.0

        def objective(flat: np.ndarray, anneal: float = anneal) -> tuple[float, np.ndarray]:
            value, grad = target(flat.reshape(shape), anneal)
            return -float(value.sum()), -grad.ravel()

        result = minimize(
            objective, z.ravel(), jac=True, method="L-BFGS-B",
            options={"maxiter": settings.n_optimise},
        )  # fmt: skip
        if np.all(np.isfinite(result.x)):
            z = result.x.reshape(shape).copy()

    def move(g: np.ndarray, M_sqrt: np.ndarray, h: float) -> None:
        gy = M_sqrt * _finite(g)
        drift = h * gy / (1.0 + h * np.abs(gy))
        z[...] += M_sqrt * (drift + math.sqrt(noise_factor * h) * rng.standard_normal(z.shape))

    # Stage 2: Langevin burn-in adapting M.
    # At the mode: |diag Hessian| plus the squared gradient (a lower bound on the Fisher
    # information E g^2 >= (E g)^2; it matters along a log standard deviation whose density is
    # locally ~exp(c rho), curvature ~0 but gradient c, and whose scale is then 1/c).
    curvature = _diagonal_curvature(target, z) + _finite(target(z, 1.0)[1]) ** 2
    average = curvature.copy()
    keep = 1.0 / settings.preconditioner_window
    for _ in range(settings.n_burnin):
        g = _finite(target(z, 1.0)[1])
        move(g, 1.0 / np.sqrt(average + cap), settings.step_burnin)
        # M may grow at most 10-fold over its value at the mode: a chain that strays onto a
        # flat region (saturated records) would otherwise get ever larger steps and be lost.
        average = np.maximum((1 - keep) * average + keep * g * g, 0.1 * curvature)
    M = 1.0 / (average + cap)
    M_sqrt = np.sqrt(M)

    # Stage 3: sampling with M frozen.
    steps = settings.step_sizes()
    every = max(1, settings.n_samples // settings.trace_points)
    kept = []
    for t, h in enumerate(steps):
        move(target(z, 1.0)[1], M_sqrt, float(h))
        if (settings.n_samples - 1 - t) % every == 0:
            kept.append(z.copy())
    return LangevinRun(
        final=z, trace=np.stack(kept, axis=1), final_step_size=float(steps[-1]), preconditioner=M
    )


# --- diagnostics --------------------------------------------------------------------------------
def split_rhat(trace: np.ndarray) -> np.ndarray:
    """Split R-hat (Gelman et al., BDA3 11.4): chains halved, between/within variance.

    Parameters
    ----------
    trace : ndarray, shape (C, T, ...)
        ``C`` chains of ``T >= 4`` states each.

    Returns
    -------
    ndarray, shape (...)
        ~1 for mixed chains; > 1.01-1.1 signals chains that disagree. ``nan`` when every state
        is identical.
    """
    trace = np.asarray(trace, float)
    half = trace.shape[1] // 2
    halves = np.concatenate([trace[:, :half], trace[:, trace.shape[1] - half :]], axis=0)
    n = halves.shape[1]
    within = halves.var(axis=1, ddof=1).mean(axis=0)
    between = n * halves.mean(axis=1).var(axis=0, ddof=1)
    pooled = (n - 1) / n * within + between / n
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(pooled / within)


def effective_sample_size(trace: np.ndarray) -> np.ndarray:
    """Multi-chain effective sample size (Stan's estimator, Geyer's initial monotone sequence).

    Parameters
    ----------
    trace : ndarray, shape (C, T, ...)

    Returns
    -------
    ndarray, shape (...)
        In ``(0, C * T]``-ish (antithetic chains can exceed ``C T``); ``nan`` for constant traces.
    """
    trace = np.asarray(trace, float)
    C, T = trace.shape[:2]
    centred = trace - trace.mean(axis=1, keepdims=True)
    size = 1 << (2 * T - 1).bit_length()
    spectrum = np.fft.rfft(centred, n=size, axis=1)
    autocov = np.fft.irfft(spectrum * np.conj(spectrum), n=size, axis=1)[:, :T] / T
    chain_var = autocov[:, 0] * T / (T - 1)
    within = chain_var.mean(axis=0)
    pooled = (T - 1) / T * within + (trace.mean(axis=1).var(axis=0, ddof=1) if C > 1 else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (within - autocov.mean(axis=0)) / pooled  # (T, ...)
    rho[0] = 1.0
    n_pairs = T // 2
    pairs = rho[: 2 * n_pairs].reshape(n_pairs, 2, *rho.shape[1:]).sum(axis=1)
    positive = np.cumprod(pairs > 0, axis=0).astype(bool)  # initial positive sequence
    monotone = np.minimum.accumulate(np.where(positive, pairs, np.inf), axis=0)
    tau_hat = -1.0 + 2.0 * np.where(positive, monotone, 0.0).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return C * T / np.maximum(tau_hat, 1.0 / math.log10(max(C * T, 10)))


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainDiagnostics:
    """Convergence statistics of the chains behind one release (never released themselves).

    Attributes
    ----------
    rhat, ess : ndarray, shape (2p,)
        Split R-hat and effective sample size of every coordinate of ``z`` (means first, then
        log standard deviations), from the kept sampling-phase states of all chains.
    final_step_size : float
        ``h`` of the last step (preconditioned units).
    chains, n_burnin, n_samples, draws : int
        Chains run (chain 0 is released), burn-in and sampling steps, Monte-Carlo draws ``L``.
    """

    rhat: np.ndarray
    ess: np.ndarray
    final_step_size: float
    chains: int
    n_burnin: int
    n_samples: int
    draws: int

    @property
    def max_rhat_means(self) -> float:
        return float(np.nanmax(self.rhat[: len(self.rhat) // 2]))

    @property
    def min_ess_means(self) -> float:
        return float(np.nanmin(self.ess[: len(self.ess) // 2]))

    @property
    def max_rhat(self) -> float:
        return float(np.nanmax(self.rhat))

    @property
    def min_ess(self) -> float:
        return float(np.nanmin(self.ess))


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
