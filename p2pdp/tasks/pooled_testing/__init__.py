"""The pooled-testing workload: group testing with differential privacy.

:mod:`.pooling` the maths (estimators, the per-person privacy loss of a pooled result),
:mod:`.task` the ``pooled-testing`` task and the ``pooled-test`` mechanism, :mod:`.figures` the
study's and the report's figures, :mod:`.audit` the exact audit. Settings: the ``[pooling]``
table (:class:`p2pdp.config.tables.PoolingConfig`).
"""
