"""Experiments: scenario files and sweeps, running one fold (:func:`p2pdp.simulate`) and whole
grids, the results folder, reports, disclosure of non-private steps, audits and the ``p2pdp``
command. The top layer: it may import every other package, none imports it.
"""
