"""The ``specverify`` command line: exit statuses 0/1/2, messages, report files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specverify.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "specverify", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=environment)


# --------------------------------------------------------------------------------------------
# One subprocess per exit status (python -m specverify)
# --------------------------------------------------------------------------------------------


@pytest.mark.statistical
def test_exit_0_for_a_lossless_sampler():
    result = run_cli("audit", "examples/vectorized_verify.py:verify", "--budget", "1000",
                     "--checks", "step-K2,decoding-loop-order1,inputs-unchanged")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "NO LOSS DETECTED (exit 0): no loss detected at α = 0.001" in result.stdout
    assert "with power 0.99 against TV ≥" in result.stdout


@pytest.mark.statistical
def test_exit_1_for_a_lossy_sampler():
    result = run_cli("audit", "examples/buggy_bonus.py:verify", "--budget", "quick", "--checks", "bonus-position")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "LOSS DETECTED (exit 1)" in result.stdout and "bonus-position [fail]" in result.stdout


def test_exit_2_for_a_function_that_raises():
    result = run_cli("audit", "examples/faulty.py:raises", "--budget", "quick", "--quiet")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout.startswith("COULD NOT AUDIT (exit 2)") and "RuntimeError" in result.stdout
    assert result.stderr == ""


# --------------------------------------------------------------------------------------------
# In-process
# --------------------------------------------------------------------------------------------


def test_missing_target_is_exit_2_with_the_reason(capsys):
    assert main(["audit", "does/not/exist.py:verify", "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().out


def test_bad_options_are_exit_2_with_the_reason(capsys):
    assert main(["audit", "reference", "--budget", "lots"]) == 2
    assert "budget" in capsys.readouterr().err
    assert main(["audit", "reference", "--seed", "abc"]) == 2
    assert "seed" in capsys.readouterr().err
    assert main(["audit", "reference", "--checks", "nope"]) == 2
    assert "unknown check" in capsys.readouterr().err


@pytest.mark.statistical
def test_json_and_html_reports_are_written(tmp_path, capsys):
    json_path, html_path = tmp_path / "audit.json", tmp_path / "audit.html"
    status = main(["audit", f"{EXAMPLES / 'buggy_bonus.py'}:verify", "--budget", "2000", "--checks",
                   "bonus-position,step-K1", "--json", str(json_path), "--html", str(html_path), "--seed", "3"])
    assert status == 1
    document = json.loads(json_path.read_text(encoding="utf-8"))
    assert document["schema"] == "specverify.audit/1" and document["seed"] == 3 and document["exit_code"] == 1
    assert "data:image/png;base64," in html_path.read_text(encoding="utf-8")
    assert "wrote JSON report" in capsys.readouterr().err


def test_random_seed_is_printed_for_replay(capsys):
    main(["audit", "does/not/exist.py:verify", "--seed", "random"])
    assert "random seed" in capsys.readouterr().err


def test_progress_bar_only_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    main(["audit", f"{EXAMPLES / 'faulty.py'}:raises", "--checks", "step-K1"])
    assert "[" in capsys.readouterr().err


def test_audit_subcommand_options():
    args = build_parser().parse_args(["audit", "reference"])
    assert (args.level, args.budget, args.alpha, args.seed, args.device, args.timeout, args.quiet) == (
        "sampler", None, 1e-3, "0", "cpu", 60.0, False)  # None: $SPECVERIFY_BUDGET or standard
    with pytest.raises(SystemExit):
        build_parser().parse_args(["audit", "reference", "--level", "kernel"])
