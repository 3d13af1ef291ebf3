"""The ``specverify`` command line (also ``python -m specverify``).

Subcommands live in their own modules, each exposing ``register(subparsers)`` that adds one
sub-parser and sets its ``handler(args) -> int`` (the exit status).  The modules are listed in
:data:`SUBCOMMAND_MODULES`.

Arguments after ``--`` go to ``args.passthrough`` of a subcommand that sets that default (``specverify
properties``: to pytest); any other subcommand refuses them.

A mistyped option or subcommand gets the usage of the subcommand it was given to (not the
top-level one) and the closest spelling (``did you mean --budget?``), exit status 2.

:func:`main` sets ``OMP_WAIT_POLICY=PASSIVE`` (unless the caller set it) before the subcommands
import torch: an audit's process waits for its worker most of the time, and OpenMP threads that
spin while it waits hold the cores the worker runs on.  It also tells glibc's allocator to keep
large freed blocks (:mod:`specverify.auditing.isolation.allocator`), as the worker's is: the
audit allocates tens of MB a call for production-shape inputs.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from specverify import __version__
from specverify.auditing.isolation import allocator

SUBCOMMAND_MODULES = ("specverify.cli.audit", "specverify.cli.properties", "specverify.cli.speedup",
                      "specverify.cli.models", "specverify.cli.demo_server", "specverify.cli.doctor")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors end with the closest valid spelling of what was mistyped."""

    words: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self.words = list(sys.argv[1:] if args is None else args)  # what error() looks for typos in
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}{suggestion(self, message, self.words)}\n")


def suggestion(parser: argparse.ArgumentParser, message: str, words: Sequence[str] = ()) -> str:
    """``; did you mean --budget?`` for the options in ``words`` (or in an "unrecognized
    arguments" ``message``) that ``parser`` does not have, or for an invalid choice in ``message``:
    the closest spelling among its options or the argument's choices; "" when none is close."""
    options = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    unknown = re.match(r"unrecognized arguments: (.*)", message)
    candidates = list(words) + (unknown.group(1).split() if unknown else [])
    typos = dict.fromkeys(w.split("=", 1)[0] for w in candidates if w.startswith("--") and w != "--"
                          and w.split("=", 1)[0] not in options)
    hints = []
    for word in typos:
        close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
        if close:
            hints.append(f"{close[0]} (for {word})")
    if hints:
        return f"; did you mean {', '.join(hints)}?"
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        choices = re.findall(r"'([^']*)'", choice.group(2)) or [c.strip() for c in choice.group(2).split(",")]
        close = difflib.get_close_matches(choice.group(1), choices, n=1, cutoff=0.5)
        return f"; did you mean {close[0]!r}?" if close else ""
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="specverify",
        description="Prove speculative decoding lossless, or catch it when it is not.",
    )
    parser.add_argument("--version", action="version", version=f"specverify {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The sub-parser of ``command`` (``parser`` itself when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the subcommand and return its exit status."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read once, when torch loads OpenMP
    allocator.apply()
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    cut = words.index("--") if "--" in words else len(words)
    args, extras = parser.parse_known_args(words[:cut])
    if extras:  # reported by the subcommand's parser, with its usage and the closest option
        _subparser(parser, getattr(args, "command", None)).error(f"unrecognized arguments: {' '.join(extras)}")
    if cut < len(words):
        if "passthrough" not in vars(args):
            _subparser(parser, getattr(args, "command", None)).error(
                "arguments after --: only `specverify properties` takes them (it passes them to pytest)")
        args.passthrough = words[cut + 1:]
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
