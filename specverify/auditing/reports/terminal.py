"""Plain-text rendering of an :class:`~specverify.auditing.audit_report.AuditReport`: a summary table and
the verdict."""

from __future__ import annotations

from specverify.auditing.audit_report import AuditReport
from specverify.auditing.checks import COVERAGE_TABLE
from specverify.auditing.defaults import FAIL_FAST_SKIP, MALFORMED_SKIP
from specverify.auditing.findings import grouped_findings, said_in_summary

_COLUMNS = ("check", "verdict", "n", "look", "cells", "p-value", "α share", "TV seen", "TV detect.", "time")


def _number(value: float | None, spec: str = ".3g") -> str:
    return "—" if value is None else format(value, spec)


def _row(check) -> tuple[str, ...]:
    tv = _number(check.empirical_tv, ".2e") if check.kind == "exact" else _number(check.empirical_tv, ".4f")
    return (
        check.name, check.verdict, str(check.n) if check.n else "—",
        f"{check.look}/{check.num_looks}" if check.look else "—", str(check.num_cells) if check.num_cells else "—",
        _number(check.pvalue, ".3g"), _number(check.alpha, ".2g"), tv, _number(check.detectable_tv, ".4f"),
        f"{check.seconds:.1f}s",
    )


def format_table(report: AuditReport) -> str:
    """One line per check: verdict, samples, the look that decided (sequential checks: "2/3" when
    the second of three looks rejected; "3/3" when every look passed), cells, p-value, the check's α
    share (the look's own level is in the message), observed and detectable TV, wall time.  The
    checks fail-fast or a malformed output stopped are counted in one line at the end."""
    stopped = [c for c in report.checks if c.verdict == "skipped" and c.message.startswith(FAIL_FAST_SKIP)]
    after_malformed = [c for c in report.checks if c.verdict == "skipped" and c.message.startswith(MALFORMED_SKIP)]
    stopped += after_malformed
    rows = [_COLUMNS] + [_row(c) for c in report.checks if c not in stopped]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])] + [v.rjust(w) for v, w in zip(row[2:], widths[2:])]
        lines.append("  ".join(cells))
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    if after_malformed:
        lines.append(f"(and {len(after_malformed)} checks not run: the audit stopped at the first malformed output)")
    elif stopped:
        lines.append(f"(and {len(stopped)} checks not run: the audit stopped at the first failing check; "
                     "--no-fail-fast runs them)")
    return "\n".join(lines)


def format_report(report: AuditReport, *, table: bool = True) -> str:
    """The header, the table, what did not run and why (unless the plan's notes said it), the
    messages of failing/erroring checks (each finding once; one the verdict line already states is
    not repeated), the diagnosis and the minimal failing case, and the verdict line.  ``table=False``
    leaves the table out (the per-check lines of the progress already went to the same stream); so
    does an audit in which no check ran or every check that ran stopped with the same error."""
    settings, plan, search = report.settings, report.plan, report.case_search
    header = (f"specverify audit of {settings.target} — level {settings.level}, budget {settings.budget.describe()}, "
              f"α = {settings.alpha:g} family-wise ({settings.correction}), seed {settings.seed}, "
              f"device {settings.device}"
              + ("; stops at the first failing check (--no-fail-fast runs them all)" if settings.fail_fast else ""))
    parts = [header, ""]
    findings = grouped_findings(report.checks)
    if table and _table_says_something(report, findings):
        parts += [format_table(report), ""]
    elif report.checks and table:
        parts += [f"(no table: {_ran(report)})", ""]
    elif report.checks:
        parts += ["(the results table is the per-check lines above; --json PATH keeps every field)", ""]
    shown = [finding.line() for finding in findings if not said_in_summary(finding, report)]
    parts += shown + ([""] if shown else [])
    coverage = [c.message for c in report.checks if COVERAGE_TABLE in c.parameters]
    parts += coverage + ([""] if coverage else [])
    notes = [] if plan.notes_said else ([settings.preset_note] if settings.preset_note else []) + [
        omission.line() for omission in plan.omitted]
    if plan.shortfall is not None and report.verdict != "underpowered" and not plan.notes_said:
        notes.append(f"underpowered: {plan.shortfall.sentence()}; {plan.shortfall.fix()}")
    parts += notes + ([""] if notes else [])
    parts += _isolation_lines(report)
    if report.diagnosis:
        parts += [f"Diagnosis: {report.diagnosis}" + "".join(f" {s}" for s in report.case_reading()), ""]
    if search.case is not None:
        parts += [search.case.sentence() + "; paste it into a test:", "",
                  *["    " + line if line else "" for line in report.minimal_case_code().splitlines()], ""]
    elif search.note:
        parts += [f"Minimal case: none: {search.note}.", ""]
    parts.append(verdict_line(report))
    parts.append(footer(report))
    if post_verdict_line(report):
        parts.append(post_verdict_line(report))
    if report.warnings:
        shown_warnings = [w if len(w) <= 160 else w[:157] + "…" for w in report.warnings[:3]]
        more = f" (and {len(report.warnings) - 3} more in --json)" if len(report.warnings) > 3 else ""
        parts.append(f"{len(report.warnings)} warning(s) from the code under audit, "
                     f"kept out of the run's output{more}:")
        parts += [f"  {w}" for w in shown_warnings]
    if report.exit_code != 0:
        parts.append(f"replay: {report.replay_command}")
        if report.stopped_early:
            parts.append(f"every check: {report.full_command}")
    return "\n".join(parts)


