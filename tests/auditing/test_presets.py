"""Presets: a named budget plus the checks it runs, picked by name in Python, the CLI and the pytest
plugin; each states the TV it detects like a budget and names what it leaves out."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import specverify
from specverify.auditing.checks import resolve_budget
from specverify.auditing.presets import PRESETS, resolve_preset
from specverify.auditing.runner import audit
from specverify.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

TREE_CHECKS = [
    "randomness-source",
    "exact-tree-step",
    "tree-siblings-independent",
    "tree-acceptance-independent",
    "tree-siblings-deterministic",
    "tree-acceptance-deterministic",
    "tree-loop-deterministic",
    "tree-large-vocabulary",
    "inputs-unchanged",
    "outputs-unaliased",
]


@pytest.mark.slow
@pytest.mark.statistical
def test_pre_commit_runs_its_checks_at_quick_and_states_the_tv_it_detects():
    report = audit("reference", preset="pre-commit", isolation="none")
    assert report.exit_code == 0, report.explain()
    assert report.settings.preset == "pre-commit" and report.settings.budget == resolve_budget("quick")
    assert [c.name for c in report.checks] == [
        "randomness-source",
        "exact-step",
        "step-K2",
        "bonus-position",
        "correction-position",
        "exact-ragged-drafts",
        "inputs-unchanged",
        "outputs-unaliased",
    ]
    statistical = [c for c in report.checks if c.n]
    assert statistical and all(c.detectable_tv <= 0.05 + 1e-9 for c in statistical)  # the budget's claim
    assert report.detectable_tv == pytest.approx(0.05, abs=1e-4)
    note = report.settings.preset_note
    assert "left out: exact-large-vocabulary, step-K1" in note and "production-K32" in note
    assert "; 8 checks; " in note
    assert report.settings.fail_fast


@pytest.mark.statistical
def test_pre_commit_catches_a_wrong_bonus_token_and_its_replay_is_the_chosen_budget_and_checks(capsys):
    with pytest.raises(AssertionError) as raised:
        specverify.assert_lossless(
            f"{EXAMPLES / 'buggy_bonus.py'}:verify", preset="pre-commit", isolation="none", progress=None
        )
    message = str(raised.value)
    assert "LOSS DETECTED" in message and "(preset pre-commit, seed 0, budget quick" in message
    replay = message.split("replay with `", 1)[1].split("`", 1)[0]
    assert "--budget quick" in replay and "--checks" in replay
    assert "--preset" not in replay and build_parser().parse_args(shlex.split(replay)[1:]).preset is None
    assert "; 7 checks; " in message  # exact-ragged-drafts needs num_draft_tokens=, said in its own note


def test_a_preset_excludes_budget_and_checks_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match=r"^budget: preset 'pre-commit' sets the budget"):
        audit("reference", preset="pre-commit", budget="quick")
    with pytest.raises(ValueError, match=r"^checks: preset 'nightly' sets the checks"):
        audit("reference", preset="nightly", checks=["step-K1"])
    with pytest.raises(ValueError, match="preset: expected one of pre-commit, nightly"):
        resolve_preset("weekly")
    assert build_parser().parse_args(["audit", "reference", "--preset", "nightly"]).preset == "nightly"


def test_every_preset_is_sized_by_a_named_budget_within_the_ceiling():
    from specverify.auditing.defaults import POWER_CEILING_TV

    for preset in PRESETS.values():
        budget = resolve_budget(preset.budget)
        assert budget.epsilon is not None and budget.epsilon <= min(POWER_CEILING_TV.values()), preset.name
        assert set(preset.checks) == set(POWER_CEILING_TV), preset.name  # says what it runs at every level
    nightly = PRESETS["nightly"]
    assert nightly.budget == "thorough" and nightly.fail_fast is False
    assert all(nightly.select(level, ["a", "b"]) is None for level in nightly.checks)


def test_pre_commit_selects_each_declared_schemes_tree_checks():
    chosen = PRESETS["pre-commit"].select("tree", TREE_CHECKS)
    assert chosen == [
        "randomness-source",
        "exact-tree-step",
        "tree-siblings-independent",
        "tree-acceptance-independent",
        "tree-siblings-deterministic",
        "tree-acceptance-deterministic",
        "inputs-unchanged",
        "outputs-unaliased",
    ]


def _pytest(tmp_path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path), *options],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.slow
def test_the_plugins_preset_reaches_the_fixtures(tmp_path):
    (tmp_path / "test_gate.py").write_text(
        "def test_gate(lossless_audit):\n"
        "    report = lossless_audit('missing.py:verify')  # could not audit: the settings, nothing run\n"
        "    settings = report.settings\n"
        "    assert settings.preset == 'pre-commit' and settings.budget.name == 'quick', report.explain()\n"
        "    own = lossless_audit('missing.py:verify', budget='standard').settings\n"
        "    assert own.preset is None and own.budget.name == 'standard'  # a test's own budget= replaces it\n"
    )
    completed = _pytest(tmp_path, "--specverify-preset", "pre-commit")
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_the_plugin_refuses_a_preset_with_a_budget_at_start_up(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    both = _pytest(tmp_path, "--specverify-preset", "pre-commit", "--specverify-budget", "quick")
    assert both.returncode == 4 and "--specverify-preset" in both.stdout + both.stderr
    unknown = _pytest(tmp_path, "--specverify-preset", "weekly")
    assert unknown.returncode == 4 and "expected one of pre-commit, nightly" in unknown.stdout + unknown.stderr
