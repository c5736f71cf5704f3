"""The logistic workload (the source system): every peer trains L2-regularised logistic
regression, groups publish noisy averages, every peer classifies with an ensemble.

:mod:`.task` is the ``logistic`` task.
"""
