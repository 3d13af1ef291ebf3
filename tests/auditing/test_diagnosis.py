"""The diagnosis reads where the loss is from the pattern of verdicts, on catalog entries whose bug
class is known (specverify.auditing.sampler.catalog), and stays silent for a lossless rule."""

from __future__ import annotations

import pytest

import specverify
from specverify.auditing.checks import CheckResult, Locus
from specverify.auditing.diagnosis import acceptance_deviations, diagnose
from specverify.auditing.sampler.catalog import CATALOG

PATTERN = ["exact-step", "step-K1", "bonus-position", "correction-position", "disjoint-supports"]


@pytest.mark.parametrize("name, bug_class, expected", [
    ("residual_is_target", "residual", "the correction token drawn after a rejection is wrong; accepted drafts and the "
                                       "bonus token are right"),
    ("bonus_from_draft", "bonus", "the bonus token (drawn when all k drafts are accepted) is wrong"),
    ("inverted_ratio", "acceptance", "the acceptance test is wrong"),
    ("batch_rows_rolled", "batching", "rows of a batch influence each other"),
])
def test_diagnosis_names_the_broken_piece_of_catalog_entries(name, bug_class, expected):
    assert CATALOG[name].bug_class == bug_class
    report = specverify.audit(f"catalog:{name}", budget="quick", checks=PATTERN, fail_fast=False)
    assert report.exit_code == 1
    assert expected in report.diagnosis.lower(), report.diagnosis
    assert report.diagnosis in report.explain()
    if name == "residual_is_target":  # (p − q)+ = p on disjoint supports: the residual confused with p
        assert "disjoint-supports passed" in report.diagnosis


def test_no_diagnosis_without_a_failure():
    assert specverify.audit("reference", budget=200, checks=["step-K1"]).diagnosis == ""


def _result(name, verdict, kind="goodness-of-fit", acceptance=None, parameters=None, production_shape=False,
            locus=None):
    return CheckResult(name, "", kind, parameters or {}, verdict, "", acceptance=acceptance,
                       production_shape=production_shape, locus=locus)


def test_acceptance_rates_off_the_optimal_rule_are_named():
    optimal = {"observed": (500.0, 500.0), "expected": (0.5, 0.5)}
    greedy = {"observed": (200.0, 800.0), "expected": (0.5, 0.5)}
    assert acceptance_deviations([_result("step-K1", "pass", acceptance=optimal)]) == []
    assert acceptance_deviations([_result("step-K1", "fail", acceptance=greedy)]) == [
        "step-K1 draft 0: accepted 0.800 vs 0.500"]


def test_contract_and_context_patterns():
    checks = [_result("randomness-source", "fail", kind="contract", locus=Locus.RANDOMNESS_SOURCE),
              _result("step-K1", "pass", locus=Locus.SINGLE_DRAFT)]
    assert "generator" in diagnose(checks)
    loops = [_result("step-K1", "pass", locus=Locus.SINGLE_DRAFT), _result("step-K4", "pass", locus=Locus.MULTI_DRAFT),
             _result("decoding-loop-order1", "fail", locus=Locus.CONTEXT)]
    assert "whole decoding loops" in diagnose(loops)
    shape = {"V": 151936, "K": 1, "B": 6, "dtype": "bfloat16", "layout": "strided"}
    vocabulary = [_result("step-K1", "pass", locus=Locus.SINGLE_DRAFT),  # the production check declares its shape
                  _result("production-qwen-K1", "fail", parameters=shape, production_shape=True)]
    text = diagnose(vocabulary)
    assert "production shapes only" in text and "V=151936" in text


def test_json_and_html_carry_the_diagnosis(tmp_path):
    from specverify.auditing.reports.html_page import render_html
    from specverify.auditing.reports.json_file import report_to_dict

    report = specverify.audit("catalog:bonus_from_draft", budget=2000, checks=["bonus-position", "correction-position"])
    assert report_to_dict(report)["diagnosis"] == report.diagnosis != ""
    assert report_to_dict(report)["replay"].startswith("specverify audit catalog:bonus_from_draft")
    page = render_html(report)
    assert "<h2>Diagnosis</h2>" in page and "bonus token" in page


def test_the_reading_follows_loci_not_names():
    """Checks named anything read the same by their loci; the same names without loci say nothing of where."""
    renamed = [_result("my-exact", "pass", kind="exact", locus=Locus.ONE_ROW_EXACT),
               _result("my-bonus", "pass", locus=Locus.BONUS),
               _result("my-correction", "fail", locus=Locus.CORRECTION),
               _result("my-disjoint", "pass", locus=Locus.RESIDUAL_IS_TARGET)]
    text = diagnose(renamed)
    assert "rows of a batch influence each other" in text and "my-exact passed" in text
    without_exact = renamed[1:]
    text = diagnose(without_exact)
    assert "correction token drawn after a rejection is wrong" in text
    assert "my-bonus passed" in text and "my-disjoint passed" in text
    unlocated = [_result(c.name, c.verdict) for c in without_exact]
    assert "run the whole battery" in diagnose(unlocated)


def test_every_sampler_check_that_isolates_a_piece_declares_its_locus():
    from specverify.auditing.sampler.battery import SamplerBattery
    from specverify.core.rules import verify

    battery = SamplerBattery()
    loci = {c.name: c.locus for c in battery.checks(battery.open_session(verify, device="cpu", timeout_s=10))}
    assert loci["bonus-position"] is Locus.BONUS and loci["correction-position"] is Locus.CORRECTION
    assert loci["disjoint-supports"] is Locus.RESIDUAL_IS_TARGET and loci["exact-step"] is Locus.ONE_ROW_EXACT
    locating = sorted(name for name, locus in loci.items() if locus is not None and locus.locating)
    assert locating == ["bonus-position", "correction-position", "disjoint-supports", "exact-step"]
