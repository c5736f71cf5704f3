"""Learning: local models (:mod:`.models`), ensemble rules (:mod:`.ensembles`), evaluation
metrics (:mod:`.evaluation`) and the centralised reference (:mod:`.references`).
"""
