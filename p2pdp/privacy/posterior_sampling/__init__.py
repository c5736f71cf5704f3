"""Differentially private posterior sampling (Nguyễn): the exponential mechanism over mean-field
Gaussian posteriors (:mod:`.posterior`), the ``posterior-sampling`` mechanism component
(:mod:`.mechanism`), its audits (:mod:`.audit`) and the article's linear-regression example
(:mod:`.example`).

It is a mechanism, not a task: the logistic workload releases through it (groups of one), so it
lives in the privacy layer, below every workload.
"""
