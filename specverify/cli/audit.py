"""``specverify audit TARGET``: audit an implementation and print its verdict.

Exit status: 0 no loss detected, 1 loss detected (or contract violated), 2 could not audit (or
underpowered: the budget cannot detect the level's ceiling TV, unless ``--allow-underpowered``).

For CI: ``--junit-xml PATH`` writes one test case per check (:mod:`specverify.auditing.reports.junit_xml`),
and under GitHub Actions (``GITHUB_ACTIONS=true``) the findings are also printed as workflow
annotations (:mod:`specverify.auditing.reports.github_annotations`).  When stdout and stderr are the same pipe
or file (``2>&1 | tee log``), the per-check progress lines are the table, so it is not printed again.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from specverify.auditing.defaults import (
    BUDGET_ENV,
    DEFAULT_ALPHA,
    DEFAULT_BUDGET,
    DEFAULT_TIMEOUT_S,
    EXIT_ERROR,
    LEVELS,
)
from specverify.auditing.presets import PRESETS
from specverify.core.seeding import parse_base_seed


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="audit a speculative-decoding implementation for loss",
        description="Audit TARGET (path/to/file.py:function, package.module:function, a built-in name such as "
                    "'reference', or catalog:<name>). Exit status: 0 no loss detected, 1 loss detected, "
                    "2 could not audit.",
    )
    parser.add_argument("target", nargs="?",
                        help="path/to/file.py:function, package.module:function or a built-in name (see --list)")
    parser.add_argument("--list", action="store_true",
                        help="list the built-in targets and the known-bug catalog (with exact TVs) and exit")
    parser.add_argument("--level", choices=sorted(LEVELS), default="sampler",
                        help="sampler: SPEC §1 verify(target_probs, draft_probs, draft_tokens, generator) (default)")
    parser.add_argument("--budget", default=None,
                        help="quick | standard | thorough (sampler level: every check detects TV 0.05 / 0.02 / "
                             "0.01 with power 0.99; the decoder level states its own) or N samples per check "
                             f"(default: ${BUDGET_ENV} or {DEFAULT_BUDGET})")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="a named budget for a gate instead of --budget and --checks: pre-commit (the exact and "
                             "contract checks and the quickest statistical ones at quick: seconds) or nightly (every "
                             "check at thorough, run to the end); docs/budgets.md")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="family-wise false-positive rate of the whole audit (default 1e-3)")
    parser.add_argument("--seed", default="0", help="base seed: an integer (default 0) or 'random'")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the function's inputs live")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON (schema specverify.audit/1)")
    parser.add_argument("--html", metavar="PATH", help="write a self-contained HTML report with plots")
    parser.add_argument("--junit-xml", metavar="PATH",
                        help="write a JUnit XML report for CI systems: one test case per check, "
                             "and one for the verdict")
    parser.add_argument("--allow-underpowered", action="store_true",
                        help="let a budget whose checks cannot detect the level's ceiling TV (0.25) pass, stating the "
                             "TV it reached (default: such a run without a failure exits 2, underpowered)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"deadline of the first call and floor of every later one, in seconds (default "
                             f"{DEFAULT_TIMEOUT_S:g}); later calls may run 20x their expected time at the "
                             "function's measured speed")
    parser.add_argument("--checks", metavar="NAMES",
                        help="comma-separated check names to run instead of the whole battery")
    parser.add_argument("--isolation", choices=("process", "none"), default="process",
                        help="process: run the function in a worker process that is killed at a deadline and "
                             "restarted after a crash (default); none: call it in the audit's own process")
    parser.add_argument("--fail-fast", action=argparse.BooleanOptionalAction, default=None,
                        help="stop at the first failing check (default for --budget quick and standard) or run "
                             "every check (--no-fail-fast; default for thorough and N-sample budgets), which the "
                             "diagnosis of where a loss is needs")
    parser.add_argument("--quiet", action="store_true",
                        help="print only the verdict line, no table or progress (otherwise the plan and its expected "
                             "time first, then a bar on a terminal or one line per finished check in a log)")
    parser.add_argument("--baseline", metavar="URL",
                        help="endpoint level: base URL of the same model served without speculation")
    parser.add_argument("--model", help="endpoint level: the `model` field (default: the server's first /models id)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="endpoint level: requests in flight at once, and the burst size (default 4)")
    parser.add_argument("--context-length", type=int, default=None,
                        help="endpoint level: the model's context in tokens, bounding the longest prompt sent "
                             "(default: the server's GET /models max_model_len; unknown: prompts up to 1,024 "
                             "characters)")
    parser.add_argument("--no-request-space", dest="request_space", action="store_false",
                        help="endpoint level: leave out the request-space checks (sampling fields, prompt lengths, "
                             "prefixes, load, n = 2/4, penalties, stop handling) and the coverage table")
    parser.add_argument("--request-space-only", action="store_true",
                        help="endpoint level: run only the request-space checks and the coverage table (with a "
                             "fixed --budget N, a coverage run at N samples per check: each check states the TV it "
                             "detects, and a pass below the budget's TV needs --allow-underpowered)")
    parser.add_argument("--seeded-determinism", action="store_true",
                        help="endpoint level: the server promises that a seeded request gives the same tokens alone "
                             "and in any batch (e.g. vLLM with VLLM_BATCH_INVARIANT=1), so seed-reproducibility "
                             "judges it (default: differences are reported, not judged)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="endpoint level: deadline of the whole run in seconds (default by budget: quick 1 h, "
                             "standard 4 h, thorough 16 h; N samples: 3 s each, at least 1 h; 4 times those with the "
                             "request space)")
    parser.set_defaults(handler=run)


OUTPUT_OPTIONS = ("target", "list", "json", "html", "junit_xml", "quiet", "help")
"""The options that change what is printed or written, not what the audit does; every other
option reaches :func:`audit_keywords` and the replay lines (tests/auditing/test_gate_lived.py)."""

CHOOSING_OPTIONS = ("preset",)
"""The options the replay lines repeat as what they chose: a preset as its ``--budget`` and ``--checks``."""


def audit_keywords(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The keyword arguments of :func:`specverify.audit` that the options in ``args`` give."""
    level_options = (dict(baseline=args.baseline, model=args.model, concurrency=args.concurrency,
                          deadline_s=args.deadline, seeded_determinism=args.seeded_determinism,
                          context_length=args.context_length, request_space=args.request_space,
                          request_space_only=args.request_space_only)
                     if args.level == "endpoint" else {})
    return dict(level=args.level, budget=args.budget, preset=args.preset, alpha=args.alpha, seed=seed,
                device=args.device, timeout_s=args.timeout, isolation=args.isolation, fail_fast=args.fail_fast,
                allow_underpowered=args.allow_underpowered,
                checks=[n.strip() for n in args.checks.split(",")] if args.checks else None, **level_options)


