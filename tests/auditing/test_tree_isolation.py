"""The audit survives what it runs, at the tree level: a SPEC §3 function runs in a worker process, so its exit calls,
signals and hangs become exit 2 with the reason, and its output aliasing is a contract violation.
The hostile implementations live under tests/auditing/hostile/tree_*.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specverify.auditing.defaults import EXIT_ERROR, EXIT_FAIL, EXIT_PASS
from specverify.auditing.runner import audit
from specverify.core import tree_rules

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = Path(__file__).resolve().parent / "hostile"
FIRST = "randomness-source,tree-siblings-independent"


def cli(name: str, *options: str, timeout: float = 240) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "specverify", "audit", "--level", "tree", f"{HOSTILE / name}.py:verify_tree",
               "--budget", "quick", *options]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment, timeout=timeout)


@pytest.mark.parametrize("name, fragment", [
    ("tree_os_exit", "the function ended the process"),
    ("tree_segfault", "killed by signal SIGSEGV"),
])
def test_an_abnormal_end_of_a_tree_function_could_not_be_audited(name, fragment):
    result = cli(name, "--checks", FIRST)
    assert result.returncode == EXIT_ERROR, result.stdout + result.stderr
    assert fragment in result.stdout and "Traceback" not in result.stdout + result.stderr


def test_a_tree_function_hanging_with_sigalrm_disabled_is_killed_at_the_deadline():
    started = time.perf_counter()
    result = cli("tree_alarm_hang", "--timeout", "2", "--checks", FIRST)
    assert result.returncode == EXIT_ERROR, result.stdout + result.stderr
    assert "did not return within the per-call timeout of 2 s" in result.stdout
    assert time.perf_counter() - started < 90


def test_a_tree_function_returning_an_aliased_buffer_violates_the_contract():
    report = audit(f"{HOSTILE / 'tree_aliased_output'}.py:verify_tree", level="tree", budget="quick",
                   checks=["tree-siblings-independent", "outputs-unaliased"])
    assert report.isolation["mode"] == "process"
    assert report.exit_code == EXIT_FAIL and report.verdict == "contract violated", report.explain()
    assert "output aliasing" in report.checks[-1].message


@pytest.mark.parametrize("isolation", ["process", "none"])
def test_the_reference_passes_in_a_worker_and_in_process(isolation):
    report = audit("reference", level="tree", budget="quick", isolation=isolation,
                   checks=["randomness-source", "exact-tree-step", "tree-siblings-independent", "inputs-unchanged"])
    assert report.exit_code == EXIT_PASS, report.explain()
    assert report.isolation["mode"] == isolation
    assert [c.name for c in report.checks] == ["randomness-source", "exact-tree-step", "tree-siblings-independent",
                                               "inputs-unchanged"]


def test_the_declared_schemes_are_read_in_the_worker():
    report = audit("point-mass", level="tree", budget=2000, checks=None)
    assert report.isolation["mode"] == "process"
    assert getattr(tree_rules.point_mass_verify_tree, "draft_schemes", None) is not None
    assert all("independent" not in c.name and "without_replacement" not in c.name for c in report.checks)
