"""``specverify demo-server``: the endpoint toy (:mod:`specverify.testing.toy_server`) as a command,
so the endpoint level can be tried without a real engine.

It serves two OpenAI-compatible completions servers on 127.0.0.1 over the same exact toy LM: the
candidate decodes speculatively (draft K = 3, verified by the correct rule, or by the sampler
catalog entry ``--bug NAME``), the baseline samples the target's law directly.  It prints both URLs
and the audit command that tests them, then serves until Ctrl-C, ``--max-requests`` completion
requests to the candidate, or ``--lifetime`` seconds.  Exit status 0 (2 for an unusable option).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Any

DEFAULT_PORT = 8001
DEFAULT_BASELINE_PORT = 8000
TRY_CHECKS = "greedy-identity,pit-T1-top8"
"""The checks of the one-minute try-it the server prints (the whole battery: ``--budget quick`` alone)."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo-server",
        help="serve a toy speculative-decoding server (and its baseline) to try the endpoint level on",
        description="Serve the endpoint toy on 127.0.0.1: a candidate that decodes speculatively and a baseline "
        "without speculation, over one exact character-level toy LM; prints their URLs and the audit "
        "command, then serves until Ctrl-C, --max-requests or --lifetime.",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"the candidate's port (default {DEFAULT_PORT}; 0: a free one)"
    )
    parser.add_argument(
        "--baseline-port",
        type=int,
        default=DEFAULT_BASELINE_PORT,
        help=f"the baseline's port (default {DEFAULT_BASELINE_PORT}; 0: a free one)",
    )
    parser.add_argument(
        "--bug",
        metavar="NAME",
        help="plant a sampler catalog entry (`specverify audit --list`, e.g. bonus-from-draft) as the "
        "candidate's verification rule (default: the correct rule)",
    )
    parser.add_argument(
        "--max-requests",
        type=int,
        default=None,
        help="stop after this many completion requests to the candidate (default: no limit)",
    )
    parser.add_argument(
        "--lifetime", type=float, default=None, help="stop after this many seconds (default: until Ctrl-C)"
    )
    parser.set_defaults(handler=run)


def planted_rule(name: str | None) -> Any:
    """The verification rule of the catalog entry ``name`` (hyphens or underscores), None for the
    correct rule; ``ValueError`` naming ``--bug`` and the closest entry for an unknown name."""
    if name is None:
        return None
    from specverify.auditing.loading import catalog_key
    from specverify.auditing.sampler.catalog import CATALOG

    key = catalog_key(name)
    if key not in CATALOG:
        close = difflib.get_close_matches(key, list(CATALOG), n=1)
        hint = f"; did you mean {close[0].replace('_', '-')}?" if close else ""
        raise ValueError(f"--bug: {name!r} is not a sampler catalog entry (`specverify audit --list` names them){hint}")
    return CATALOG[key].fn


def run(args: argparse.Namespace) -> int:
    for option, value in (("--max-requests", args.max_requests), ("--lifetime", args.lifetime)):
        if value is not None and value <= 0:
            print(f"specverify demo-server: {option}: expected a positive number, got {value}", file=sys.stderr)
            return 2
    try:
        rule = planted_rule(args.bug)
    except ValueError as error:
        print(f"specverify demo-server: {error}", file=sys.stderr)
        return 2
    from specverify.testing.toy_server import ToyConfig, ToyServer

    try:
        candidate = ToyServer(ToyConfig(speculative=True, rule=rule, die_after=args.max_requests), port=args.port)
        baseline = ToyServer(ToyConfig(speculative=False), port=args.baseline_port)
    except OSError as error:
        print(
            f"specverify demo-server: cannot listen on 127.0.0.1 ({error}); pick another --port / --baseline-port, "
            "or 0 for free ones",
            file=sys.stderr,
        )
        return 2
    candidate.start()
    baseline.start()
    rule_name = args.bug or "the correct rule"
    print(f"candidate (speculative, verified by {rule_name}): {candidate.url}", flush=True)
    print(f"baseline (no speculation): {baseline.url}", flush=True)
    print(
        f"try: specverify audit --level endpoint {candidate.url} --baseline {baseline.url} --budget quick "
        f"--checks {TRY_CHECKS}",
        flush=True,
    )
    try:
        candidate.wait(args.lifetime)
    except KeyboardInterrupt:
        pass
    finally:
        candidate.stop()
        baseline.stop()
    print("specverify demo-server: stopped", flush=True)
    return 0
