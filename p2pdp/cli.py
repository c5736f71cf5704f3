"""Command-line interface: ``p2pdp datasets|audit|run|report``.

Each sub-command lives in its own ``_add_<name>`` / ``_cmd_<name>`` pair below; the heavy
lifting is in the package modules, the CLI only parses, calls and prints.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from p2pdp import __version__
from p2pdp.errors import P2PDPError


# --- datasets ---------------------------------------------------------------------------------
def _add_datasets(subparsers: argparse._SubParsersAction) -> None:
    """Register ``p2pdp datasets list|info|fetch`` (owned by the datasets module's author)."""


# --- audit ------------------------------------------------------------------------------------
def _add_audit(subparsers: argparse._SubParsersAction) -> None:
    """Register ``p2pdp audit`` (owned by the privacy-core author)."""


# --- main -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="p2pdp",
        description="Simulator for peer-to-peer federated learning with differential privacy.",
    )
    parser.add_argument("--version", action="version", version=f"p2pdp {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for add in (_add_datasets, _add_audit):
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except P2PDPError as exc:
        print(f"p2pdp: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
