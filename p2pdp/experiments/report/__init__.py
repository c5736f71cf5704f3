"""Figures and ``report.md`` from a results folder (:mod:`.write`), with the protocol
comparisons' figures (:mod:`.protocols`). Reads a results folder; never runs a scenario."""
