"""The CI gate a user can trust and act on: no pass without power, a first failure that
names the bug with a minimal case to paste, what did not run said with its fix, one error said
once with the expected signature, the replay of what failed, CI formats, the ETA at the user's speed."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from types import SimpleNamespace

import pytest

import specverify
from specverify.auditing.checks import CheckResult, Verdict, resolve_budget
from specverify.auditing.defaults import POWER_CEILING_TV
from specverify.auditing.loading import load_target
from specverify.auditing.power import power_shortfall
from specverify.auditing.progress import LineProgress
from specverify.auditing.reports.github_annotations import workflow_commands
from specverify.auditing.reports.json_file import report_to_dict
from specverify.auditing.reports.junit_xml import junit_tree
from specverify.auditing.reports.terminal import format_report
from specverify.auditing.runner import _verdict, load_battery, plan_checks
from specverify.auditing.signatures import SPEC_SIGNATURES

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parents[2]
BUGGY_BONUS = f"{ROOT / 'examples' / 'buggy_bonus.py'}:verify"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
ENV.pop("GITHUB_ACTIONS", None)


# --------------------------------------------------------------------------------------------
# No power, no pass
# --------------------------------------------------------------------------------------------


def test_a_budget_without_power_does_not_pass():
    report = specverify.audit("reference", budget=10, checks=["step-K1", "acceptance-rate"], isolation="none")
    assert report.verdict == "underpowered" and report.exit_code == 2
    shortfall = report.plan.shortfall
    assert shortfall.check == "step-K1" and shortfall.detectable > 1
    assert "which no deviation reaches" in report.summary and f"--budget {shortfall.needed}" in report.summary
    allowed = specverify.audit("reference", budget=10, checks=["step-K1", "acceptance-rate"], isolation="none",
                               allow_underpowered=True)
    assert allowed.exit_code == 0 and "underpowered, allowed" in allowed.summary
    assert allowed.replay_command.endswith("--allow-underpowered")
    assert report_to_dict(report)["power_shortfall"]["ceiling"] == POWER_CEILING_TV["sampler"]


def test_the_budget_that_the_fix_names_reaches_the_ceiling():
    report = specverify.audit("reference", budget=10, checks=["step-K1", "acceptance-rate"], isolation="none")
    again = specverify.audit("reference", budget=report.plan.shortfall.needed, checks=["step-K1", "acceptance-rate"],
                             isolation="none")
    assert again.plan.shortfall is None and again.exit_code == 0
    assert again.detectable_tv <= POWER_CEILING_TV["sampler"]


def test_a_failure_is_still_a_failure_when_underpowered():
    failing = CheckResult("step-K1", "", "goodness-of-fit", {}, Verdict.FAIL, "lossy", alpha=1e-4, detectable_tv=1.5)
    shortfall = SimpleNamespace(sentence=lambda: "short", fix=lambda: "fix")
    verdict, _, _ = _verdict([failing], 1e-3, 1e-4, shortfall=shortfall)
    assert (verdict, verdict.exit_code) == ("loss detected", 1)


@pytest.mark.parametrize("level", ["sampler", "tree"])
def test_every_named_budget_is_within_the_ceiling(level):
    battery = load_battery(level)
    session = battery.open_session(load_target("reference", level), device="cpu", timeout_s=60, isolation="none")
    checks = battery.checks(session)
    for name in ("quick", "standard", "thorough"):
        budget = resolve_budget(name)
        plans, share = plan_checks(checks, budget, 1e-3, 0, level)
        assert power_shortfall(checks, plans, level, budget, share) is None, (level, name)
    plans, share = plan_checks(checks, resolve_budget(10), 1e-3, 0, level)
    assert power_shortfall(checks, plans, level, resolve_budget(10), share) is not None


PRODUCTION_CHECKS = {
    "sampler": ["production-qwen-K1", "production-gpt2-K4", "production-K32", "production-K12",
                "production-batch-1024"],
    "tree": ["tree-large-vocabulary", "tree-dynamic-deep-independent", "tree-dynamic-wide-deterministic"],
}


@pytest.mark.parametrize("level", sorted(PRODUCTION_CHECKS))
def test_production_checks_at_budget_10_end_underpowered_not_in_an_error(level):
    """At 10 samples a check of several chains leaves some chain without rows at its first looks; such a
    chain is no evidence (p = 1), not a malformed test: the audit once ended in "could not audit" here,
    exit 2 for the wrong reason."""
    battery = load_battery(level)
    session = battery.open_session(load_target("reference", level), device="cpu", timeout_s=60, isolation="none")
    names = {c.name for c in battery.checks(session)}
    assert set(PRODUCTION_CHECKS[level]) <= names
    report = specverify.audit("reference", level=level, budget=10, checks=PRODUCTION_CHECKS[level], isolation="none")
    assert report.verdict == "underpowered" and report.exit_code == 2, report.summary
    assert [c.verdict for c in report.checks] == [Verdict.PASS] * len(PRODUCTION_CHECKS[level]), report.summary


def test_cli_budget_10_exits_2_underpowered(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "specverify", "audit", "reference", "--budget", "10",
                                "--checks", "step-K1,bonus-position"], capture_output=True, text=True, cwd=tmp_path,
                               env=ENV, timeout=600)
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert "UNDERPOWERED (exit 2)" in completed.stdout
    assert "specverify: underpowered:" in completed.stderr  # said in the plan, before the checks run


# --------------------------------------------------------------------------------------------
# The first failure names the bug, with a minimal case
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bonus_report():
    return specverify.audit(BUGGY_BONUS, budget="quick", isolation="none")


def test_first_failure_runs_the_locating_checks_and_names_the_bonus(bonus_report):
    report = bonus_report
    assert report.settings.fail_fast and report.exit_code == 1 and report.stopped_early
    verdicts = {c.name: str(c.verdict) for c in report.checks}
    locating = [c.name for c in report.checks if c.locus is not None and c.locus.locating]
    assert locating and all(verdicts[name] != "skipped" for name in locating)
    assert "the bonus token (drawn when all k drafts are accepted) is wrong" in report.diagnosis.lower()
    assert "--no-fail-fast" in report.diagnosis
    text = report.explain()
    assert text.index("diagnosis:") < text.index("minimal failing case") < text.index("- exact-step")


def test_the_minimal_case_fails_on_the_function_and_passes_on_the_reference(bonus_report):
    case = bonus_report.case_search.case
    assert case is not None and case.z >= 6, bonus_report.case_search.note
    code = case.code()
    assert "import torch" in code and "manual_seed" in code and f"{list(case.draft_tokens)}" in code
    namespace: dict = {}
    exec(compile(code, "minimal_case.py", "exec"), namespace)
    test = next(v for k, v in namespace.items() if k.startswith("test_"))
    with pytest.raises(AssertionError):
        test()
    assert "_spec.loader.exec_module" in code  # the user's own file, imported as their tests would
    namespace["verify"] = load_target("reference")
    test()  # a correct rule passes it


def test_the_replay_runs_only_what_failed_at_the_same_shares(bonus_report):
    failed = ",".join(c.name for c in bonus_report.failed)
    command = bonus_report.replay_command
    assert f"--checks {failed}" in command
    alpha = float(command.split("--alpha ")[1].split()[0])
    replay = specverify.audit(BUGGY_BONUS, budget="quick", isolation="none", alpha=alpha, checks=failed.split(","))
    assert [(c.name, c.n, c.pvalue) for c in replay.checks] == [(c.name, c.n, c.pvalue) for c in bonus_report.failed]
    assert "--no-fail-fast" in bonus_report.full_command


def test_reports_carry_the_minimal_case(bonus_report):
    document = report_to_dict(bonus_report)
    assert document["minimal_case"]["test"] == bonus_report.minimal_case_code()
    assert "paste it into a test" in format_report(bonus_report)
    tree = junit_tree(bonus_report)
    verdict = next(case for case in tree.getroot().iter("testcase") if case.get("name") == "verdict")
    assert "manual_seed" in verdict.find("failure").text


def test_assert_lossless_under_pytest_shows_the_message_first(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # this checkout's specverify in the subprocess
    pytester.makepyfile(test_engine=f"""
        import specverify

        def test_gate():
            specverify.assert_lossless({BUGGY_BONUS!r}, budget="quick")
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark")
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "runner.py" not in output and "options = {" not in output  # the helper's frame is hidden
    assert "E       AssertionError:" in output and "LOSS DETECTED" in output
    assert "diagnosis: The bonus token" in output and "def test_" in output  # the minimal case
    assert "what it checks:" not in output and "SPECVERIFY_VERBOSE=1" in output  # the short message
    captured = [line for line in output.split("Captured stderr call")[-1].split("short test summary")[0].splitlines()
                if line.strip() and not line.startswith(("---", "==="))]  # the section's own rules
    # the plan (with the not-run line of the checks it leaves out: the example takes no num_draft_tokens=), an
    # ETA line re-planned when the function runs slower than planned, and the end: no per-check line
    assert len(captured) <= 7 and not any(line.startswith("[") for line in captured), captured


