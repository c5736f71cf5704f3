"""Scenario files: a base config plus grid axes (:mod:`.scenario`), and what a scenario's
settings disclose outside any privacy budget (:mod:`.disclosure`). The bottom of the experiment
layer: it imports no other experiments subpackage."""
