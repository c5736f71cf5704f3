"""``p2pdp audit``: every mechanism p2pdp ships, audited against the guarantee it claims.

One table over the privacy layer's mechanisms (threshold test, exact noisy count:
:mod:`p2pdp.privacy.audit`), the workloads' exact audits (:mod:`p2pdp.tasks.prevalence.audit`,
:mod:`p2pdp.tasks.pooled_testing.audit`) and the posterior-sampling audits
(:mod:`p2pdp.privacy.posterior_sampling.audit`), one private step of the iterative protocols
(``clipped-gaussian``: clipping and noise as the protocols compute them) and whole runs of
the iterative protocols (:mod:`p2pdp.experiments.audit.iterative`), with negative controls
that must fail (which shows each test has power).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from functools import partial

import numpy as np

from p2pdp.core.errors import ConfigError, PrivacyWarning
from p2pdp.core.rng import generator
from p2pdp.core.validation import require_positive
from p2pdp.privacy.audit import (
    STATISTICS,
    AuditResult,
    ThresholdTest,
    audit_additive_noise,
    exact_noisy_count_epsilon,
    exponential_norm_vector_laplace,
)
from p2pdp.privacy.counting import RandomizedResponse
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.privacy.posterior_sampling.audit import POSTERIOR_EXPECTED_TO_FAIL
from p2pdp.tasks.pooled_testing import pooling
from p2pdp.tasks.pooled_testing.audit import exact_pooled_test_epsilon
from p2pdp.tasks.prevalence.audit import exact_rr_count_epsilon
from p2pdp.tasks.prevalence.estimators import two_coin_response

#: Mechanisms audited by :func:`run_audit`, in table order.
AUDIT_NAMES: tuple[str, ...] = (
    "vector-laplace",
    "coordinate-laplace",
    "gaussian",
    "seed-laplace",
    "vector-laplace-exponential-norm",
    "randomized-response",
    "randomized-response-two-coin",
    "noisy-count",
    "local-rr-count",
    "pooled-test",
    "pooled-test-rr",
    "pooled-test-known-others",
    "clipped-gaussian",
    "clipped-gaussian-unclipped",
    "secure-aggregation",
    "secure-aggregation-k-way-shares",
)


#: Negative controls: the audit is expected to flag these.
EXPECTED_TO_FAIL: dict[str, str] = {
    "seed-laplace": "sqrt(d)*eps-DP",
    "vector-laplace-exponential-norm": "Exponential norm bug",
    "pooled-test-known-others": "not worst-case DP",
    "clipped-gaussian-unclipped": "gradients not clipped",
    "secure-aggregation-k-way-shares": "K-way noise shares",
}


AUDIT_EPSILON = 1.0


AUDIT_DELTA = 1e-5  # for the gaussian mechanism


#: Outputs per side of each threshold test (``p2pdp audit --samples``); far fewer may let a
#: negative control pass.
AUDIT_SAMPLES = 100_000


AUDIT_DIM = 58  # spambase: 57 features + bias


AUDIT_COUNT_RECORDS = 10  # n of the noisy-count audit


AUDIT_TWO_COIN_THETA2 = 0.3  # forced-"yes" probability of the two-coin audit (asymmetric)


#: Pooled-test audit: pool size, prevalence, the seed's (Se, Sp), and the keep probability of
#: the randomized response on the result (``pooled-test-rr``).
AUDIT_POOL = {"pool_size": 5, "prevalence": 0.05, "sensitivity": 0.85, "specificity": 0.75}


AUDIT_POOL_KEEP = 0.8


def _audit_pooled(name: str) -> AuditResult:
    """The pooled-test rows: exact loss against the claimed :func:`pooling.individual_epsilon`."""
    setting = dict(AUDIT_POOL)
    response = RandomizedResponse.keep(AUDIT_POOL_KEEP) if name == "pooled-test-rr" else None
    se, sp = setting.pop("sensitivity"), setting.pop("specificity")
    claimed_se, claimed_sp = (
        (se, sp) if response is None else pooling.effective_accuracy(se, sp, response)
    )
    claimed = float(
        pooling.individual_epsilon(
            setting["prevalence"], setting["pool_size"], claimed_se, claimed_sp
        )
    )
    adversary_prior = 0.0 if name == "pooled-test-known-others" else setting["prevalence"]
    exact = exact_pooled_test_epsilon(
        adversary_prior, int(setting["pool_size"]), se, sp, response=response
    )
    return AuditResult(
        mechanism=name,
        epsilon=claimed,
        delta=0.0,
        eps_lb=exact,
        passed=exact <= claimed * (1 + 1e-9),
        expected_pass=name not in EXPECTED_TO_FAIL,
        guarantee_epsilon=exact,
        method="exact, others unknown" if adversary_prior else "exact, others known",
    )


#: Clipping norm of the clipped-Gaussian audit (the records' gradients have norm 0.5 at w = 0).
AUDIT_CLIP = 0.25


def _audit_clipped_gaussian(
    name: str, *, n_samples: int, rng: np.random.Generator, epsilon: float, delta: float, dim: int
) -> AuditResult:
    """One private step of the iterative protocols, end to end (:mod:`p2pdp.privacy.
    clipped_gaussian` through :meth:`p2pdp.learning.local_problem.LocalProblem.clipped_sums`).

    Two neighbouring shards (replace one record): the replaced record's label flips, so its
    logistic gradient at ``w = 0`` (norm 0.5) turns around. The step's noise is calibrated for
    one step at ``(epsilon, delta)`` (exact GDP: ``z = 2 / mu``); the audit's shift is the
    difference of the two *clipped sums the code computes*, so it is ``2 C`` when clipping
    works. The negative control sums the same records unclipped (shift ``4 C``) under the same
    noise.
    """
    from p2pdp.learning.local_problem import LocalProblem
    from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
    from p2pdp.privacy.gdp import gdp_mu

    z = 2.0 / gdp_mu(epsilon, delta)
    noise = ClippedGaussianSum(clip_norm=AUDIT_CLIP, noise_multiplier=z)
    summing = noise if name == "clipped-gaussian" else ClippedGaussianSum(
        clip_norm=1.0, noise_multiplier=z
    )  # fmt: skip
    direction = np.full(dim, 1 / math.sqrt(dim))
    other = np.zeros(dim)
    other[0] = 1.0
    X = np.vstack([direction, other])
    sums = []
    for label in (1.0, -1.0):
        problem = LocalProblem(X=X, y=np.array([label, 1.0]), indptr=np.array([0, 2]), lam=1.0)
        sums.append(problem.clipped_sums(np.zeros((1, dim)), np.array([0]), summing, rng)[0])
    shift = float(np.linalg.norm(sums[1] - sums[0]))

    def sample(*, size: int, rng: np.random.Generator) -> np.ndarray:
        return noise.noise((size, dim), rng)

    test = audit_additive_noise(
        sample, sensitivity=shift, dim=dim, delta=delta, n_samples=n_samples, rng=rng
    )
    return _threshold_result(name, epsilon, delta, epsilon, test, n_samples=n_samples, dim=dim)


#: Members of the secure-aggregation audit's group (2: a member that subtracts its own share
#: of a K-way split keeps only half the noise, the largest shortfall of that bug).
AUDIT_SECURE_MEMBERS = 2


def _audit_secure_aggregation(
    name: str, *, n_samples: int, rng: np.random.Generator, epsilon: float, delta: float
) -> AuditResult:
    """The group mean by secure aggregation, end to end (:mod:`p2pdp.privacy.secure_aggregation`:
    each member's noise share, fixed-point encoding, secret sharing, the curator's decoding),
    audited against the curator, a member that knows its own model and noise share.

    Neighbours: the other member's model is 0 or ``K`` (its record moves the mean by the
    sensitivity 1). The curator's view is the release minus its own model's ``1 / K`` and its
    own share; ``n_samples`` independent rounds per side (one coordinate each, in one run of
    the protocol over ``n_samples`` coordinates: the shares and the sharing are per
    coordinate). The claim is the Gaussian mechanism at ``(epsilon, delta)``, exactly
    ``mu``-GDP with ``mu = 1 / sigma``: audited by :func:`~p2pdp.privacy.audit.
    gdp_threshold_test`, ``eps_lb`` the epsilon of its ``mu`` lower bound at ``delta``. The
    negative control splits the noise K ways instead of ``K - 1``: the curator, subtracting
    its share, is left with ``(K - 1) / K`` of the variance.
    """
    from p2pdp.privacy.audit import gdp_threshold_test
    from p2pdp.privacy.gdp import gdp_epsilon
    from p2pdp.privacy.secure_aggregation import draw_noise_shares, secure_noisy_mean

    mechanism = make_mechanism("gaussian", epsilon=epsilon, delta=delta)
    members = AUDIT_SECURE_MEMBERS
    sigma = float(mechanism.noise_std(1.0, 1))
    mu = 1.0 / sigma

    def curator_view(other: float) -> np.ndarray:
        if name == "secure-aggregation":
            shares = draw_noise_shares(
                mechanism, sensitivity=1.0, n_members=members, dim=n_samples, rng=rng
            )
        else:  # the control: shares of a K-way split
            shares = np.asarray(mechanism.noise_shares(1.0, n_samples, members, rng=rng))
        models = np.zeros((members, n_samples))
        models[1] = other
        release = secure_noisy_mean(models, shares, curator=0, rng=rng).total
        return release - models[0] / members - shares[0]

    mu_lb, test = gdp_threshold_test(curator_view(0.0), curator_view(float(members)))
    real_mu = mu if name == "secure-aggregation" else mu * math.sqrt(members / (members - 1))
    return AuditResult(
        mechanism=name,
        epsilon=epsilon,
        delta=delta,
        eps_lb=float(gdp_epsilon(mu_lb, delta)) if mu_lb > 0 else 0.0,
        passed=mu_lb <= mu,
        expected_pass=name not in EXPECTED_TO_FAIL,
        guarantee_epsilon=float(gdp_epsilon(real_mu, delta)),
        method="gdp-threshold-test",
        dim=1,
        n_samples=n_samples,
        statistic="projection",
        threshold=test.threshold,
        fpr_upper=test.fpr_upper,
        fnr_upper=test.fnr_upper,
    )


def audit_mechanism(
    name: str,
    *,
    n_samples: int,
    rng: np.random.Generator,
    epsilon: float = AUDIT_EPSILON,
    delta: float = AUDIT_DELTA,
    dim: int = AUDIT_DIM,
) -> AuditResult:
    """Audit one of :data:`AUDIT_NAMES` at ``epsilon`` (and ``delta`` for gaussian) in ``dim``.

    The additive mechanisms use sensitivity 1 (the audit is scale invariant). The pooled-test
    rows ignore ``epsilon``: their claim is :func:`pooling.individual_epsilon` at
    :data:`AUDIT_POOL`.
    """
    if name not in AUDIT_NAMES:
        raise ConfigError(f"mechanism must be one of {AUDIT_NAMES}, got {name!r}")
    epsilon = require_positive("epsilon", epsilon)
    expected_pass = name not in EXPECTED_TO_FAIL
    if name == "randomized-response":
        exact = RandomizedResponse.from_epsilon(epsilon).epsilon
        return AuditResult.exact(name, epsilon, exact, expected_pass=expected_pass)
    if name == "randomized-response-two-coin":
        law = two_coin_response(epsilon, AUDIT_TWO_COIN_THETA2).output_probabilities()
        return AuditResult.exact(
            name, epsilon, pooling.epsilon_of_law(law), expected_pass=expected_pass
        )
    if name.startswith("pooled-test"):
        return _audit_pooled(name)
    if name.startswith("secure-aggregation"):
        return _audit_secure_aggregation(
            name, n_samples=n_samples, rng=rng, epsilon=epsilon, delta=delta
        )
    if name.startswith("clipped-gaussian"):
        return _audit_clipped_gaussian(
            name, n_samples=n_samples, rng=rng, epsilon=epsilon, delta=delta, dim=dim
        )
    if name == "noisy-count":
        exact = exact_noisy_count_epsilon(epsilon, AUDIT_COUNT_RECORDS)
        return AuditResult.exact(name, epsilon, exact, expected_pass=expected_pass)
    if name == "local-rr-count":  # mechanism "local": claims the answers' local epsilon
        claimed = make_mechanism("local", epsilon=epsilon).guarantee(1)[0]
        response = two_coin_response(epsilon, AUDIT_TWO_COIN_THETA2)
        exact = exact_rr_count_epsilon(response, AUDIT_COUNT_RECORDS)
        return AuditResult.exact(name, claimed, exact, expected_pass=expected_pass)
    if name == "vector-laplace-exponential-norm":
        sampler = exponential_norm_vector_laplace(epsilon, 1.0, dim)
        claimed_delta, guarantee = 0.0, math.inf
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PrivacyWarning)  # seed-laplace: audited on purpose
            mechanism = make_mechanism(
                name, epsilon=epsilon, delta=delta if name == "gaussian" else None
            )
        claimed_delta, guarantee = mechanism.delta, mechanism.guarantee(dim)[0]
        sampler = partial(mechanism.sample, 1.0, dim)

    test = audit_additive_noise(
        sampler, sensitivity=1.0, dim=dim, delta=claimed_delta, n_samples=n_samples, rng=rng
    )
    return _threshold_result(
        name, epsilon, claimed_delta, guarantee, test, n_samples=n_samples, dim=dim
    )


def _threshold_result(
    name: str,
    epsilon: float,
    delta: float,
    guarantee: float,
    test: ThresholdTest,
    *,
    n_samples: int,
    dim: int,
) -> AuditResult:
    """The row of a threshold-test audit: passed when the test's lower bound <= ``epsilon``."""
    return AuditResult(
        mechanism=name,
        epsilon=epsilon,
        delta=delta,
        eps_lb=test.eps_lb,
        passed=test.eps_lb <= epsilon,
        expected_pass=name not in EXPECTED_TO_FAIL,
        guarantee_epsilon=guarantee,
        method="threshold-test",
        dim=dim,
        n_samples=n_samples,
        statistic=STATISTICS[test.statistic],
        threshold=test.threshold,
        fpr_upper=test.fpr_upper,
        fnr_upper=test.fnr_upper,
    )


