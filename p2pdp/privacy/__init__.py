"""Privacy: mechanisms, their calibration, privacy events, accountants (basic, RDP, GDP, PLD),
budgets, secure aggregation, the release path, posterior sampling (the exponential mechanism)
and the audit framework.

Pure mathematics plus the release of one group's aggregate; it never imports the simulator, a
workload or the experiment layer (``.importlinter`` checks the layers).
"""
