"""``specverify properties [TARGET] [-- PYTEST ARGS]``: the Hypothesis property suite against TARGET.

It runs ``python -m pytest --pyargs specverify.properties --specverify-impl TARGET``: the suite is
part of the package (:mod:`specverify.properties`), so this works from a pip install as from a
checkout; the ``slow`` tests stay out unless ``-m`` says otherwise.  Exit status: pytest's (0 every test passed, 1
some failed, 2–4 the run could not start, 5 nothing collected).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

SUITE = "specverify.properties"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "properties",
        help="run the Hypothesis property suite against an implementation",
        description="Run the property suite (exact laws, sampled laws at a stated α, the known-bug catalog's "
                    "self-test) against TARGET: python -m pytest --pyargs specverify.properties --specverify-impl "
                    "TARGET. Arguments after -- go to pytest (e.g. -- -m uses_impl -x -n 2).",
    )
    parser.add_argument("target", nargs="?", default="reference",
                        help="path/to/file.py:function, package.module:function or a built-in name (default reference)")
    parser.add_argument("--seed", default="0", help="base seed of the statistical checks: an integer or 'random'")
    parser.add_argument("--alpha", type=float, default=1e-3,
                        help="family-wise false-positive rate of the suite's statistical checks (default 1e-3)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=run)


def command(target: str, *, seed: str = "0", alpha: float = 1e-3, extra: list[str] | None = None) -> list[str]:
    """The pytest command line the subcommand runs."""
    extra = [a for a in (extra or []) if a != "--"]
    if not any(a == "-m" or a.startswith("-m") and not a.startswith("--") for a in extra):
        extra = ["-m", "not slow", *extra]  # as the repository's default run (a pip install has no pyproject addopts)
    return [sys.executable, "-m", "pytest", "--pyargs", SUITE, "-p", "specverify.testing.pytest_plugin",
            f"--specverify-impl={target}", f"--specverify-seed={seed}", f"--specverify-alpha={alpha:g}",
            "-p", "no:cacheprovider", *extra]


def run(args: argparse.Namespace) -> int:
    words = command(args.target, seed=args.seed, alpha=args.alpha, extra=list(args.pytest_args))
    print("specverify properties: " + " ".join(words[1:]), file=sys.stderr, flush=True)
    return subprocess.call(words)
