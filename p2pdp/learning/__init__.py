"""Learning: local models (:mod:`.models`), ensemble rules (:mod:`.ensembles`), evaluation
metrics (:mod:`.evaluation`) and the centralised reference (:mod:`.references`).

``p2pdp.learning`` was a module in p2pdp 0.1; its names are forwarded to :mod:`.models` with a
DeprecationWarning until 0.3.
"""

from p2pdp._moved import forwarding

__getattr__ = forwarding(__name__)