def writable(path: str) -> str | None:
    """Why a report cannot be written to ``path`` (None when it can), checked before the audit runs."""
    target = Path(path)
    if target.is_dir():
        return f"{path!r} is a directory"
    if target.exists():
        return None if os.access(target, os.W_OK) else f"{path!r} is not writable"
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        return f"the directory {str(parent)!r} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"the directory {str(parent)!r} is not writable"
    return None


def same_destination(first: Any, second: Any) -> bool:
    """Whether two streams write to the same pipe or file (not a terminal): ``2>&1 | tee``."""
    try:
        a, b = os.fstat(first.fileno()), os.fstat(second.fileno())
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) and not first.isatty()
    except (AttributeError, OSError, ValueError):
        return False


def run(args: argparse.Namespace) -> int:
    """The subcommand: exit 0/1/2 as the module docstring says; an error of the audit itself
    (never of the function, which is guarded) and a Ctrl-C outside a check end in 2 with a
    message, not a traceback."""
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("specverify audit: could not audit: interrupted by the user (Ctrl-C)", file=sys.stderr)
        return EXIT_ERROR
    except Exception as error:  # an internal error must not read as exit 1 ("loss detected")
        print(f"specverify audit: could not audit: internal error of the audit: {type(error).__name__}: {error}",
              file=sys.stderr)
        return EXIT_ERROR


def _run(args: argparse.Namespace) -> int:
    if args.list:  # before any import of the audit machinery (torch): the listing is instant
        from specverify.cli.listing import listing

        print(listing())
        return 0
    from specverify.auditing.isolation.spawn import prestarted

    # The worker starts importing torch now, while this process imports the audit.
    with prestarted(enabled=bool(args.target) and args.isolation == "process" and args.level != "endpoint"):
        return _audit(args)


def _audit(args: argparse.Namespace) -> int:
    from specverify.auditing.progress import progress_for
    from specverify.auditing.reports.terminal import format_report, verdict_line

    if not args.target:
        print("specverify audit: a TARGET is required (or --list to see the built-in ones)", file=sys.stderr)
        return EXIT_ERROR

    try:
        seed = parse_base_seed(args.seed)
    except ValueError as error:
        print(f"specverify audit: {error}", file=sys.stderr)
        return EXIT_ERROR
    if str(args.seed).strip().lower() == "random":
        print(f"specverify audit: random seed {seed} (replay with --seed {seed})", file=sys.stderr)
    for option, path in (("--json", args.json), ("--html", args.html), ("--junit-xml", args.junit_xml)):
        problem = writable(path) if path else None
        if problem:
            print(f"specverify audit: could not audit: {option}: cannot write the report: {problem}", file=sys.stderr)
            return EXIT_ERROR
    progress = progress_for(sys.stderr, quiet=args.quiet)
    try:
        from specverify.auditing.runner import audit

        report = audit(args.target, progress=progress, **audit_keywords(args, seed))
    except ValueError as error:
        print(f"specverify audit: could not audit: {error}", file=sys.stderr)
        return EXIT_ERROR
    table = not (getattr(progress, "per_check", False) and same_destination(sys.stdout, sys.stderr))
    print(verdict_line(report) if args.quiet else format_report(report, table=table))
    if os.environ.get("GITHUB_ACTIONS") == "true":
        from specverify.auditing.reports.github_annotations import workflow_commands

        print("\n".join(workflow_commands(report)))
    if args.junit_xml:
        from specverify.auditing.reports.junit_xml import write_junit

        write_junit(report, args.junit_xml)
        if not args.quiet:
            print(f"wrote JUnit XML report to {args.junit_xml}", file=sys.stderr)
    if args.json:
        from specverify.auditing.reports.json_file import write_json

        write_json(report, args.json)
        if not args.quiet:
            print(f"wrote JSON report to {args.json}", file=sys.stderr)
    if args.html:
        from specverify.auditing.reports.html_page import write_html

        write_html(report, args.html)
        if not args.quiet:
            print(f"wrote HTML report to {args.html}", file=sys.stderr)
    return report.exit_code