def run_audit(
    names: Sequence[str] = AUDIT_NAMES, *, n_samples: int = AUDIT_SAMPLES, seed: int
) -> list[AuditResult]:
    """Audit each of ``names``, each on its own random stream ``(seed, "audit", name)``."""
    return [
        audit_mechanism(name, n_samples=n_samples, rng=generator(seed, "audit", name))
        for name in names
    ]


def _expected_failure(name: str) -> str:
    """Why the negative control ``name`` must fail (this module's, the iterative protocols',
    correlated D-PSGD's or the posterior audit's)."""
    from p2pdp.experiments.audit.correlated import CORRELATED_EXPECTED_TO_FAIL
    from p2pdp.experiments.audit.iterative import ITERATIVE_EXPECTED_TO_FAIL

    for reasons in (
        EXPECTED_TO_FAIL,
        ITERATIVE_EXPECTED_TO_FAIL,
        CORRELATED_EXPECTED_TO_FAIL,
        POSTERIOR_EXPECTED_TO_FAIL,
    ):
        if name in reasons:
            return reasons[name]
    return "negative control"


def _too_small(result: AuditResult) -> str:
    """Why a negative control may have passed: a sample below the audit's default (a test
    with too few outputs or canaries cannot tell the flawed mechanism from a sound one)."""
    from p2pdp.experiments.audit.iterative import AUDIT_CANARIES, AUDIT_RUNS

    if result.passed and not result.expected_pass:
        if result.n_samples is not None and result.n_samples < AUDIT_SAMPLES:
            return (
                f": the sample may be too small to catch it ({result.n_samples} outputs per "
                f"side; the audit's default is --samples {AUDIT_SAMPLES})"
            )
        if result.canaries is not None and result.canaries < AUDIT_RUNS * AUDIT_CANARIES:
            return (
                f": the sample may be too small to catch it ({result.canaries} canaries; the "
                f"audit's default is --runs {AUDIT_RUNS}, {AUDIT_RUNS * AUDIT_CANARIES} canaries)"
            )
    return ""


def format_audit_table(results: Sequence[AuditResult]) -> str:
    """Readable fixed-width table of audit results."""
    header = (
        f"{'mechanism':<36} {'epsilon':>7} {'delta':>7} {'eps_lb':>7} {'guarantee':>9} "
        f"{'method':<28} result"
    )
    lines = [header, "-" * len(header)]
    for result in results:
        method = result.method
        if result.statistic is not None:
            method = f"test on {result.statistic}"
        elif result.canaries is not None:
            method = f"one run, {result.canaries} canaries"
        verdict = "pass" if result.passed else "FAIL"
        if not result.expected_pass:
            verdict += f", expected: fail ({_expected_failure(result.mechanism)})"
        if not result.as_expected:
            verdict += ", UNEXPECTED" + _too_small(result)
        lines.append(
            f"{result.mechanism:<36} {result.epsilon:>7.4g} {result.delta:>7g} "
            f"{result.eps_lb:>7.3f} {result.guarantee_epsilon:>9.3g} {method:<28} {verdict}"
        )
    return "\n".join(lines)
