"""``python -m p2pdp.experiments.network``: one host process of a network run, driven over its
standard input by the coordinator (:func:`p2pdp.experiments.network.launch.host_from_stdin`)."""

from p2pdp.experiments.network.launch import host_from_stdin

host_from_stdin()
