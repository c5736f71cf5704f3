"""Learning: local models (:mod:`.models`), ensemble rules (:mod:`.rules`; their maths,
:mod:`.ensembles`), evaluation metrics (:mod:`.evaluation`), the centralised reference
(:mod:`.references`), the ``[training]`` and ``[evaluation]`` settings (:mod:`.settings`) and
every peer's shard with its clipped logistic gradients for the iterative protocols
(:mod:`.local_problem`).
"""
