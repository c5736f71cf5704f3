"""Exact privacy audit of pooled testing, in its own threat model.

The law of one member's pooled test result (optionally through randomized response) is
enumerated over all statuses of the other members, iid Bernoulli(p) and unknown to the
adversary (:func:`exact_pooled_test_epsilon`), and compared with the claimed closed form
:func:`~p2pdp.tasks.pooled_testing.pooling.individual_epsilon`. That guarantee is
distributional, not worst-case DP: the negative control ``pooled-test-known-others`` of
``p2pdp audit`` (:mod:`p2pdp.experiments.audit.table`) audits the same claim against an
adversary who knows the other members are negative, and must fail.
"""

from __future__ import annotations

from p2pdp.privacy.counting import RandomizedResponse
from p2pdp.tasks.pooled_testing import pooling


def exact_pooled_test_epsilon(
    prevalence: float,
    pool_size: int,
    sensitivity: float,
    specificity: float,
    *,
    response: RandomizedResponse | None = None,
) -> float:
    """Exact privacy loss of one member of a pooled test, others iid Bernoulli(p), unknown.

    Enumerates the law ``P(z | x)`` over all ``2^(c-1)`` statuses of the other members
    (:func:`~p2pdp.tasks.pooled_testing.pooling.enumerated_outcome_probabilities`), passes it
    through the
    randomized response's channel matrix if ``response`` is given, and returns the worst
    ``|ln P(z | 1) / P(z | 0)|``. ``prevalence = 0`` is the adversary who knows the others are
    negative: the worst case, equal to the unpooled test's epsilon.
    """
    law = pooling.enumerated_outcome_probabilities(prevalence, pool_size, sensitivity, specificity)
    if response is not None:
        law = law @ response.output_probabilities()
    return pooling.epsilon_of_law(law)
