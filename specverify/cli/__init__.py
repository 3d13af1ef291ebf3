"""The ``specverify`` command line (also ``python -m specverify``).

Subcommands live in their own modules, each exposing ``register(subparsers)`` that adds one
sub-parser and sets its ``handler(args) -> int`` (the exit status).  The modules are listed in
:data:`SUBCOMMAND_MODULES`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from specverify import __version__

SUBCOMMAND_MODULES = ("specverify.cli.audit", "specverify.cli.speedup", "specverify.cli.models")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specverify",
        description="Prove speculative decoding lossless, or catch it when it is not.",
    )
    parser.add_argument("--version", action="version", version=f"specverify {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the subcommand and return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
