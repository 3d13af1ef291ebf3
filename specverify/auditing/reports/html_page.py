"""A self-contained HTML page for an :class:`~specverify.auditing.audit_report.AuditReport`.

One file, no external resources: inline CSS, and plots as base64 PNG data URIs drawn with
matplotlib (the optional ``report`` extra; without it the page is written without plots and says
so).  Plots: observed against expected counts for every failing check, and the acceptance rate by
draft position against its theory (Π_{j≤i} α_j) for the checks where it is known.  The page
explains the method and each check in a sentence, for readers who have not seen the code.
"""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path
from typing import Any

import numpy as np

from specverify.auditing.audit_report import AuditReport
from specverify.auditing.checks import CheckResult
from specverify.auditing.reports.tree_drawings import tree_sections

MAX_BARS = 40
"""Observed-vs-expected plots show at most this many cells (the largest deviations)."""

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; line-height: 1.45; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
.verdict { padding: 0.8em 1em; border-radius: 6px; font-weight: 600; }
.pass { background: #e4f4e4; } .fail { background: #fbe3e3; } .error, .skipped { background: #fff3d6; }
table { border-collapse: collapse; width: 100%; font-size: 0.9em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.35em 0.5em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.note { color: #666; font-size: 0.9em; } img { max-width: 100%; }
"""

_METHOD = (
    "Speculative decoding is <em>lossless</em> when the tokens it emits are distributed exactly as sampling from "
    "the target model. The audit feeds the function batches of toy distributions whose target law is known "
    "exactly, samples the draft tokens itself, and compares the tokens the function emits (continued by target "
    "sampling where a step stops early) with the exact target law. Each statistical check is a Pearson "
    "goodness-of-fit or exact binomial test at its share of the family-wise false-positive rate α (Bonferroni), "
    "with enough samples to detect a deviation of the stated total variation (TV) with the stated power. "
    "Statistical checks are group-sequential: tested at three looks, each at its share of the check's α, they "
    "stop at the first look that rejects, so a gross loss is reported after a fraction of the samples. "
    "Functions that accept <code>uniforms=</code> are also integrated exactly (no sampling). Contract checks "
    "verify that inputs are left unchanged and that all randomness comes from the generator."
)


def _matplotlib() -> Any | None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    return Figure, FigureCanvasAgg


def _png(figure: Any, canvas_class: Any) -> str:
    canvas_class(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def readable_label(label: str) -> str:
    """A short bar label: ``chain 1 tokens (3, rest)`` -> ``c1: 3 rest``; ``first token = draft`` unchanged."""
    match = re.fullmatch(r"chain (\d+) tokens \(?([^)]*)\)?", label)
    if not match:
        return label
    return f"c{match.group(1)}: " + " ".join(t.strip() for t in match.group(2).split(",") if t.strip())


def deviation_order(observed: np.ndarray, expected: np.ndarray, limit: int = MAX_BARS) -> np.ndarray:
    """Cells by decreasing standardised deviation |O − E| / √E (cells with E = 0 and O > 0 first), at most ``limit``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(expected > 0, np.abs(observed - expected) / np.sqrt(np.maximum(expected, 1e-300)),
                     np.where(observed > 0, np.inf, 0.0))
    return np.argsort(-z, kind="stable")[:limit]


def counts_figure(check: CheckResult, tools: Any) -> str:
    """Horizontal bars: observed counts against expected counts n·p, the most deviating cell on
    top (standardised deviation |O − E| / √E), labelled ``c<chain>: <tokens>``."""
    figure_class, canvas_class = tools
    observed = np.asarray(check.observed, dtype=float)
    expected = np.asarray(check.expected, dtype=float) * observed.sum()
    order = deviation_order(observed, expected)
    labels = [readable_label(check.cell_labels[i]) if check.cell_labels else str(i) for i in order]
    figure = figure_class(figsize=(9, 1.2 + 0.28 * len(order)))
    axes = figure.subplots()
    positions = np.arange(len(order))[::-1]  # the largest deviation at the top
    axes.barh(positions + 0.2, observed[order], height=0.4, label="observed", color="#c0392b")
    axes.barh(positions - 0.2, expected[order], height=0.4, label="expected (target law)", color="#7f8c8d")
    axes.set_yticks(positions, labels, fontsize=8)
    axes.set_xlabel("count")
    shown = "" if len(order) == len(observed) else f" ({len(order)} most deviating of {len(observed)} cells)"
    axes.set_title(f"{check.name}: observed vs expected, sorted by deviation{shown}", fontsize=10)
    axes.legend(fontsize=8, loc="lower right")
    return _png(figure, canvas_class)


def acceptance_figure(checks: list[CheckResult], tools: Any) -> str:
    """P(draft i accepted) = P(A > i) by position: observed (markers) against theory (lines), one
    colour for each of ``checks`` that counted acceptances."""
    figure_class, canvas_class = tools
    from matplotlib import colormaps

    counted = [(check.name, check.acceptance) for check in checks if check.acceptance is not None]
    palette = colormaps["turbo"]  # one distinct colour per check, however many there are
    figure = figure_class(figsize=(8, 3.8))
    axes = figure.subplots()
    for index, (name, acceptance) in enumerate(counted):
        observed = np.asarray(acceptance["observed"], dtype=float)
        expected = np.asarray(acceptance["expected"], dtype=float)
        observed_rate = (observed[::-1].cumsum()[::-1] / observed.sum())[1:]  # P(A ≥ i+1)
        expected_rate = expected[::-1].cumsum()[::-1][1:]
        positions = np.arange(len(observed_rate))
        color, marker = palette(index / max(1, len(counted) - 1)), "osD^v"[index % 5]
        axes.plot(positions, expected_rate, "-", color=color, alpha=0.7)
        axes.plot(positions, observed_rate, marker, color=color, label=name)
    axes.set_xlabel("draft position i")
    axes.set_ylabel("P(draft i accepted)")
    axes.set_ylim(-0.02, 1.02)
    axes.set_title("Acceptance by position: observed (dots) vs optimal-rule theory Π α (lines)", fontsize=10)
    axes.legend(fontsize=7, ncol=2)
    return _png(figure, canvas_class)


def _cell(value: Any, spec: str = ".3g") -> str:
    if value is None:
        return "—"
    return format(value, spec) if isinstance(value, float) else html.escape(str(value))


def _check_rows(report: AuditReport) -> str:
    rows = []
    for c in report.checks:
        parameters = ", ".join(f"{k}={v}" for k, v in c.parameters.items())
        rows.append(
            f"<tr class='{c.verdict}'><td><b>{html.escape(c.name)}</b><br><span "
            f"class='note'>{html.escape(c.description)}"
            f"</span><br><span class='note'>{html.escape(parameters)}</span></td><td>{c.verdict}</td>"
            f"<td class='num'>{c.n or '—'}</td><td class='num'>{f'{c.look}/{c.num_looks}' if c.look else '—'}</td>"
            f"<td class='num'>{c.num_cells or '—'}</td>"
            f"<td class='num'>{_cell(c.pvalue)}</td><td class='num'>{_cell(c.alpha, '.2g')}</td>"
            f"<td class='num'>{_cell(c.empirical_tv, '.4g')}</td><td class='num'>{_cell(c.detectable_tv, '.4f')}</td>"
            f"<td>{html.escape(c.message)}</td></tr>"
        )
    return "\n".join(rows)


def _diagnosis_section(report: AuditReport) -> str:
    parts = []
    plan, search = report.plan, report.case_search
    notes = ([report.settings.preset_note] if report.settings.preset_note else []) + [o.line() for o in plan.omitted]
    if plan.shortfall is not None:
        notes.insert(0, f"underpowered: {plan.shortfall.sentence()}; {plan.shortfall.fix()}")
    if notes:
        items = "".join(f"<li>{html.escape(note)}</li>" for note in notes)
        parts.append(f"<h2>Power and checks not run</h2><ul>{items}</ul>")
    if report.diagnosis:
        parts.append(f"<h2>Diagnosis</h2><p>{html.escape(report.diagnosis)}</p>")
    if search.case is not None:
        parts.append(f"<h2>Minimal failing case</h2><p>{html.escape(search.case.sentence())}; as a "
                     f"unit test:</p><pre>{html.escape(report.minimal_case_code())}</pre>")
    elif search.note:
        parts.append(f"<p class='note'>Minimal case: none: {html.escape(search.note)}.</p>")
    if report.warnings:
        items = "".join(f"<li><code>{html.escape(w)}</code></li>" for w in report.warnings)
        parts.append(f"<h2>Warnings from the code under audit</h2><ul>{items}</ul>")
    return "".join(parts)


def render_html(report: AuditReport) -> str:
    """The whole page as a string."""
    tools = _matplotlib()
    verdict_class = {0: "pass", 1: "fail"}.get(report.exit_code, "error")
    sections = []
    plotted = [c for c in report.failed if c.observed is not None]
    with_acceptance = [c for c in report.checks if c.acceptance is not None and len(c.acceptance["observed"]) >= 2]
    if tools is None:
        sections.append("<p class='note'>Plots omitted: matplotlib is not installed "
                        "(<code>pip install 'specverify[report]'</code>).</p>")
    else:
        for check in plotted:
            sections.append(f"<h3>{html.escape(check.name)}</h3><p>{html.escape(check.message)}</p>"
                            f"<img alt='observed vs expected counts for {html.escape(check.name)}' "
                            f"src='{counts_figure(check, tools)}'>")
        if with_acceptance:
            sections.append("<h3>Acceptance by position</h3><p>How often each draft position was accepted, "
                            "against the rate of the optimal (lossless) rule. A lossless rule may accept less "
                            "often than this (it is then merely slower); accepting more often at a single "
                            "draft is a loss (see the acceptance-rate check).</p>"
                            f"<img alt='acceptance by position' src='{acceptance_figure(with_acceptance, tools)}'>")
    if not plotted and tools is not None:
        sections.insert(0, "<p>No check failed, so there are no observed-vs-expected plots.</p>")
    sections += tree_sections(report.checks)  # tree level: the drafted shapes of each failing check
    settings = report.settings
    budget = html.escape(settings.budget.describe())
    timings = report.timings
    rate = f", {timings['rows_per_s']:,.0f} rows/s" if timings.get("rows_per_s") else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>specverify audit: {html.escape(settings.target)}</title>
<style>{_CSS}</style></head><body>
<h1>specverify audit of <code>{html.escape(settings.target)}</code></h1>
<p class="verdict {verdict_class}">{html.escape(report.verdict.upper())} (exit status {report.exit_code}):
{html.escape(report.summary)}</p>
<p>Level <b>{html.escape(settings.level)}</b>; budget {budget}; family-wise α = {settings.alpha:g} split by
{html.escape(settings.correction)} (α share {_cell(report.plan.alpha_share, '.3g')} per statistical check); power
{settings.power:g}; seed {settings.seed}; device {html.escape(settings.device)};
per-call timeout {settings.timeout_s:g} s.
Wall time {timings.get('total_s', 0.0):.1f} s{rate}.</p>
{_diagnosis_section(report)}
<h2>How the audit works</h2><p>{_METHOD}</p>
<h2>Checks</h2>
<table><tr><th>check</th><th>verdict</th><th>n</th><th>look</th><th>cells</th><th>p-value</th><th>α share</th>
<th>TV observed</th><th>TV detectable</th><th>finding</th></tr>
{_check_rows(report)}
</table>
<p class="note">TV observed: the total-variation distance between the observed cell frequencies and the target
law (sampling noise alone makes it positive); for the exact check, the exact TV of one step. TV detectable: the
deviation the check detects with power {settings.power:g} at its final look. Look: a statistical check is tested
at n/16, n/4 and n samples, each look at its share of the check's α (α-spending α·t³, Lan &amp; DeMets
1983), and stops at the first look that rejects; "2/3" means the second look rejected.</p>
<h2>Plots</h2>
{''.join(sections)}
<p class="note">Generated by specverify; replay with <code>{html.escape(report.replay_command)}</code>.</p>
</body></html>
"""


def write_html(report: AuditReport, path: str | Path) -> Path:
    """Write :func:`render_html` to ``path`` and return the path."""
    path = Path(path)
    path.write_text(render_html(report), encoding="utf-8")
    return path
