"""The CI gate as a user lives with it: a malformed output stops the audit with one message, each
note said once (the tree level's in the tree's layout), replay lines that carry every option that
changes the audit, a minimal repro that imports the user's own module, a short AssertionError."""

from __future__ import annotations

import io

import pytest
import torch

import specverify
from specverify.auditing.defaults import AuditVerdict
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
    # one message, no table of errors
    assert text.count("returned dtype torch.float32") == 1 and "error  " not in text, text


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
    note = next(o for o in omitted_checks(battery, session) if "exact-tree-step" in o.names)
    assert "[B, N+1]" in note.fix and "[B, K+1]" not in note.fix and "column N" in note.fix


def test_the_replay_line_carries_every_option_that_changes_the_audit():
    """Every option of `specverify audit` is either output-only (OUTPUT_OPTIONS) or set here to a value
    other than its default; the replay line, parsed again, gives back each such option's value."""
    import shlex
    from dataclasses import fields

    from specverify.auditing.audit_report import AuditReport, AuditSettings
    from specverify.auditing.checks import resolve_budget
    from specverify.cli import build_parser
    from specverify.cli.audit import CHOOSING_OPTIONS, OUTPUT_OPTIONS, audit_keywords

    command = ["audit", "http://127.0.0.1:9/v1", "--level", "endpoint", "--budget", "123", "--alpha", "0.0123",
               "--seed", "5", "--device", "cuda:1", "--timeout", "33.5", "--isolation", "none",
               "--checks", "pit-T1-top8,greedy-identity", "--no-fail-fast", "--allow-underpowered",
               "--baseline", "http://127.0.0.1:8/v1", "--model", "my model", "--concurrency", "7",
               "--deadline", "99", "--seeded-determinism", "--context-length", "2048", "--no-request-space",
               "--request-space-only"]
    parser = build_parser()
    given = parser.parse_args(command)
    defaults = parser.parse_args(["audit"])
    audit_options = [dest for dest in vars(given)
                     if dest not in (*OUTPUT_OPTIONS, *CHOOSING_OPTIONS, "command", "handler")]
    unset = [dest for dest in audit_options if getattr(given, dest) == getattr(defaults, dest)]
    assert not unset, f"set these options in the test (and say them in the replay line): {unset}"

    keywords = audit_keywords(given, int(given.seed))
    level_options = {k: v for k, v in keywords.items() if k not in {f.name for f in fields(AuditSettings)}
                     and k not in ("checks", "isolation")}
    settings_asked = AuditSettings(target=given.target, level=keywords["level"],
                                   budget=resolve_budget(keywords["budget"]), alpha=keywords["alpha"],
                                   seed=keywords["seed"], device=keywords["device"], timeout_s=keywords["timeout_s"],
                                   selected=tuple(keywords["checks"]), fail_fast=keywords["fail_fast"],
                                   allow_underpowered=keywords["allow_underpowered"], level_options=level_options)
    report = AuditReport(settings_asked, checks=(), verdict=AuditVerdict.COULD_NOT_AUDIT, summary="",
                         detectable_tv=None, isolation={"mode": keywords["isolation"]})
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


# --------------------------------------------------------------------------------------------
# The minimal repro: the user's own import, the law the wrong tokens follow, the closest known bug
# --------------------------------------------------------------------------------------------

