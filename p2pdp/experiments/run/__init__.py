"""Running: one fold of a scenario (:func:`.simulation.simulate`, both protocol families:
:mod:`.oneshot`, :mod:`.iterative`; what a run returns, :mod:`.result`; the phases both time,
:mod:`.phases`), a whole grid into a results folder (:mod:`.runner`) and the Dask cluster
(:mod:`.cluster`). Imports :mod:`p2pdp.experiments.network.launch`,
:mod:`~p2pdp.experiments.results` and :mod:`~p2pdp.experiments.scenarios`."""
