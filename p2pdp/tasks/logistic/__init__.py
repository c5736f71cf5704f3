"""The logistic workload (the source system): every peer trains L2-regularised logistic
regression, groups publish noisy averages, every peer classifies with an ensemble.

:mod:`.task` is the ``logistic`` task. Its 0.1 names (``p2pdp.tasks.logistic:LogisticEnsembles``)
are forwarded there with a DeprecationWarning until 0.3.
"""

from p2pdp._moved import forwarding

__getattr__ = forwarding(__name__)
