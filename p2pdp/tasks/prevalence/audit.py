"""Exact privacy audit of the ``randomized-response`` task's release.

The ``local`` mechanism (``randomized-response`` task: a group releases the sum of its members'
randomized answers, no curator noise) is audited exactly on that yes count against the local
epsilon it declares (:func:`exact_rr_count_epsilon`); ``p2pdp audit`` shows it as
``local-rr-count`` (:mod:`p2pdp.experiments.audit.table`).
"""

from __future__ import annotations

import numpy as np

from p2pdp.core.validation import require_count
from p2pdp.privacy.counting import RandomizedResponse
from p2pdp.tasks.prevalence.estimators import rr_count_log_likelihood


def exact_rr_count_epsilon(response: RandomizedResponse, n: int) -> float:
    """Exact epsilon of releasing the number of "yes" answers of ``n`` randomized records.

    What the ``local`` mechanism releases for the ``randomized-response`` task (the sum of a
    group's answers, no curator noise). Neighbouring inputs: ``k`` vs ``k + 1`` true 1-records
    (one record changes); the law of the yes count is the convolution of
    ``Binomial(k, P(1|1))`` and ``Binomial(n - k, P(1|0))``
    (:func:`~p2pdp.tasks.prevalence.estimators.rr_count_log_likelihood`); the worst ``|log ratio|``
    over every
    count and every ``k``. Never above ``response.epsilon`` (post-processing).
    """
    n = require_count("n", n)
    log_law = np.array([rr_count_log_likelihood(y, n, response) for y in range(n + 1)])
    return float(np.abs(np.diff(log_law, axis=1)).max())  # log_law[y, k]
