"""The network runtime's launch: host processes, hosts files and sessions (:mod:`.launch`), the
iterative protocols' hosts (:mod:`.iterative`) and per-host data shards (:mod:`.shards`).
``python -m p2pdp.experiments.network`` runs one host process (the hosts file's default
command). Imports :mod:`p2pdp.experiments.results` and :mod:`p2pdp.experiments.scenarios`."""

from p2pdp.core.errors import moved_into_modules

__getattr__ = moved_into_modules(__name__)
