"""The CI gate as a user lives with it: a malformed output stops the audit with one message, each
note said once (the tree level's in the tree's layout), replay lines that carry every option that
changes the audit, a minimal repro that imports the user's own module, a short AssertionError."""

from __future__ import annotations

import io

import pytest
import torch

import specverify
from specverify.auditing.progress import LineProgress
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


def without_uniforms(target_probs, draft_probs, draft_tokens, generator):
    from specverify.core.rules import verify

    return verify(target_probs, draft_probs, draft_tokens, generator)


def lossy_without_uniforms(target_probs, draft_probs, draft_tokens, generator):
    from specverify.auditing.sampler.catalog import CATALOG

    return CATALOG["residual_is_target"].fn(target_probs, draft_probs, draft_tokens, generator)


def test_the_uniforms_note_is_said_once_in_a_pass():
    stream = io.StringIO()
    report = specverify.audit(without_uniforms, budget="quick", isolation="none", progress=LineProgress(stream),
                              checks=["exact-step", "step-K1"])
    assert report.exit_code == 0 and "not run: exact-step" in report.summary
    said = stream.getvalue() + format_report(report)
    assert said.count("uniforms=None") == 1, said


def test_the_uniforms_note_is_said_once_in_a_failing_assert_lossless():
    stream = io.StringIO()
    with pytest.raises(AssertionError) as raised:
        specverify.assert_lossless(lossy_without_uniforms, budget="quick", isolation="none",
                                   progress=LineProgress(stream), checks=["exact-step", "correction-position"])
    said = stream.getvalue() + str(raised.value)
    assert said.count("uniforms=None") == 1, said


def test_without_a_progress_display_the_report_says_the_note():
    report = specverify.audit(without_uniforms, budget="quick", isolation="none", checks=["exact-step", "step-K1"])
    assert format_report(report).count("uniforms=None") == 1


def test_the_tree_levels_uniforms_note_gives_the_tree_layout():
    from specverify.auditing.omissions import omitted_checks
    from specverify.auditing.runner import load_battery
    from specverify.core.tree_rules import verify_tree

    def tree_without_uniforms(target_probs, draft_probs, tree_tokens, parents, generator):
        return verify_tree(target_probs, draft_probs, tree_tokens, parents, generator)

    battery = load_battery("tree")
    session = battery.open_session(tree_without_uniforms, device="cpu", timeout_s=60, isolation="none")
    note = next(o for o in omitted_checks("tree", battery, session) if "exact-tree-step" in o.names)
    assert "[B, N+1]" in note.fix and "[B, K+1]" not in note.fix and "column N" in note.fix


def test_the_replay_line_carries_every_option_that_changes_the_audit():
    """Every option of `specverify audit` is either output-only (OUTPUT_OPTIONS) or set here to a value
    other than its default; the replay line, parsed again, gives back each such option's value."""
    import shlex
    from dataclasses import fields

    from specverify.auditing.checks import resolve_budget
    from specverify.auditing.runner import AuditReport
    from specverify.cli import build_parser
    from specverify.cli.audit import OUTPUT_OPTIONS, audit_keywords

    command = ["audit", "http://127.0.0.1:9/v1", "--level", "endpoint", "--budget", "123", "--alpha", "0.0123",
               "--seed", "5", "--device", "cuda:1", "--timeout", "33.5", "--isolation", "none",
               "--checks", "pit-T1-top8,greedy-identity", "--no-fail-fast", "--allow-underpowered",
               "--baseline", "http://127.0.0.1:8/v1", "--model", "my model", "--concurrency", "7",
               "--deadline", "99", "--seeded-determinism"]
    parser = build_parser()
    given = parser.parse_args(command)
    defaults = parser.parse_args(["audit"])
    audit_options = [dest for dest in vars(given) if dest not in (*OUTPUT_OPTIONS, "command", "handler")]
    unset = [dest for dest in audit_options if getattr(given, dest) == getattr(defaults, dest)]
    assert not unset, f"set these options in the test (and say them in the replay line): {unset}"

    keywords = audit_keywords(given, int(given.seed))
    level_options = {k: v for k, v in keywords.items() if k not in {f.name for f in fields(AuditReport)}
                     and k not in ("budget", "checks", "isolation", "timeout_s")}
    report = AuditReport(target=given.target, level=keywords["level"], budget=resolve_budget(keywords["budget"]),
                         alpha=keywords["alpha"], alpha_share=None, correction="bonferroni", power=0.99,
                         seed=keywords["seed"], device=keywords["device"], timeout_s=keywords["timeout_s"],
                         checks=(), verdict="could not audit", exit_code=2, summary="", detectable_tv=None,
                         isolation={"mode": keywords["isolation"]}, selected=tuple(keywords["checks"]),
                         fail_fast=keywords["fail_fast"], allow_underpowered=keywords["allow_underpowered"],
                         level_options=level_options)
    for line in (report.replay_command, report.full_command):
        words = shlex.split(line)
        assert words[:2] == ["specverify", "audit"]
        replayed = parser.parse_args(words[1:])
        assert settings(replayed, audit_options) == settings(given, audit_options), line


def settings(args, names):
    """The options ``names`` of parsed ``args``, fail-fast resolved to the budget's default where unset."""
    from specverify.auditing.checks import resolve_budget
    from specverify.auditing.defaults import default_fail_fast

    values = {name: getattr(args, name) for name in names}
    if values["fail_fast"] is None:
        values["fail_fast"] = default_fail_fast(resolve_budget(values["budget"]).name)
    return values
