"""The network runtime's launch: a cell's checks, coordinator and session (:mod:`.launch`),
hosts files (:mod:`.hosts_file`), the host processes (:mod:`.processes`, started by the
coordinator; :mod:`.host`, what each runs), the iterative protocols' hosts (:mod:`.iterative`)
and per-host data shards (:mod:`.shards`).
``python -m p2pdp.experiments.network`` runs one host process (the hosts file's default
command). Imports :mod:`p2pdp.experiments.results` and :mod:`p2pdp.experiments.scenarios`."""

from p2pdp.core.errors import moved_into_modules

__getattr__ = moved_into_modules(__name__)
