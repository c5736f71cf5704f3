"""``python -m p2pdp.experiments.network``: one host process of a network run, driven over its
standard input by the coordinator (:func:`p2pdp.experiments.network.host.host_from_stdin`).

Started by hand (any argument, such as ``--help``, or a terminal on standard input) it says
what it is instead of waiting for a coordinator that will never write."""

import sys

USAGE = (
    "python -m p2pdp.experiments.network: one host process of a network run. The coordinator "
    "(`p2pdp run SCENARIO --runtime network`) starts it, through a hosts file's command, and "
    "writes its cells to its standard input; it takes no arguments. See docs/guide/network.md."
)

if sys.argv[1:] or sys.stdin.isatty():
    print(USAGE, file=sys.stderr)
    sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)

from p2pdp.experiments.network.host import host_from_stdin  # noqa: E402 (after the usage check)

host_from_stdin()
