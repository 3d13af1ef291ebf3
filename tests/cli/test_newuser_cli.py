"""CLI details for a new user: --list, fast trivial commands (no torch import), plain models --help,
the plugin's budget reaching the fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specverify.auditing.sampler.catalog import CATALOG
from specverify.cli import main
from specverify.cli.listing import PRODUCTION_EXACT_TV, RAGGED_EXACT_TV, STORED_EXACT_TV, catalog_entries, exact_tv

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_audit_list_shows_builtins_and_every_catalog_entry_with_its_exact_tv(capsys):
    assert main(["audit", "--list"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "hf-transformers-prompt-lookup" in out
    for name, entry in CATALOG.items():
        line = next(line for line in out.splitlines() if line.strip().startswith(name.replace("_", "-") + " "))
        assert entry.bug_class in line
        if entry.ragged_only:
            tv = RAGGED_EXACT_TV[name]
            assert (f"{tv:.4f}‡" if tv is not None else "—‡") in line
        elif entry.production_shaped:
            tv = PRODUCTION_EXACT_TV[name]
            assert (f"{tv:.4f}*" if tv is not None else "—†") in line
        else:
            tv = STORED_EXACT_TV[name]
            assert (f"{tv:.4f}" if tv is not None else "—") in line


def test_audit_list_reads_the_catalog_source_as_imported_and_prints_whole_descriptions(capsys):
    assert catalog_entries() == [(e.name, e.bug_class, e.description) for e in CATALOG.values()]
    assert main(["audit", "--list"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    words = " ".join(out.split())
    for entry in CATALOG.values():
        assert " ".join(entry.description.split()) in words, entry.name


def test_audit_list_is_instant():
    """Goal: under a second (no torch import); the bound is generous for a shared CI machine."""
    probe = ("import sys, time, runpy; started = time.perf_counter(); sys.argv = ['specverify', 'audit', '--list']\n"
             "try:\n    runpy.run_module('specverify', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print(f'{time.perf_counter() - started:.3f}', 'torch' in sys.modules, file=sys.stderr)")
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=ENV, timeout=120)
    wall = time.perf_counter() - started
    inside, torch_imported = completed.stderr.split()[-2:]
    print(f"specverify audit --list: {wall:.2f} s with the interpreter's start, {inside} s inside")
    assert completed.returncode == 0 and torch_imported == "False", completed.stderr
    assert float(inside) < 5.0


@pytest.mark.parametrize("name", ["residual_is_target", "bonus_from_draft", "batch_rows_rolled",
                                  pytest.param("all", marks=pytest.mark.slow)])
def test_stored_exact_tvs_are_the_integrated_ones(name):
    names = list(STORED_EXACT_TV) if name == "all" else [name]
    for entry in names:
        computed = exact_tv(entry)
        stored = STORED_EXACT_TV[entry]
        assert (computed is None and stored is None) or abs(computed - stored) < 1e-6, entry


def test_audit_without_target_asks_for_one(capsys):
    assert main(["audit"]) == 2
    assert "--list" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["speedup", "--alpha", "0.8", "--max-gamma", "4", "--draft-cost", "0.05"],
                                     ["models", "list"], ["--help"], ["audit", "--list"]])
def test_trivial_commands_do_not_import_torch(command):
    probe = ("import sys, runpy; sys.argv = ['specverify'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('specverify', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)")
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True, env=ENV,
                               timeout=120)
    print(f"{' '.join(command)}: {time.perf_counter() - started:.2f} s")
    assert completed.stderr.strip().endswith("NO-TORCH"), completed.stderr


def test_models_help_has_no_rest_markup():
    completed = subprocess.run([sys.executable, "-m", "specverify", "models", "--help"], capture_output=True,
                               text=True, env=ENV, timeout=120)
    assert completed.returncode == 0
    assert "``" not in completed.stdout and ":func:" not in completed.stdout
    assert "specverify models list" in completed.stdout


def test_plugin_budget_reaches_the_fixtures_not_the_environment(tmp_path):
    (tmp_path / "test_direct.py").write_text(
        "import os\n\n"
        "def test_direct(assert_lossless):\n"
        "    report = assert_lossless('reference', checks=['step-K1'], allow_underpowered=True)\n"
        "    assert report.settings.budget.samples == 123\n"
        "    assert 'SPECVERIFY_BUDGET' not in os.environ\n")
    completed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "--specverify-budget", "123", str(tmp_path / "test_direct.py")],
                               capture_output=True, text=True, cwd=tmp_path, timeout=300,
                               env={name: value for name, value in ENV.items() if name != "SPECVERIFY_BUDGET"})
    assert completed.returncode == 0, completed.stdout + completed.stderr
    bad = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--specverify-budget",
                          "huge", str(tmp_path / "test_direct.py")], capture_output=True, text=True, cwd=tmp_path,
                         env=ENV, timeout=300)
    assert bad.returncode == 4 and "--specverify-budget" in bad.stdout + bad.stderr
