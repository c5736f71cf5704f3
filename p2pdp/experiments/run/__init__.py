"""Running: one fold of a scenario (:func:`.simulation.simulate`, both protocol families:
:mod:`.oneshot`, :mod:`.iterative`; what a run returns, :mod:`.result`; the phases both time,
:mod:`.phases`), a whole grid into a results folder (:mod:`.runner`; its cells, :mod:`.cells`;
its backends, :mod:`.workers` and :mod:`.dask_backend`; its progress line, :mod:`.progress`)
and the Dask cluster's split of one large run (:mod:`.cluster`). Imports
:mod:`p2pdp.experiments.network`, :mod:`~p2pdp.experiments.results` and
:mod:`~p2pdp.experiments.scenarios`."""
