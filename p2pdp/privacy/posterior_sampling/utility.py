"""The utility ``U(z; x)`` of the posterior-sampling exponential mechanism, and its sensitivity.

``U`` is the evidence lower bound of a mean-field Gaussian ``Q(theta | z)``, ``z = (mu, rho)``,
over the per-record log-likelihoods bounded by ``gamma = tau tanh(l / tau)``
(:func:`bounded_log_likelihood`), estimated with ``L`` draws fixed before and independently of
the data (:func:`common_random_numbers`), with its exact gradient (:func:`elbo`). Two models
(:class:`LinearRegression`, :class:`LogisticRegression`) give the log-likelihood and the prior.

Sensitivity: for data sets of the same size that differ by *replacing* one record, ``U``
changes by at most the width of ``gamma``'s range, ``Delta_U = 2 tau`` (``tau`` for a
log-likelihood that is never positive, logistic regression): :func:`utility_sensitivity`. The
derivation, the release and what is released to whom are in
:mod:`p2pdp.privacy.posterior_sampling.posterior`. Nothing here is released; the one random
function, :func:`common_random_numbers`, takes an explicit generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import require_count, require_positive

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
