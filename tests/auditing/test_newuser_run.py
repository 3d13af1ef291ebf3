"""A new user's first run: budget everywhere, the expected time up front, progress in
logs and on terminals, replay lines that run where the audit ran, findings said once."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import specverify
from specverify.auditing.audited import CallCounts
from specverify.auditing.checks import CheckKind, CheckResult, Verdict
from specverify.auditing.findings import grouped_findings
from specverify.auditing.loading import LoadError, load_target
from specverify.auditing.progress import BarProgress, LineProgress, expected_seconds, progress_for
from specverify.auditing.replay import target_name
from tests.auditing.display_checks import StepCheck, plan_of

ROOT = Path(__file__).resolve().parents[2]
FAST = dict(budget=200, checks=["step-K1", "bonus-position"], allow_underpowered=True)  # fast, not a full-power pass


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_budget_comes_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("SPECVERIFY_BUDGET", "150")
    report = specverify.audit("reference", checks=["step-K1"])
    assert report.settings.budget.samples == 150 and report.checks[0].n == 150
    assert specverify.audit("reference", checks=["step-K1"], budget=120).checks[0].n == 120  # the argument wins


def test_assert_lossless_takes_a_budget_and_prints_the_plan_first(capsys):
    """Inside a captured pytest test: the plan first, then no line per check (the failure message
    holds the results: no progress lines in captured output), the counts at the end."""
    specverify.assert_lossless("reference", **FAST)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0].startswith("specverify: auditing reference") and "expected ~" in lines[0]
    assert "2 checks, 400 samples" in lines[0]
    assert not any(line.startswith("[") for line in lines)
    assert lines[-1].startswith("specverify: audit finished") and "(2 pass)" in lines[-1]


def test_line_progress_streams_the_header_then_one_flushed_line_per_check():
    stream = io.StringIO()
    specverify.audit("reference", progress=LineProgress(stream), **FAST)
    # the re-timing line comes only when the first check outlasts progress.SETTLE_S: on a loaded machine
    lines = [line for line in stream.getvalue().splitlines() if not line.startswith("specverify: measured")]
    assert lines[1].startswith("specverify: underpowered: at budget 200")  # FAST is below the ceiling TV
    del lines[1]
    assert lines[0].startswith("specverify: auditing reference at level sampler")
    assert lines[1].startswith("[ 1/2] step-K1") and " s" in lines[1] and "p=" in lines[1]
    assert lines[2].startswith("[ 2/2] bonus-position")
    assert lines[3].startswith("specverify: audit finished")


def test_terminal_bar_moves_inside_a_check_with_the_rows_done():
    stream = Tty()
    bar = progress_for(stream)
    assert isinstance(bar, BarProgress)
    log = CallCounts()
    checks = [StepCheck("production-qwen-K1", 1, 151936)]
    plans = [plan_of(1000)]
    bar.begin(target="t", level="sampler", budget=specverify.auditing.checks.resolve_budget("quick"), alpha=1e-3,
              checks=checks, plans=plans, log=log)
    bar.check_started(0, checks[0], plans[0])
    first = bar.line()
    log.rows = 500
    second = bar.line()
    bar.end()
    assert "0/1" in first and "500 rows" in second and second.count("#") > first.count("#")


def _result(name: str, *, n: int, seconds: float, pvalue: float | None = None) -> CheckResult:
    return CheckResult(name, "", CheckKind.GOODNESS_OF_FIT, {}, Verdict.PASS, "", n=n, pvalue=pvalue, seconds=seconds)


def test_a_long_check_adds_a_still_running_line_per_heartbeat_to_a_log():
    """A piped log is never silent for longer than the heartbeat inside a long check (an endpoint
    PIT check runs ~45 min at standard), and a short check adds no line."""
    stream = io.StringIO()
    lines = LineProgress(stream, heartbeat_s=0.2)
    log = CallCounts()
    checks = [StepCheck("pit-T1-top8"), StepCheck("quick-one")]
    plans = [plan_of(1000), plan_of(10)]
    lines.begin(target="t", level="endpoint", budget=specverify.auditing.checks.resolve_budget("quick"), alpha=1e-3,
                checks=checks, plans=plans, log=log)
    lines.check_started(0, checks[0], plans[0])
    log.rows = 42
    time.sleep(0.9)
    beats = [line for line in stream.getvalue().splitlines() if "still running" in line]
    assert beats and all("pit-T1-top8 still running: 42 rows in" in line and "rows/s" in line for line in beats)
    assert len(beats) <= 5
    lines.check_finished(0, _result("pit-T1-top8", n=1000, seconds=0.9, pvalue=0.5))
    lines.check_started(1, checks[1], plans[1])
    lines.check_finished(1, _result("quick-one", n=1000, seconds=0.0, pvalue=0.5))
    lines.end()
    after = stream.getvalue().splitlines()[len(beats) + 2:]
    assert not any("still running" in line for line in after)
    assert after[-1].startswith("specverify: audit finished")


def test_endpoint_eta_comes_from_the_servers_measured_pace():
    """No cost model knows a server's speed: no ETA until a statistical check has finished, then
    its seconds per sample times the samples still planned."""
    stream = Tty()
    bar = BarProgress(stream, interval_s=3600)
    log = CallCounts()
    checks = [StepCheck(name) for name in ("greedy-identity", "pit-a", "pit-b")]
    plans = [plan_of(0), plan_of(100), plan_of(300)]
    bar.begin(target="t", level="endpoint", budget=specverify.auditing.checks.resolve_budget("quick"), alpha=1e-3,
              checks=checks, plans=plans, log=log)
    bar.check_started(0, checks[0], plans[0])
    bar.check_finished(0, _result("greedy-identity", n=0, seconds=40.0))
    bar.check_started(1, checks[1], plans[1])
    assert bar.eta() is None and "ETA        —" in bar.line()
    bar.check_finished(1, _result("pit-a", n=100, seconds=50.0))
    bar.check_started(2, checks[2], plans[2])
    eta = bar.eta()
    bar.end()
    assert 149.0 < eta <= 150.0  # 0.5 s per sample × 300 samples


def test_quiet_prints_nothing_and_pipes_get_lines():
    assert progress_for(io.StringIO(), quiet=True) is None
    assert isinstance(progress_for(io.StringIO()), LineProgress)


def test_expected_time_model_is_within_a_factor_of_the_measured_time():
    """The cost model (reference rule) against a measured quick audit of two checks; the machine is
    shared, so only the order of magnitude is asserted; the measured figures are printed."""
    report = specverify.audit("reference", budget="quick", checks=["step-K4", "decoding-loop-order1"])
    from specverify.auditing.runner import load_battery

    battery = load_battery("sampler")
    session = battery.open_session(specverify.auditing.loading.load_target("reference"), device="cpu", timeout_s=60)
    checks = [c for c in battery.checks(session) if c.name in ("step-K4", "decoding-loop-order1")]
    plans = [plan_of(r.n) for r in report.checks]
    expected = expected_seconds(checks, plans)
    # The checks' own time: the worker's start (a process spawn and a torch import, ~1-2 s) is a
    # fixed cost outside the model.
    measured = sum(report.timings["checks_s"].values())
    print(f"expected {expected:.1f} s, measured {measured:.1f} s (total with the worker's start "
          f"{report.timings['total_s']:.1f} s)")
    assert expected / 10 < measured < expected * 10


def test_cli_pipes_the_header_first_and_a_line_per_check(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "specverify", "audit", "reference", "--budget", "100", "--checks", "step-K1,step-K2",
         "--allow-underpowered"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert completed.returncode == 0, completed.stderr
    err = [line for line in completed.stderr.splitlines()
           if not line.startswith(("specverify: underpowered", "specverify: measured"))]
    assert err[0].startswith("specverify: auditing reference") and "expected ~" in err[0]
    assert err[1].startswith("[ 1/2] step-K1") and err[2].startswith("[ 2/2] step-K2")
    quiet = subprocess.run(
        [sys.executable, "-m", "specverify", "audit", "reference", "--budget", "100", "--checks", "step-K1", "--quiet",
         "--allow-underpowered"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert quiet.stderr == "" and quiet.stdout.startswith("NO LOSS DETECTED")


# --------------------------------------------------------------------------------------------
# Replay lines and loading
# --------------------------------------------------------------------------------------------

CLI_SCRIPT = """import sys
from specverify.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(autouse=True)
def forget_my_engine():
    """Each test imports its own ``my_engine`` from its own folder."""
    def forget():
        for name in [n for n in sys.modules if n == "my_engine" or n.startswith("my_engine.")]:
            del sys.modules[name]

    forget()
    yield
    forget()


