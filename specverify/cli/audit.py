"""``specverify audit TARGET``: audit an implementation and print its verdict.

Exit status: 0 no loss detected, 1 loss detected (or contract violated), 2 could not audit.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from specverify.auditing.runner import DEFAULT_ALPHA, DEFAULT_BUDGET, DEFAULT_TIMEOUT_S, EXIT_ERROR, LEVELS, audit
from specverify.core.seeding import parse_base_seed


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="audit a speculative-decoding implementation for loss",
        description="Audit TARGET (path/to/file.py:function, package.module:function, a built-in name such as "
                    "'reference', or catalog:<name>). Exit status: 0 no loss detected, 1 loss detected, "
                    "2 could not audit.",
    )
    parser.add_argument("target", help="path/to/file.py:function, package.module:function or a built-in name")
    parser.add_argument("--level", choices=sorted(LEVELS), default="sampler",
                        help="sampler: SPEC §1 verify(target_probs, draft_probs, draft_tokens, generator) (default)")
    parser.add_argument("--budget", default=DEFAULT_BUDGET,
                        help="quick | standard | thorough (sampler level: every check detects TV 0.05 / 0.02 / "
                             "0.01 with power 0.99; the decoder level states its own) or N samples per check "
                             "(default: standard)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="family-wise false-positive rate of the whole audit (default 1e-3)")
    parser.add_argument("--seed", default="0", help="base seed: an integer (default 0) or 'random'")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the function's inputs live")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON (schema specverify.audit/1)")
    parser.add_argument("--html", metavar="PATH", help="write a self-contained HTML report with plots")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"per-call timeout in seconds (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--checks", metavar="NAMES",
                        help="comma-separated check names to run instead of the whole battery")
    parser.add_argument("--baseline", metavar="URL",
                        help="endpoint level: base URL of the same model served without speculation")
    parser.add_argument("--model", help="endpoint level: the `model` field (default: the server's first /models id)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="endpoint level: requests in flight at once, and the burst size (default 4)")
    parser.add_argument("--deadline", type=float, default=3600.0,
                        help="endpoint level: deadline of the whole run in seconds (default 3600)")
    parser.add_argument("--quiet", action="store_true", help="print only the verdict line, no table or progress")
    parser.set_defaults(handler=run)


class ProgressBar:
    """A one-line progress bar on a terminal stream, redrawn in place."""

    def __init__(self, stream: TextIO, width: int = 30) -> None:
        self.stream = stream
        self.width = width
        self.started = time.perf_counter()

    def __call__(self, done: int, total: int, name: str) -> None:
        filled = self.width * done // max(1, total)
        elapsed = time.perf_counter() - self.started
        line = f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {elapsed:5.0f}s {name[:28]:<28}"
        self.stream.write(line)
        if done == total:
            self.stream.write("\r" + " " * len(line) + "\r")
        self.stream.flush()


def run(args: argparse.Namespace) -> int:
    from specverify.auditing.report_terminal import format_report, verdict_line

    try:
        seed = parse_base_seed(args.seed)
    except ValueError as error:
        print(f"specverify audit: {error}", file=sys.stderr)
        return EXIT_ERROR
    if str(args.seed).strip().lower() == "random":
        print(f"specverify audit: random seed {seed} (replay with --seed {seed})", file=sys.stderr)
    progress = ProgressBar(sys.stderr) if not args.quiet and sys.stderr.isatty() else None
    level_options = (dict(baseline=args.baseline, model=args.model, concurrency=args.concurrency,
                          deadline_s=args.deadline) if args.level == "endpoint" else {})
    try:
        report = audit(args.target, level=args.level, budget=args.budget, alpha=args.alpha, seed=seed,
                       device=args.device, timeout_s=args.timeout, progress=progress,
                       checks=[n.strip() for n in args.checks.split(",")] if args.checks else None, **level_options)
    except ValueError as error:
        print(f"specverify audit: could not audit: {error}", file=sys.stderr)
        return EXIT_ERROR
    print(verdict_line(report) if args.quiet else format_report(report))
    if args.json:
        from specverify.auditing.report_json import write_json

        write_json(report, args.json)
        if not args.quiet:
            print(f"wrote JSON report to {args.json}", file=sys.stderr)
    if args.html:
        from specverify.auditing.report_html import write_html

        write_html(report, args.html)
        if not args.quiet:
            print(f"wrote HTML report to {args.html}", file=sys.stderr)
    return report.exit_code
