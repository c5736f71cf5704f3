"""What output-perturbation noise is calibrated to: the sensitivity and the Gaussian's sigma.

:func:`group_sensitivity` is the L2 sensitivity ``Delta_2`` of a group's average of exact
L2-regularised logistic-regression models, under the neighbouring relation of the one-shot
protocol: *replace* one record of one member's shard (rows of L2 norm <= 1). Every
:class:`~p2pdp.privacy.mechanisms.Mechanism` scales its noise to it.

:func:`analytic_gaussian_sigma` is the smallest ``sigma`` for which ``N(0, sigma^2 I)`` noise
on a vector of L2 sensitivity ``D`` is (epsilon, delta)-DP (Balle & Wang 2018): the
``gaussian`` mechanism's noise multiplier, and the noise multiplier of the event the ``rdp``
and ``gdp`` accountants compose for a release calibrated to ``(epsilon_A, delta_A)``.

Nothing here draws noise or releases anything: both are functions of public parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import require_positive, require_probability

SENSITIVITY_MODES: tuple[str, ...] = ("group-mean", "pathak")


def _is_count(n: object) -> bool:
    if not isinstance(n, (int, float, np.integer, np.floating)) or isinstance(n, bool):
        return False
    return bool(math.isfinite(n) and n >= 1 and n == int(n))


# --- sensitivity --------------------------------------------------------------------------------
def group_sensitivity(
    shard_sizes: Sequence[int] | np.ndarray,
    lam: float,
    *,
    mode: str = "group-mean",
    gradient_tolerance: float = 0.0,
    lipschitz: float = 1.0,
) -> float:
    """L2 sensitivity of a group's average of exact L2-regularised logistic-regression models.

    Replacing one record of member ``j`` (rows of L2 norm <= 1, lambda-strongly convex objective,
    exact minimiser) moves its model by at most ``2 / (n_j * lam)`` (Chaudhuri et al. 2011), and
    the group average ``(1/K) sum_j w_j`` by at most ``2 / (K * n_j * lam)``.

    Parameters
    ----------
    shard_sizes : sequence of int, shape (K,)
        Number of records of each member, all >= 1; ``K >= 1``.
    lam : float
        Regularisation strength lambda > 0.
    mode : {"group-mean", "pathak"}
        ``"group-mean"`` (default): ``2 / (K * n_min * lam)``, the sensitivity of the average.
        ``"pathak"``: ``2 / (n_min * lam)``, the seed's (Pathak et al. 2010) bound: valid but
        ``K`` times larger, i.e. ``K`` times more noise than needed.
    gradient_tolerance : float
        Bound ``tau >= 0`` on the gradient norm every local model was solved to. A model with
        ``||grad J|| <= tau`` lies within ``tau / lam`` of the exact minimiser (lambda-strong
        convexity), so a released model moves by at most ``2 (1/n_j + tau) / lam`` and the
        bounds above become ``2 (1/n_min + tau) / (K lam)`` and ``2 (1/n_min + tau) / lam``.
        The simulator passes the solver's tolerance (1e-9): a negligible, honest correction.
    lipschitz : float
        Lipschitz constant ``L`` of the loss in ``w`` for rows of norm <= 1 (1 for the
        logistic loss); the bounds scale as ``2 (L/n_min + tau) / ...``.

    Returns
    -------
    float
        ``Delta_2`` in the same units as the model weights.
    """
    # Plain Python on the (short) list: this runs once per aggregation in the simulator.
    sizes = shard_sizes.tolist() if isinstance(shard_sizes, np.ndarray) else list(shard_sizes)
    if not sizes or any(isinstance(n, (list, tuple)) for n in sizes):
        raise ConfigError(f"shard_sizes must be a non-empty 1-D sequence, got {shard_sizes!r}")
    plain = all(type(n) is int for n in sizes)  # the simulator's case: skip the slow check
    if not (min(sizes) >= 1 if plain else all(_is_count(n) for n in sizes)):
        raise ConfigError(f"shard_sizes must be integers >= 1, got {shard_sizes!r}")
    lam = require_positive("lam", lam)
    if not (math.isfinite(gradient_tolerance) and gradient_tolerance >= 0):
        raise ConfigError(f"gradient_tolerance must be >= 0 and finite, got {gradient_tolerance!r}")
    pathak = 2.0 * (lipschitz / min(sizes) + gradient_tolerance) / lam
    if mode == "pathak":
        return pathak
    if mode == "group-mean":
        return pathak / len(sizes)
    raise ConfigError(f"mode must be one of {SENSITIVITY_MODES}, got {mode!r}")


# --- analytic Gaussian calibration ----------------------------------------------------------------
def _gaussian_log_delta(log_sigma: float, epsilon: float, sensitivity: float) -> float:
    """``log delta(sigma)``, the exact privacy profile of the Gaussian mechanism at ``epsilon``.

    ``delta(sigma) = Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D)`` (Balle & Wang 2018,
    Theorem 8), evaluated as ``Phi(A) * (1 - exp(eps + log Phi(B) - log Phi(A)))`` in log space.
    """
    from scipy.special import log_ndtr

    sigma = math.exp(log_sigma)
    half = sensitivity / (2.0 * sigma)
    shift = epsilon * sigma / sensitivity
    log_first = float(log_ndtr(half - shift))
    remainder = -math.expm1(epsilon + float(log_ndtr(-half - shift)) - log_first)
    return log_first + math.log(remainder) if remainder > 0 else -math.inf


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest ``sigma`` for which ``N(0, sigma^2 I)`` noise is (epsilon, delta)-DP.

    Analytic Gaussian mechanism (Balle & Wang 2018, Algorithm 1): solves the exact condition
    ``Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D) <= delta`` for ``s`` (the left side
    decreases in ``s``) by root finding in ``log s``, then steps up until the condition holds,
    so the returned value is never below the exact calibration. Valid for every ``epsilon > 0``
    (the classic ``D sqrt(2 ln(1.25/delta)) / eps`` needs ``epsilon < 1`` and is larger).

    Parameters
    ----------
    epsilon : float
        > 0.
    delta : float
        In (0, 1).
    sensitivity : float
        L2 sensitivity ``D`` > 0.

    Returns
    -------
    float
        Per-coordinate standard deviation, same units as ``sensitivity``.
    """
    from scipy.optimize import brentq

    epsilon = require_positive("epsilon", epsilon)
    delta = require_probability("delta", delta, low_open=True, high_open=True)
    sensitivity = require_positive("sensitivity", sensitivity)
    log_delta = math.log(delta)

    def excess(log_sigma: float) -> float:
        return _gaussian_log_delta(log_sigma, epsilon, sensitivity) - log_delta

    start = math.log(sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon)
    low = high = start
    while excess(low) <= 0:
        low -= 1.0
    while excess(high) > 0:
        high += 1.0
    root = brentq(excess, low, high, xtol=1e-14)
    while excess(root) > 0:
        root += 1e-13 * max(1.0, abs(root))
    return math.exp(root)
