"""Figures and ``report.md`` from a results folder (:mod:`.write`), with the protocol
comparisons' figures (:mod:`.protocols`). Reads a results folder; never runs a scenario."""

from p2pdp.core.errors import moved_into_modules

__getattr__ = moved_into_modules(__name__)
