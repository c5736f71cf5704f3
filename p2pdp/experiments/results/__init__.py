"""The results folder (:mod:`.store`): rows written as cells finish, the manifest, the lock,
resuming and repairing. Imports :mod:`p2pdp.experiments.scenarios` only."""

from p2pdp.core.errors import moved_into_modules

__getattr__ = moved_into_modules(__name__)
