"""Figures and ``report.md`` from a results folder (:mod:`.write`, from the rows per grid point
of :mod:`.summary`, the figures of :mod:`.figures` and the text of :mod:`.markdown`), with the
protocol comparisons' figures (:mod:`.protocols`). Reads a results folder; never runs a
scenario."""

from p2pdp.core.errors import moved_into_modules

__getattr__ = moved_into_modules(__name__)
