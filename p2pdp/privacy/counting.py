"""Mechanisms on 0/1 records: randomized response (local) and the Laplace count (central).

:class:`RandomizedResponse`: each respondent holds one private bit and releases only its noisy
answer, to the analyst (who may publish it). Neighbouring relation: one respondent's bit
changes; the guarantee is the exact epsilon of the worst likelihood ratio over both answers.

:func:`noisy_count`: the count of 1-records plus ``Laplace(1/epsilon)``, clamped to [0, n] and
released to the analyst. Neighbouring relation: *replace* one 0/1 record (``n`` public,
sensitivity 1). :func:`beta_bernoulli_update` turns such a count into a Beta posterior
(post-processing). The prevalence and pooled-testing workloads use both.

numpy generators are not cryptographically secure: fine for a simulator, not for deployment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import require_count, require_positive, require_probability


def _as_binary(name: str, values: ArrayLike) -> np.ndarray:
    """``values`` as a bool array; ConfigError unless every entry is 0/1 (or bool)."""
    array = np.asarray(values)
    if array.dtype != bool and not np.isin(array, (0, 1)).all():
        raise ConfigError(
            f"{name} must contain only 0/1 or booleans, got values {np.unique(array)}"
        )
    return array.astype(bool)


# --- randomized response --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class RandomizedResponse:
    """Binary randomized response, in the local model.

    Each respondent holds one private bit and releases only its noisy answer (to the analyst,
    who may publish it). Neighbouring relation: one respondent's bit changes. The guarantee is
    ``epsilon = max over answers of |ln(P(answer | 1) / P(answer | 0))|`` (:attr:`epsilon`).

    Build it with :meth:`keep` (answer truthfully with probability ``p``, else flip:
    ``epsilon = ln(p / (1 - p))``), :meth:`forced` (the seed's form: truthful with probability
    ``theta1``, otherwise "yes" with probability ``theta2``:
    ``epsilon = ln(1 + theta1 / ((1 - theta1) min(theta2, 1 - theta2)))``) or
    :meth:`from_epsilon`.

    Attributes
    ----------
    p_yes_given_yes, p_yes_given_no : float
        ``P(answer 1 | bit 1) > P(answer 1 | bit 0)``, both in [0, 1].
    """

    p_yes_given_yes: float
    p_yes_given_no: float

    def __post_init__(self) -> None:
        high = require_probability("p_yes_given_yes", self.p_yes_given_yes)
        low = require_probability("p_yes_given_no", self.p_yes_given_no)
        if not high > low:
            raise ConfigError(
                f"p_yes_given_yes must exceed p_yes_given_no (else answers carry no signal), "
                f"got {high!r} <= {low!r}"
            )

    @classmethod
    def keep(cls, p: float) -> RandomizedResponse:
        """Answer truthfully with probability ``p`` in (1/2, 1], else flip the bit."""
        p = require_probability("p", p, low=0.5, low_open=True)
        return cls(p_yes_given_yes=p, p_yes_given_no=1.0 - p)

    @classmethod
    def forced(cls, theta1: float, theta2: float) -> RandomizedResponse:
        """With probability ``theta1`` in (0, 1] answer truthfully, else "yes" w.p. ``theta2``."""
        theta1 = require_probability("theta1", theta1, low_open=True)
        theta2 = require_probability("theta2", theta2)
        forced_yes = (1.0 - theta1) * theta2
        return cls(p_yes_given_yes=theta1 + forced_yes, p_yes_given_no=forced_yes)

    @classmethod
    def from_epsilon(cls, epsilon: float) -> RandomizedResponse:
        """The keep form calibrated to ``epsilon``: ``p = e^eps / (1 + e^eps)``."""
        from scipy.special import expit

        return cls.keep(float(expit(require_positive("epsilon", epsilon))))

    def output_probabilities(self) -> np.ndarray:
        """``P[bit, answer]``, shape (2, 2); rows sum to 1."""
        yes = np.array([self.p_yes_given_no, self.p_yes_given_yes])
        return np.column_stack([1.0 - yes, yes])

    @property
    def epsilon(self) -> float:
        """Exact epsilon: ln of the worst likelihood ratio over both answers (inf if unbounded)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            log_p = np.log(self.output_probabilities())
            return float(np.nanmax(np.abs(log_p[1] - log_p[0])))

    def sample(self, bits: ArrayLike, *, rng: np.random.Generator) -> np.ndarray:
        """Noisy answers for private ``bits`` (0/1 or bool, any shape); bool array, same shape."""
        truth = _as_binary("bits", bits)
        p_yes = np.where(truth, self.p_yes_given_yes, self.p_yes_given_no)
        return rng.random(truth.shape) < p_yes

    def estimate_proportion(self, answers: ArrayLike) -> float:
        """Unbiased estimate of the proportion of 1-bits from noisy ``answers`` (shape (n,)).

        ``(mean(answers) - P(1|0)) / (P(1|1) - P(1|0))``; not clipped to [0, 1] (clipping would
        bias it). Its variance is :meth:`estimator_variance`.
        """
        noisy = _as_binary("answers", answers)
        if noisy.size == 0:
            raise ConfigError("answers must be non-empty, got 0 answers")
        gap = self.p_yes_given_yes - self.p_yes_given_no
        return float((noisy.mean() - self.p_yes_given_no) / gap)

    def estimator_variance(self, proportion: float, n: int) -> float:
        """Variance of :meth:`estimate_proportion` over ``n`` answers at true ``proportion``.

        ``q (1 - q) / (n (P(1|1) - P(1|0))^2)`` with ``q = P(answer 1)``; plug in the estimate
        (clipped to [0, 1]) for an estimated variance.
        """
        proportion = require_probability("proportion", proportion)
        n = require_count("n", n)
        gap = self.p_yes_given_yes - self.p_yes_given_no
        q = self.p_yes_given_no + gap * proportion
        return q * (1.0 - q) / (n * gap**2)


# --- noisy count --------------------------------------------------------------------------------
def noisy_count(records: ArrayLike, epsilon: float, *, rng: np.random.Generator) -> float:
    """epsilon-DP count of 1-records: ``sum(records) + Laplace(1/epsilon)``, clamped to [0, n].

    Neighbouring relation: *replace* one 0/1 record, so ``n`` is public and the count changes
    by at most 1 (sensitivity 1). Clamping to [0, n] is post-processing. Released to the
    analyst (Hatlelid et al. 2021: feeds :func:`beta_bernoulli_update`).

    Parameters
    ----------
    records : array_like of 0/1 or bool, shape (n,)
    epsilon : float
        > 0.
    rng : numpy.random.Generator

    Returns
    -------
    float
        In [0, n].
    """
    values = _as_binary("records", records)
    epsilon = require_positive("epsilon", epsilon)
    return float(np.clip(values.sum() + rng.laplace(0.0, 1.0 / epsilon), 0, values.size))


def beta_bernoulli_update(a: float, b: float, count: float, n: int) -> tuple[float, float]:
    """Beta posterior from a (noisy) count: ``(a + count, b + n - count)``.

    Parameters
    ----------
    a, b : float
        Prior Beta parameters, > 0.
    count : float
        Number of 1-records among ``n``, e.g. from :func:`noisy_count`; in [0, n].
    n : int
        Number of records, >= 0.
    """
    a = require_positive("a", a)
    b = require_positive("b", b)
    n = require_count("n", n, minimum=0)
    count = require_probability("count", count, high=float(n))
    return a + count, b + n - count
