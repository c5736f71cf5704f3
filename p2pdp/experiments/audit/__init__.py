"""``p2pdp audit``: the table of every shipped mechanism's audit (:mod:`.table`), and the
whole-run audits of the iterative protocols (:mod:`.iterative`) and of correlated noise
(:mod:`.correlated`). Imports no other experiments subpackage."""

from p2pdp.core.errors import moved_into_modules

__getattr__ = moved_into_modules(__name__)
