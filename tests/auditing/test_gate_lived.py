"""The CI gate as a user lives with it: a malformed output stops the audit with one message, each
note said once (the tree level's in the tree's layout), replay lines that carry every option that
changes the audit, a minimal repro that imports the user's own module, a short AssertionError."""

from __future__ import annotations

import torch

import specverify
from specverify.auditing.reports.terminal import format_report


def wrong_dtype(target_probs, draft_probs, draft_tokens, generator):
    batch, num_draft = draft_tokens.shape
    return torch.zeros(batch, num_draft + 1)  # float32: the layout wants int64 tokens


LOCATING = ["step-K1", "bonus-position", "correction-position", "disjoint-supports"]
"""A few cheap checks (planning the production-shape checks takes ~30 s of CPU)."""


def test_the_first_malformed_output_ends_the_audit_with_one_message():
    report = specverify.audit(wrong_dtype, budget="quick", isolation="none", checks=LOCATING)
    ran = [c for c in report.checks if c.verdict != "skipped"]
    assert len(ran) == 1 and ran[0].verdict == "error" and ran[0].fault == "malformed", ran
    assert report.verdict == "could not audit" and report.exit_code == 2
    assert f"the other {len(report.checks) - 1} checks were not run" in report.summary
    assert report.replay_checks == (ran[0].name,) and f"--checks {ran[0].name}" in report.replay_command
    text = format_report(report)
    assert text.count("returned dtype torch.float32") == 1 and "error  " not in text, text  # one message, no table of errors
