"""The audit survives what it runs.  One test per hostile behaviour: a hostile or buggy
implementation under tests/auditing/hostile/, audited through the CLI (or the API), and the exit
status and message the audit owes the user for it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from specverify.auditing.defaults import EXIT_ERROR, EXIT_FAIL, EXIT_PASS
from specverify.auditing.isolation.guarded import AliasWatch
from specverify.auditing.loading import load_target
from specverify.auditing.runner import audit

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = Path(__file__).resolve().parent / "hostile"
FEW = "randomness-source,step-K1"


def cli(name: str, *options: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "specverify", "audit", f"{HOSTILE / name}.py:verify", "--budget", "quick",
               *options]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd or ROOT, env=environment, timeout=timeout)


@pytest.mark.parametrize("name, fragment", [
    ("os_exit", "the function ended the process"),
    ("segfault", "killed by signal SIGSEGV"),
    ("killed", "killed by signal SIGKILL"),
    ("meta_tensor", "returned a meta tensor"),
    ("keyboard_interrupt", "raised KeyboardInterrupt"),
    ("sparse_output", "sparse_coo layout"),
])
def test_an_abnormal_end_or_unreadable_output_could_not_be_audited(name, fragment):
    result = cli(name, "--checks", "step-K1")
    assert result.returncode == EXIT_ERROR, result.stdout + result.stderr
    assert fragment in result.stdout and "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("name, check", [
    ("lossy_single_row", "batch-size-1"),
    ("lossy_small_batches", "small-batches"),
    ("drift_calls", "late-calls"),
    ("drift_rows", "late-calls"),
    ("emits_zero_probability", "truncated-vocabulary"),
])
def test_a_loss_confined_to_one_call_pattern_is_detected_at_quick(name, check):
    report = audit(f"{HOSTILE / name}.py:verify", budget="quick", checks=[check])
    assert report.exit_code == EXIT_FAIL and report.verdict == "loss detected", report.explain()
    assert report.isolation["mode"] == "process"
    message = report.checks[0].message
    if check == "late-calls":
        assert "of the function's life" in message and "are not covered" in message
    if check == "truncated-vocabulary":
        assert "target probability 0" in message


def test_a_non_daemon_thread_does_not_keep_the_audit_alive():
    started = time.perf_counter()
    result = cli("non_daemon_thread", "--checks", FEW, timeout=120)
    assert result.returncode == EXIT_PASS, result.stdout + result.stderr
    assert time.perf_counter() - started < 120


def test_a_hang_with_sigalrm_disabled_is_killed_at_the_deadline():
    started = time.perf_counter()
    result = cli("alarm_hang", "--timeout", "2", "--checks", "randomness-source,step-K1,step-K2")
    assert result.returncode == EXIT_ERROR, result.stdout + result.stderr
    assert "did not return within the per-call timeout of 2 s" in result.stdout
    assert re.search(r"^step-K2 +skipped", result.stdout, re.MULTILINE)  # not called after two hangs
    assert time.perf_counter() - started < 90


def test_the_function_runs_in_a_scratch_directory(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    result = cli("deletes_file", "--checks", FEW, cwd=tmp_path)
    assert result.returncode == EXIT_PASS, result.stdout + result.stderr
    assert victim.read_text() == "keep me"


def test_output_of_the_function_is_captured_and_its_first_lines_shown():
    result = cli("prints_100mb", "--checks", FEW)
    assert result.returncode == EXIT_PASS, result.stderr
    assert len(result.stdout) + len(result.stderr) < 100_000
    assert "the function's stdout (104,857,624 bytes, truncated; first lines)" in result.stdout
    assert "| hello from the function" in result.stdout


def test_an_aliased_output_is_diagnosed_as_aliasing_not_as_generator_misuse():
    result = cli("aliased_output", "--checks", "randomness-source,step-K1,outputs-unaliased")
    assert result.returncode == EXIT_FAIL, result.stdout + result.stderr
    assert "output aliasing" in result.stdout and "reseeds" not in result.stdout
    assert "CONTRACT VIOLATED" in result.stdout


@pytest.mark.parametrize("option, path", [("--json", "/nonexistent-directory/report.json"), ("--html", "/")])
def test_an_unwritable_report_path_is_refused_before_the_run(option, path):
    result = cli("os_exit", option, path)
    assert result.returncode == EXIT_ERROR and "cannot write the report" in result.stderr
    # Refused before the run: an audit that ran would have printed its report (and the
    # os_exit target would have ended in "the function's process exited").
    assert "Traceback" not in result.stderr and result.stdout == "" and "exited" not in result.stderr


def test_a_slow_but_correct_function_gets_a_verdict():
    # 0.25 ms per row: a 4096-row call takes ~1 s, past the 1 s floor, but not 20x its measured speed.
    result = cli("slow_per_row", "--timeout", "1", "--checks", FEW)
    assert result.returncode == EXIT_PASS, result.stdout + result.stderr


@pytest.mark.parametrize("isolation", ["process", "none"])
def test_the_callers_torch_and_numpy_state_is_untouched(isolation):
    dtype, threads, errors = torch.get_default_dtype(), torch.get_num_threads(), np.geterr()
    fn = load_target(f"{HOSTILE / 'changes_global_state.py'}:verify")
    report = audit(fn, budget=500, checks=["randomness-source", "step-K1"], isolation=isolation)
    assert report.exit_code == EXIT_PASS, report.summary
    assert (torch.get_default_dtype(), torch.get_num_threads(), np.geterr()) == (dtype, threads, errors)
    assert report.isolation["mode"] == isolation


def test_a_closure_falls_back_to_in_process_calls_with_a_note():
    from specverify.core.rules import verify as reference

    report = audit(lambda *args: reference(*args), budget=500, checks=["step-K1"])
    assert report.exit_code == EXIT_PASS and report.isolation["mode"] == "none"
    assert "cannot be pickled" in report.isolation["note"]


def _default_sigint() -> None:
    """In the audit's child process: SIGINT at its default disposition, unblocked, as in a shell.
    A pytest-xdist worker can be left with SIGINT ignored by an earlier test's code (seen in full
    runs: ``signal.getsignal(SIGINT)`` was ``SIG_IGN`` after some long audits), and a child
    inherits an ignored signal, so without this the Ctrl-C below would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_a_users_ctrl_c_stops_at_once_with_a_partial_report(tmp_path):
    marker = tmp_path / "called"
    environment = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                       SPECVERIFY_TEST_MARKER=str(marker))
    command = [sys.executable, "-m", "specverify", "audit", f"{HOSTILE / 'slow_with_marker.py'}:verify", "--budget",
               "quick"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               env=environment, preexec_fn=_default_sigint)
    deadline = time.perf_counter() + 180
    while not marker.exists() and time.perf_counter() < deadline and process.poll() is None:
        time.sleep(0.2)
    time.sleep(1)  # inside the checks, the function running in its worker
    process.send_signal(signal.SIGINT)
    interrupted = time.perf_counter()
    stdout, stderr = process.communicate(timeout=60)
    assert time.perf_counter() - interrupted < 30
    assert process.returncode == EXIT_ERROR, stdout + stderr
    assert "interrupted by the user (Ctrl-C) after" in stdout and "Traceback" not in stderr
    assert "randomness-source" in stdout  # the partial report's table