# --------------------------------------------------------------------------------------------
# What did not run, one error said once
# --------------------------------------------------------------------------------------------


def without_uniforms(target_probs, draft_probs, draft_tokens, generator):
    from specverify.core.rules import verify

    return verify(target_probs, draft_probs, draft_tokens, generator)


def test_checks_left_out_are_said_with_their_fix():
    stream = io.StringIO()
    report = specverify.audit(without_uniforms, budget="quick", isolation="none", progress=LineProgress(stream),
                              checks=["exact-step", "step-K1"])
    assert [o.names for o in report.plan.omitted] == [("exact-step",)]
    assert "not run: exact-step" in stream.getvalue() and "uniforms=None" in stream.getvalue()
    assert report.exit_code == 0 and "not run: exact-step" in report.summary
    assert report_to_dict(report)["not_run"][0]["names"] == ["exact-step"]
    skipped = [c for c in junit_tree(report).getroot().iter("testcase") if c.find("skipped") is not None]
    assert [c.get("name") for c in skipped] == ["exact-step"]


def test_undeclared_tree_schemes_are_said_with_their_fix():
    from specverify.core.tree_rules import verify_tree

    def deterministic_only(target_probs, draft_probs, tree_tokens, parents, generator):
        return verify_tree(target_probs, draft_probs, tree_tokens, parents, generator)

    deterministic_only.draft_schemes = ("deterministic",)
    battery = load_battery("tree")
    session = battery.open_session(deterministic_only, device="cpu", timeout_s=60, isolation="none")
    from specverify.auditing.omissions import omitted_checks

    omitted = omitted_checks(battery, session)
    names = {name for o in omitted for name in o.names}
    assert "exact-tree-step" in names and "tree-siblings-independent" in names
    assert not any("deterministic" in name for name in names)