def make_project(root: Path) -> None:
    """A project with ``my_engine/sampling.py`` (a lossy rule importing a helper module next to
    it) and ``kernels/rule.py`` (a file whose module imports its neighbour)."""
    (root / "my_engine").mkdir()
    (root / "my_engine" / "__init__.py").write_text("")
    (root / "my_engine" / "sampling.py").write_text(textwrap.dedent("""
        from specverify.auditing.sampler.catalog import CATALOG

        def verify_lossy(target_probs, draft_probs, draft_tokens, generator):
            return CATALOG["bonus_from_draft"].fn(target_probs, draft_probs, draft_tokens, generator)
    """))
    (root / "kernels").mkdir()
    (root / "kernels" / "neighbour.py").write_text("from specverify.core.rules import verify as VERIFY\n")
    (root / "kernels" / "rule.py").write_text(textwrap.dedent("""
        from neighbour import VERIFY

        def verify(target_probs, draft_probs, draft_tokens, generator):
            return VERIFY(target_probs, draft_probs, draft_tokens, generator)

        def helper():
            pass
    """))


def run_like_the_console_script(command: str, cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run a printed ``specverify audit ...`` line as the installed console script would: the
    current directory is not on sys.path (the script's own folder is)."""
    script = tmp_path / "bin" / "specverify_cli.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(CLI_SCRIPT)
    import shlex

    words = shlex.split(command)
    assert words[0] == "specverify"
    return subprocess.run([sys.executable, str(script), *words[1:]], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def test_printed_replay_line_runs_where_the_test_ran(tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    make_project(project)
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))  # what pytest's rootdir insertion does in the user's run
    from my_engine.sampling import verify_lossy

    assert target_name(verify_lossy) == "my_engine.sampling:verify_lossy"
    with pytest.raises(AssertionError) as failure:
        specverify.assert_lossless(verify_lossy, budget=300, checks=["bonus-position"], progress=None)
    replay = next(line for line in str(failure.value).splitlines() if "replay with" in line)
    command = replay.split("`")[1]
    assert command == "specverify audit my_engine.sampling:verify_lossy --seed 0 --budget 300 --checks bonus-position"
    completed = run_like_the_console_script(command, project, tmp_path)
    assert completed.returncode == 1, completed.stdout + completed.stderr  # loss detected, not "could not import"
    assert "bonus-position" in completed.stdout


def test_module_only_importable_through_an_inserted_folder_replays_by_file(tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    make_project(project)
    monkeypatch.chdir(tmp_path)  # the test ran from above the project: my_engine is not found from here
    monkeypatch.syspath_prepend(str(project))
    from my_engine.sampling import verify_lossy

    assert target_name(verify_lossy) == "project/my_engine/sampling.py:verify_lossy"
    assert load_target(target_name(verify_lossy)) is not None


def test_a_target_file_imports_modules_next_to_it(tmp_path):
    make_project(tmp_path)
    completed = run_like_the_console_script(
        f"specverify audit {tmp_path / 'kernels' / 'rule.py'}:verify --budget 100 --checks step-K1 "
        "--allow-underpowered",
        tmp_path, tmp_path)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_missing_function_lists_what_the_file_defines(tmp_path):
    make_project(tmp_path)
    with pytest.raises(LoadError) as error:
        load_target(f"{tmp_path / 'kernels' / 'rule.py'}:verfy")
    message = str(error.value)
    assert "did you mean 'verify'" in message and "helper, verify" in message
    assert "VERIFY" not in message  # imported, not defined by the file


def test_catalog_names_take_hyphens_or_underscores():
    assert load_target("catalog:residual-is-target") is load_target("catalog:residual_is_target")
    with pytest.raises(LoadError, match="--list"):
        load_target("catalog:no-such-bug")


# --------------------------------------------------------------------------------------------
# Findings once per audit
# --------------------------------------------------------------------------------------------


def test_a_contract_violation_is_reported_once_per_audit():
    import torch

    def wrong(target_probs, draft_probs, draft_tokens, generator):
        return torch.zeros(3)

    report = specverify.audit(wrong, budget=100, checks=["step-K1", "step-K2", "bonus-position"])
    findings = grouped_findings(report.checks)
    assert len(findings) == 1 and findings[0].names == ("step-K1",)  # the first malformed output ends the audit
    assert [c.verdict for c in report.checks[1:]] == ["skipped", "skipped"]
    text = report.explain()
    assert text.count("returned dtype torch.float32") == 1  # said once: the headline summary is the finding
    assert "returned shape (3,)" in findings[0].message  # every violation of the output at once
    from specverify.auditing.reports.terminal import format_report

    assert format_report(report).count("returned dtype torch.float32") == 1


def test_statistical_failures_are_not_merged():
    report = specverify.audit("catalog:bonus-from-draft", budget=2000, checks=["step-K1", "bonus-position"])
    assert [f.names for f in grouped_findings(report.checks)] == [("step-K1",), ("bonus-position",)]
