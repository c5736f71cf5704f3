"""The one tolerance every budget comparison of :mod:`p2pdp.privacy` shares.

Below every module that compares spent to total epsilon (the accountants, the ledger, GDP's
and the clipped Gaussian's counts), so that each reads the same constant without an import
cycle (:mod:`p2pdp.privacy.accountants` imports :mod:`p2pdp.privacy.gdp`).
"""

from __future__ import annotations

__all__ = ["BUDGET_TOLERANCE"]

#: Relative tolerance when comparing spent to total epsilon (and delta), so that float error
#: in e.g. ``3 * 0.1 = 0.30000000000000004`` does not cost a peer an aggregation: a count of
#: releases fits a budget when what it spends is <= ``total * (1 + BUDGET_TOLERANCE)``.
BUDGET_TOLERANCE = 1e-9
