"""Report details for a new user: footer units, bars sorted by deviation with readable labels, the
acceptance legend with every step check in its own colour, third-party warnings kept in the report."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

import specverify
from specverify.auditing.isolation.captured import captured_warnings
from specverify.auditing.reports.html_page import deviation_order, readable_label, render_html
from specverify.auditing.reports.terminal import footer, format_report


def test_footer_says_what_its_rows_and_the_tables_samples_are():
    report = specverify.audit("reference", budget=200, checks=["step-K1", "decoding-loop-order1"])
    text = footer(report)
    assert "400 samples tested (the table's n)" in text
    assert "rows (one per request row per call)" in text


def test_bars_are_sorted_by_standardised_deviation_and_labels_are_short():
    observed = np.array([100.0, 90.0, 5.0, 1.0])
    expected = np.array([100.0, 50.0, 5.0, 0.0])
    assert list(deviation_order(observed, expected)) == [3, 1, 0, 2]
    assert readable_label("chain 2 tokens (3, rest)") == "c2: 3 rest"
    assert readable_label("chain 0 tokens (1, 0, 2)") == "c0: 1 0 2"
    assert readable_label("first token = draft") == "first token = draft"


def test_acceptance_plot_includes_step_k1_in_a_colour_of_its_own(monkeypatch):
    from specverify.auditing.reports import html_page

    seen = []
    monkeypatch.setattr(html_page, "acceptance_figure", lambda checks, tools: seen.extend(checks) or "data:,")
    report = specverify.audit("reference", budget=200, checks=["step-K1", "step-K2", "step-K4"])
    render_html(report)
    assert [c.name for c in seen] == ["step-K1", "step-K2", "step-K4"]
    from matplotlib import colormaps

    colours = {colormaps["turbo"](i / 10) for i in range(11)}
    assert len(colours) == 11


def test_third_party_warnings_go_to_the_report_not_the_terminal(capsys):
    from specverify.core.rules import verify

    def noisy(target_probs, draft_probs, draft_tokens, generator):
        warnings.warn("`old_argument` is deprecated", FutureWarning, stacklevel=1)
        logging.getLogger("transformers.generation").warning("Passing `generation_config` is deprecated")
        return verify(target_probs, draft_probs, draft_tokens, generator)

    report = specverify.audit(noisy, budget=200, checks=["step-K1"])
    captured = capsys.readouterr()
    assert "deprecated" not in captured.err + captured.out
    calls = f" ({report.checks[0].calls}×)" if report.checks[0].calls > 1 else ""  # one call per look
    assert report.warnings == (f"FutureWarning: `old_argument` is deprecated{calls}",
                               f"transformers.generation warning: Passing `generation_config` is deprecated{calls}")
    assert "2 warning(s) from the code under audit" in format_report(report)


def test_captured_warnings_count_repeats_and_restore_logging():
    with captured_warnings() as caught:
        for _ in range(3):
            warnings.warn("again", DeprecationWarning, stacklevel=1)
    assert caught == ["DeprecationWarning: again (3×)"]
    assert logging.Logger.callHandlers.__name__ == "callHandlers"


def test_decoder_level_progress_states_calls_and_time():
    import io

    from specverify.auditing.progress import LineProgress

    stream = io.StringIO()
    specverify.audit("reference", level="decoder", budget=20, checks=["determinism", "position-laws"],
                     progress=LineProgress(stream))
    first = stream.getvalue().splitlines()[0]
    assert "level decoder" in first and "calls in all; expected ~" in first
    assert "s per call of the function: the rest takes ~" in stream.getvalue()  # measured after the first check


def test_a_plain_callable_is_called_before_each_check_and_once_at_the_end():
    seen: list[tuple[int, int, str]] = []
    specverify.audit("reference", budget=10, checks=["step-K1", "inputs-unchanged"], isolation="none",
                     allow_underpowered=True, progress=lambda done, total, name: seen.append((done, total, name)))
    assert seen == [(0, 2, "step-K1"), (1, 2, "inputs-unchanged"), (2, 2, "done")]


def test_a_progress_that_is_neither_a_display_nor_callable_is_refused_with_the_fix():
    with pytest.raises(TypeError, match="progress: expected an AuditProgress"):
        specverify.audit("reference", budget=10, checks=["step-K1"], isolation="none", progress="lines")
