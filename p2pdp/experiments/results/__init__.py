"""The results folder: rows written as cells finish (:mod:`.store`), the files' names and
readers, and the repair after a crash (:mod:`.files`), the manifest and the checks of a resume
(:mod:`.manifest`), the folder's lock (:mod:`.lock`) and the CSV text (:mod:`.tables`).
Imports :mod:`p2pdp.experiments.scenarios` only."""

from p2pdp.core.errors import moved_into_modules

__getattr__ = moved_into_modules(__name__)