def test_a_wrong_signature_is_one_error_with_the_expected_signature():
    def verify(target_probs, draft_tokens, generator):
        return draft_tokens

    report = specverify.audit(verify, budget="quick", isolation="none")
    assert report.exit_code == 2 and report.checks == ()
    assert SPEC_SIGNATURES["sampler"] in report.summary
    assert "verify(target_probs, draft_tokens, generator)" in report.summary
    text = format_report(report)
    assert text.count("cannot take the sampler level's call") == 1


def test_the_same_error_in_every_check_is_one_finding():
    def verify(target_probs, draft_probs, draft_tokens, generator):
        raise TypeError("unsupported dtype")

    report = specverify.audit(verify, budget="quick", isolation="none", checks=["step-K1", "batch-size-1",
                                                                               "decoding-loop-order1"])
    text = format_report(report)
    assert text.count("unsupported dtype") == 1 and "(no table:" in text
    assert SPEC_SIGNATURES["sampler"] in report.summary  # a TypeError: the call is shown


def test_spec_signatures_are_docs_spec_md():
    spec = (ROOT / "docs" / "spec.md").read_text(encoding="utf-8")
    for signature in SPEC_SIGNATURES.values():
        assert f"def {signature}:" in spec


# --------------------------------------------------------------------------------------------
# CI formats and the command line
# --------------------------------------------------------------------------------------------


def test_junit_has_one_case_per_check_and_a_verdict(tmp_path):
    report = specverify.audit("reference", budget=10, checks=["step-K1", "inputs-unchanged"], isolation="none")
    root = junit_tree(report).getroot()
    cases = [c.get("name") for c in root.iter("testcase")]
    assert cases == ["step-K1", "inputs-unchanged", "verdict"]
    assert root.find("testsuite").get("errors") == "1"  # underpowered is an error of the verdict
    path = tmp_path / "out.xml"
    from specverify.auditing.reports.junit_xml import write_junit

    ElementTree.parse(write_junit(report, path))


def test_github_annotations_escape_and_point_at_the_file(bonus_report):
    lines = workflow_commands(bonus_report)
    assert any(line.startswith("::error file=") and "buggy_bonus.py" in line for line in lines)
    assert all("\n" not in line for line in lines)


def test_cli_flag_typo_gets_the_subcommands_usage_and_a_suggestion():
    completed = subprocess.run([sys.executable, "-m", "specverify", "audit", "reference", "--budgt", "quick"],
                               capture_output=True, text=True, env=ENV, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.startswith("usage: specverify audit")
    assert "did you mean --budget" in completed.stderr


def test_a_pipe_gets_the_table_once(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "specverify", "audit", "reference", "--budget", "quick",
                                "--checks", "step-K1,inputs-unchanged", "--isolation", "none"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=tmp_path,
                               timeout=600)
    assert completed.returncode == 0, completed.stdout
    assert completed.stdout.count("step-K1") == 1 or completed.stdout.count("[ 1/2] step-K1") == 1
    assert "check  " not in completed.stdout and "the results table is the per-check lines above" in completed.stdout


def test_properties_command_runs_the_packaged_suite(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "specverify", "properties", "catalog:bonus-from-draft", "--",
                                "-k", "test_same_generator_seed_reproduces or "
                                "test_identical_draft_accepts_everything_sampled",
                                "-q"], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=900)
    assert "--pyargs specverify.properties" in completed.stderr and "-m uses_impl and not slow" in completed.stderr
    assert "specverify properties: estimate: " in completed.stderr
    assert completed.returncode == 0 and " passed" in completed.stdout, \
        completed.stdout[-2000:] + completed.stderr[-2000:]
