"""``specverify properties [TARGET] [-n N] [--whole-suite] [-- PYTEST ARGS]``: the property suite against TARGET.

It runs ``python -m pytest --pyargs specverify.properties --specverify-impl TARGET``: the suite is
part of the package (:mod:`specverify.properties`), so this works from a pip install as from a
checkout.  By default only the tests that call TARGET run (``-m "uses_impl and not slow"``: the
suite's own calibration and catalog self-tests do not depend on it); ``--whole-suite`` runs every
test but the ``slow`` ones.  The tests run on ``-n`` workers (pytest-xdist) and an estimate of
the time, from the durations measured on the reference (:mod:`specverify.properties.timings`),
is printed before they start.  A ``-m`` after ``--`` replaces the selection.  Exit status: pytest's
(0 every test passed, 1 some failed, 2–4 the run could not start, 5 nothing collected).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from typing import Any

SUITE = "specverify.properties"
SCOPED = "uses_impl and not slow"
"""The tests that call the implementation under test (the suite's conftest marks them ``uses_impl``)."""
WHOLE = "not slow"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "properties",
        help="run the Hypothesis property suite against an implementation",
        description="Run the property tests that call TARGET (exact laws, sampled laws at a stated α) in parallel: "
        "python -m pytest --pyargs specverify.properties --specverify-impl TARGET -m 'uses_impl and not "
        "slow' -n N. --whole-suite adds the suite's own calibration and catalog self-tests. Arguments "
        "after -- go to pytest (e.g. -- -x -k bonus).",
    )
    parser.add_argument(
        "target",
        nargs="?",
        default="reference",
        help="path/to/file.py:function, package.module:function or a built-in name (default reference)",
    )
    parser.add_argument(
        "-n",
        "--workers",
        type=int,
        default=None,
        help="test processes (pytest-xdist; default: the CPU count, at most 4; 1: in this process)",
    )
    parser.add_argument(
        "--whole-suite",
        action="store_true",
        help="also run the tests that do not call TARGET (the suite's calibration and self-tests)",
    )
    parser.add_argument("--seed", default="0", help="base seed of the statistical checks: an integer or 'random'")
    parser.add_argument(
        "--alpha",
        type=float,
        default=1e-3,
        help="family-wise false-positive rate of the suite's statistical checks (default 1e-3)",
    )
    parser.set_defaults(handler=run, passthrough=[])


def default_workers() -> int:
    """The CPU count, at most 4 (the scoped suite has about 20 tests), 1 without pytest-xdist."""
    return min(4, os.cpu_count() or 1) if importlib.util.find_spec("xdist") is not None else 1


def command(
    target: str,
    *,
    seed: str = "0",
    alpha: float = 1e-3,
    extra: list[str] | None = None,
    workers: int = 1,
    whole_suite: bool = False,
) -> list[str]:
    """The pytest command line the subcommand runs."""
    extra = list(extra or [])
    if not any(a == "-m" or a.startswith("-m") and not a.startswith("--") for a in extra):
        extra = ["-m", WHOLE if whole_suite else SCOPED, *extra]
    parallel = ["-n", str(workers)] if workers > 1 else []
    return [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        SUITE,
        "-p",
        "specverify.testing.pytest_plugin",
        f"--specverify-impl={target}",
        f"--specverify-seed={seed}",
        f"--specverify-alpha={alpha:g}",
        "-p",
        "no:cacheprovider",
        *parallel,
        *extra,
    ]


def run(args: argparse.Namespace) -> int:
    from specverify.properties.timings import estimate

    workers = default_workers() if args.workers is None else args.workers
    if workers < 1:
        print(f"specverify properties: -n: expected a positive number of workers, got {workers}", file=sys.stderr)
        return 2
    if workers > 1 and importlib.util.find_spec("xdist") is None:
        print(
            "specverify properties: -n needs pytest-xdist (python3 -m pip install pytest-xdist); running in one "
            "process",
            file=sys.stderr,
        )
        workers = 1
    words = command(
        args.target,
        seed=args.seed,
        alpha=args.alpha,
        extra=list(args.passthrough),
        workers=workers,
        whole_suite=args.whole_suite,
    )
    print("specverify properties: " + " ".join(words[1:]), file=sys.stderr, flush=True)
    print(f"specverify properties: {estimate(workers, whole_suite=args.whole_suite)}", file=sys.stderr, flush=True)
    return subprocess.call(words)
