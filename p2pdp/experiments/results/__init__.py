"""The results folder (:mod:`.store`): rows written as cells finish, the manifest, the lock,
resuming and repairing. Imports :mod:`p2pdp.experiments.scenarios` only."""
