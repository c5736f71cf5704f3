"""The prevalence workload: randomized response and Laplace counts into a Beta-Bernoulli
posterior.

:mod:`.estimators` the maths (posteriors from noisy counts, the noise-aware correction, the
policies), :mod:`.task` the ``prevalence-counts`` and ``randomized-response`` tasks,
:mod:`.figures` the study's and the report's figures, :mod:`.audit` the exact audit of the
randomized-response count. Settings: the ``[prevalence]`` table
(:class:`p2pdp.config.tables.PrevalenceConfig`).
"""
