"""Scenario files: a base config plus grid axes (:mod:`.scenario`; a document's keys and
values, :mod:`.document`; the command line's ``--set`` and ``--unset``, :mod:`.overrides`), and
what a scenario's settings disclose outside any privacy budget (:mod:`.disclosure`). The bottom
of the experiment layer: it imports no other experiments subpackage."""