def _table_says_something(report: AuditReport, findings: list) -> bool:
    """False when no check ran, or every check that ran stopped with one and the same error and
    nothing was stopped for another reason (a hang, an interrupt): the table would only repeat it."""
    ran = [c for c in report.checks if c.verdict != "skipped"]
    if not ran:
        return False
    stopped = [c for c in report.checks if c.verdict == "skipped" and c.message.startswith(("not run", "interrupted"))
               and not c.message.startswith(MALFORMED_SKIP)]
    return stopped != [] or not (all(c.verdict == "error" for c in ran) and len(findings) == 1)


def _ran(report: AuditReport) -> str:
    ran = [c for c in report.checks if c.verdict != "skipped"]
    if not ran:
        stopped = next((c for c in report.checks if not c.message.startswith("not run")), report.checks[0])
        return f"none of the {len(report.checks)} checks ran; {stopped.name}: {stopped.message}"
    return f"all {len(ran)} checks that ran stopped with the error below"


def footer(report: AuditReport) -> str:
    """Samples tested (the table's n, one per completed sequence or window) against the rows the
    function evaluated (one per request row of every call, including the rows of decoding loops
    and of the contract checks), and the time."""
    samples = sum(c.n for c in report.checks)
    timings = report.timings
    text = f"({samples:,} samples tested (the table's n)"
    if timings.get("rows_per_s"):
        text += (f"; the function evaluated {timings['rows']:,} rows (one per request row per call) in "
                 f"{timings['calls']:,} calls, {timings['rows_per_s']:,.0f} rows/s")
    return text + f"; {timings.get('total_s', 0.0):.1f} s)"


def post_verdict_line(report: AuditReport) -> str:
    """``(after the verdict at 14.3 s, budget 10.0 s: …): locating checks 5.0 s (…); minimal case …``:
    each step after the verdict with its time (:mod:`specverify.auditing.post_verdict`); empty when
    no step ran."""
    post = report.timings.get("post_verdict") or {}
    steps = post.get("steps") or []
    if not steps:
        return ""
    return (f"(after the verdict at {post['verdict_s']:.1f} s, budget {post['budget_s']:.1f} s: "
            + "; ".join(f"{step['step']} {step['seconds']:.1f} s ({step['outcome']})" for step in steps) + ")")


def verdict_line(report: AuditReport) -> str:
    """``NO LOSS DETECTED: …`` / ``LOSS DETECTED: …`` / ``CONTRACT VIOLATED: …`` / ``COULD NOT AUDIT: …``."""
    return f"{report.verdict.upper()} (exit {report.exit_code}): {report.summary}"


def _isolation_lines(report: AuditReport) -> list[str]:
    """The isolation note and the first lines of what the function printed, if anything."""
    isolation = report.isolation or {}
    lines = []
    if isolation.get("note"):
        lines.append(f"isolation: {isolation['note']}")
    for name in ("stdout", "stderr"):
        captured = isolation.get(name)
        if captured:
            more = ", truncated" if captured["truncated"] else ""
            lines.append(f"the function's {name} ({captured['bytes']:,} bytes{more}; first lines):")
            lines += [f"  | {line}" for line in captured["first_lines"]]
    return lines + [""] if lines else []