STEP_P = [[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]
STEP_Q = [[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]]
ROWS = 20_000


def step_tokens(rule, drafts, seed=11):
    rows = ROWS
    p = torch.tensor(STEP_P).repeat(rows, 1, 1)
    q = torch.tensor(STEP_Q).repeat(rows, 1, 1)
    return rule(p, q, torch.tensor([drafts]).repeat(rows, 1), torch.Generator().manual_seed(seed)).numpy()


def loop_rule(target_probs, draft_probs, draft_tokens, generator):
    """Modified rejection sampling written row by row with its own draws (correct, differently)."""
    rows, k = draft_tokens.shape
    emitted = torch.full((rows, k + 1), -1, dtype=torch.int64)
    for b in range(rows):
        for i in range(k + 1):
            if i == k:
                emitted[b, i] = torch.multinomial(target_probs[b, k].double(), 1, generator=generator)
                break
            x = int(draft_tokens[b, i])
            if torch.rand(1, generator=generator, dtype=torch.float64) * draft_probs[b, i, x] < target_probs[b, i, x]:
                emitted[b, i] = x
                continue
            residual = (target_probs[b, i] - draft_probs[b, i]).clamp(min=0).double()
            emitted[b, i] = torch.multinomial(residual, 1, generator=generator)
            break
    return emitted


@pytest.mark.parametrize("entry, column, law", [("bonus_from_draft", 2, "the bonus token follows q_1, not p_2"),
                                                ("residual_is_target", 0, "the correction at position 0 follows p_0,")])
def test_the_law_the_wrong_tokens_follow_is_named(entry, column, law):
    from specverify.auditing.diagnosis import followed_law
    from specverify.auditing.sampler.catalog import CATALOG

    drafts = [3, 0] if entry == "bonus_from_draft" else [0, 3]
    tokens = step_tokens(CATALOG[entry].fn, drafts)
    assert followed_law(torch.tensor(STEP_P).double().numpy(), torch.tensor(STEP_Q).double().numpy(), drafts,
                        tokens, column).startswith(law)


def test_correct_rules_are_never_read_as_following_a_wrong_law():
    """The reference, and a row-by-row rule drawing its randomness differently (fewer rows: it is slow)."""
    from specverify.auditing.diagnosis import closest_catalog_entry, followed_law
    from specverify.core.rules import verify

    p, q = torch.tensor(STEP_P).double().numpy(), torch.tensor(STEP_Q).double().numpy()
    for rule, drafts in [(verify, [3, 0]), (verify, [0, 3]), (loop_rule, [0, 3])]:
        tokens = step_tokens(rule, drafts, seed=5) if rule is verify else step_tokens_small(rule, drafts)
        for column in range(3):
            assert followed_law(p, q, drafts, tokens, column) == "", (rule, drafts, column)
        assert closest_catalog_entry(p, q, drafts, tokens, seed=5) == ""


def step_tokens_small(rule, drafts, rows=2_000):
    p = torch.tensor(STEP_P).repeat(rows, 1, 1)
    q = torch.tensor(STEP_Q).repeat(rows, 1, 1)
    return rule(p, q, torch.tensor([drafts]).repeat(rows, 1), torch.Generator().manual_seed(3)).numpy()


def test_the_closest_known_bug_is_named():
    from specverify.auditing.diagnosis import closest_catalog_entry
    from specverify.auditing.sampler.catalog import CATALOG

    p, q = torch.tensor(STEP_P).double().numpy(), torch.tensor(STEP_Q).double().numpy()
    tokens = step_tokens(CATALOG["residual_is_target"].fn, [0, 3], seed=99)  # another seed than the entries get
    assert "catalog:residual-is-target" in closest_catalog_entry(p, q, [0, 3], tokens, seed=5)


@pytest.mark.parametrize("target, binding", [
    ("my_engine.sampling:verify_lossy", "from my_engine.sampling import verify_lossy"),
    ("reference", "from specverify.core.rules import verify"),
    ("catalog:bonus-from-draft", "from specverify.auditing.sampler.catalog import CATALOG"),
])
def test_the_repro_imports_the_users_module(target, binding):
    from specverify.auditing.minimal_case import MinimalCase

    case = MinimalCase(target, "step-K1", 0, ((0.5, 0.5), (0.5, 0.5)), ((1.0, 0.0),), (0,), 100, 7, 1, 1, 0.5, 0.6, 7.0)
    code = case.code(replay="specverify audit x --seed 3")
    assert binding in code and "specverify.auditing.loading" not in code
    assert "# found again from the audit's seed by: specverify audit x --seed 3" in code
    compile(code, "repro.py", "exec")


def lossy_bonus(target_probs, draft_probs, draft_tokens, generator):
    from specverify.auditing.sampler.catalog import CATALOG

    return CATALOG["bonus_from_draft"].fn(target_probs, draft_probs, draft_tokens, generator)


@pytest.fixture(scope="module")
def short_message():
    with pytest.raises(AssertionError) as raised:
        specverify.assert_lossless(lossy_bonus, budget="quick", isolation="none", progress=None,
                                   checks=["bonus-position", "correction-position"])
    return str(raised.value)


def test_the_assertion_error_is_short_and_says_how_to_get_the_rest(short_message, monkeypatch):
    text = short_message
    assert "diagnosis: The bonus token" in text and "follows q_" in text and "catalog:bonus-from-draft" in text
    assert "what it checks:" not in text and "SPECVERIFY_VERBOSE=1 or `pytest -vv`" in text
    assert "specverify.auditing.loading" not in text and "_spec.loader.exec_module" in text
    assert len(text.splitlines()) <= 30, text


def test_the_repro_runs_from_the_directory_the_audit_ran_in(short_message, monkeypatch):
    from pathlib import Path

    code = short_message.split("as a unit test:\n", 1)[1].split("\n(seed ", 1)[0]
    code = "\n".join(line[4:] for line in code.splitlines())
    namespace: dict = {}
    exec(compile(code, "repro.py", "exec"), namespace)
    test = next(v for k, v in namespace.items() if k.startswith("test_"))
    with pytest.raises(AssertionError):
        test()
    from specverify.core.rules import verify

    namespace["lossy_bonus"] = verify  # a correct rule passes it
    test()
    assert Path("tests/auditing/test_gate_lived.py").is_file()  # the audit ran here (relative target path)


# --------------------------------------------------------------------------------------------
# What the plan and the shortfall say
# --------------------------------------------------------------------------------------------


def test_the_plan_suggests_the_quick_budget_only_when_it_is_not_already_quick():
    from specverify.auditing.checks import resolve_budget
    from specverify.auditing.progress import header
    from tests.auditing.display_checks import StepCheck, plan_of

    checks = [StepCheck("step-K1")]
    plans = [plan_of(1000)]
    said = {name: header(target="t", level="sampler", budget=resolve_budget(name), alpha=1e-3, checks=checks,
                         plans=plans) for name in ("quick", "standard")}
    assert "--budget quick" not in said["quick"] and "--budget quick" in said["standard"]


def test_a_production_checks_own_tv_is_not_called_the_levels_ceiling():
    from specverify.auditing.power import PowerShortfall

    production = PowerShortfall("sampler", "10", 0.909, "production-qwen-K1", 3.2, 5832)
    assert "level's ceiling TV 0.909" not in production.sentence() and "0.909" in production.sentence()
    assert "sampler level's ceiling TV 0.25" in production.sentence()
    toy = PowerShortfall("sampler", "10", 0.25, "step-K1", 3.2, 629)
    assert "sampler level's ceiling TV 0.25 that a pass requires" in toy.sentence()