def test_an_internal_error_of_the_audit_is_exit_2_not_1(monkeypatch, capsys):
    import specverify.auditing.runner as runner
    import specverify.cli.audit as command
    from specverify.cli import build_parser

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the audit")

    monkeypatch.setattr(runner, "audit", broken)  # the command imports it when it runs
    assert command.run(build_parser().parse_args(["audit", "reference"])) == EXIT_ERROR
    assert "internal error of the audit: RuntimeError: a bug in the audit" in capsys.readouterr().err


def test_the_decoder_level_runs_in_a_worker_that_builds_its_own_models():
    from specverify.auditing.decoder.battery import DecoderModels

    report = audit(f"{HOSTILE / 'decoder_trains_target.py'}:generate", level="decoder", budget=20,
                   checks=["greedy-identity", "models-unchanged"])
    assert report.isolation["mode"] == "process"
    verdicts = {c.name: c.verdict for c in report.checks}
    assert verdicts["models-unchanged"] == "fail" and report.exit_code == EXIT_FAIL, report.explain()
    assert "modified the models' parameters" in report.checks[-1].message
    assert not DecoderModels().changed()  # the audit's own models were never handed to the function


def test_the_alias_watch_keeps_a_lent_copy_only_until_told_its_lender_changes():
    """The worker lends the alias watch its copy of a plain output (the output region): a result
    kept unchanged is not aliasing even after the region is rewritten, once the copy is owned; a
    result overwritten by the next call is, across requests too."""
    watch = AliasWatch()
    region = torch.zeros(2, 3, dtype=torch.int64)
    fresh = torch.tensor([[1, 2, 3]])
    region[:1].copy_(fresh)
    assert not watch.after_call(fresh, region[:1])
    watch.own_copy()
    region.fill_(7)  # the next request's outputs
    assert not watch.after_call(torch.tensor([[4, 5, 6]]))
    buffer = torch.tensor([[1, 1, 1]])
    region[:1].copy_(buffer)
    watch.after_call(buffer, region[:1])
    watch.own_copy()
    buffer.fill_(9)  # the function reuses its buffer for the next call
    assert watch.after_call(buffer)
