"""Audit reports: the terminal table, the versioned JSON (deterministic for a seed), the HTML page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specverify.auditing.reports import html_page
from specverify.auditing.reports.html_page import render_html, write_html
from specverify.auditing.reports.json_file import SCHEMA, deterministic_view, report_to_dict, write_json
from specverify.auditing.reports.terminal import format_report
from specverify.auditing.runner import audit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VECTORIZED = f"{EXAMPLES / 'vectorized_verify.py'}:verify"
BUGGY_BONUS = f"{EXAMPLES / 'buggy_bonus.py'}:verify"
SMALL_CHECKS = ["randomness-source", "exact-step", "step-K4", "bonus-position", "decoding-loop-order1",
                "acceptance-rate", "inputs-unchanged"]


@pytest.fixture(scope="module")
def buggy_report():
    return audit(BUGGY_BONUS, budget=3000, checks=SMALL_CHECKS)


def test_same_seed_gives_identical_json_and_another_seed_does_not():
    first = report_to_dict(audit(VECTORIZED, budget=1500, seed=7, checks=SMALL_CHECKS))
    again = report_to_dict(audit(VECTORIZED, budget=1500, seed=7, checks=SMALL_CHECKS))
    other = report_to_dict(audit(VECTORIZED, budget=1500, seed=8, checks=SMALL_CHECKS))
    assert first["timings"] != again["timings"]
    assert json.dumps(deterministic_view(first), sort_keys=True) == json.dumps(deterministic_view(again),
                                                                               sort_keys=True)
    assert deterministic_view(first) != deterministic_view(other)
    assert first["verdict"] == again["verdict"] == "no loss detected"


def test_json_schema_has_every_field(buggy_report, tmp_path):
    path = write_json(buggy_report, tmp_path / "report.json")
    document = json.loads(path.read_text(encoding="utf-8"))
    assert document["schema"] == SCHEMA == "specverify.audit/1"
    for key in ("target", "level", "verdict", "exit_code", "summary", "seed", "alpha", "alpha_share", "correction",
                "power", "detectable_tv", "budget", "device", "checks", "timings"):
        assert key in document
    assert document["verdict"] == "loss detected" and document["exit_code"] == 1
    assert document["budget"] == {"name": "3000", "epsilon": None, "samples": 3000}
    for check in document["checks"]:
        for key in ("name", "description", "kind", "parameters", "n", "statistic", "pvalue", "alpha_share",
                    "empirical_tv", "detectable_tv", "verdict", "message"):
            assert key in check
    bonus = next(c for c in document["checks"] if c["name"] == "bonus-position")
    assert bonus["verdict"] == "fail" and bonus["pvalue"] <= bonus["level"] < bonus["alpha_share"]
    assert bonus["num_looks"] == 3 and bonus["n"] <= 3000  # it stopped at the first look that rejected
    assert len(bonus["cells"]["observed"]) == len(bonus["cells"]["expected"]) == bonus["num_cells"]
    assert sum(bonus["cells"]["observed"]) == bonus["n"]


def test_terminal_report_lists_every_check_and_the_verdict(buggy_report):
    text = format_report(buggy_report)
    for check in buggy_report.checks:
        assert check.name in text
    assert "LOSS DETECTED (exit 1)" in text and "bonus-position [fail]" in text and "p-value" in text


def test_html_is_self_contained_with_plots(buggy_report, tmp_path):
    page = write_html(buggy_report, tmp_path / "report.html").read_text(encoding="utf-8")
    failing_with_cells = [c for c in buggy_report.failed if c.observed is not None]
    assert page.count("<img") == len(failing_with_cells) + 1  # one per failing check + acceptance by position
    assert page.count("data:image/png;base64,") == page.count("<img")
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "How the audit works" in page and "Acceptance by position" in page
    for check in buggy_report.checks:
        assert check.description.split(":")[0][:30] in page.replace("&#x27;", "'")


def test_html_without_matplotlib_says_so(buggy_report, monkeypatch):
    monkeypatch.setattr(html_page, "_matplotlib", lambda: None)
    page = render_html(buggy_report)
    assert "<img" not in page and "matplotlib is not installed" in page
