"""Experiments: the top layer, which may import every other package and which none imports.

One subpackage per concept, each importing only those below it in this list (an import-linter
contract): :mod:`.cli` (the ``p2pdp`` command) on top; :mod:`.audit` (``p2pdp audit``) and
:mod:`.report` (figures and ``report.md`` from a results folder); :mod:`.run` (one fold,
:func:`p2pdp.simulate`, and whole grids, in-process or on a Dask cluster); :mod:`.network` (the
network runtime's host processes and data shards); :mod:`.results` (the results folder);
:mod:`.scenarios` (scenario files and what their settings disclose).
"""
