"""The pytest plugin's audit fixtures: one line in an engine's own test suite."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.statistical
def test_assert_lossless_fixture_passes_and_fails_with_an_explanation(pytester, monkeypatch):
    """Under `-vv` the failure has every finding in detail (the plugin sets SPECVERIFY_VERBOSE;
    monkeypatch restores it after this in-process run)."""
    monkeypatch.setenv("SPECVERIFY_VERBOSE", "0")
    pytester.makepyfile(test_engine=f"""
        from specverify.auditing.loading import load_target

        CHECKS = ["bonus-position", "step-K1"]

        def test_good(assert_lossless):
            report = assert_lossless(load_target({str(EXAMPLES / 'vectorized_verify.py') + ':verify'!r}), checks=CHECKS)
            assert report.settings.seed == 5 and report.settings.alpha == 0.01 and report.settings.budget.name == "2000"

        def test_bad(assert_lossless):
            assert_lossless({str(EXAMPLES / 'buggy_bonus.py') + ':verify'!r}, checks=CHECKS)

        def test_report_of_impl(lossless_audit):
            report = lossless_audit(checks=CHECKS)
            assert report.settings.target == "reference" and report.exit_code == 0
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:benchmark", "--specverify-seed", "5",
                                          "--specverify-alpha", "0.01", "--specverify-budget", "2000", "-vv")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*LOSS DETECTED*bonus-position*", "*what it checks*", "*p-value*"])


def test_impl_option_has_the_plugin_prefix_only(pytester):
    pytester.makepyfile(test_impl="""
        def test_impl(specverify_impl, pytestconfig):
            assert pytestconfig.getoption("specverify_impl") == "point-mass"
            assert specverify_impl.__name__ == "point_mass_as_verify"
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:benchmark", "--specverify-impl",
                                          "point-mass")
    result.assert_outcomes(passed=1)
    unprefixed = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:benchmark", "--impl", "point-mass")
    assert unprefixed.ret == pytest.ExitCode.USAGE_ERROR


def test_markers_are_registered_by_the_plugin(pytester):
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--markers")
    result.stdout.fnmatch_lines(["*@pytest.mark.gpu*", "*@pytest.mark.slow*", "*@pytest.mark.statistical*"])


@pytest.mark.parametrize("markexpr, only_gpu", [
    ("gpu", True), ("gpu and not slow", True), ("(gpu or gpu) and statistical", True), ("gpu and slow", True),
    ("not slow and not server and not engines", False), ("gpu or slow", False), ("not gpu", False),
    ("", False), ("slow", False), ("not (not gpu)", True), ("gpu or not slow", False),
])
def test_selects_only_gpu_reads_the_mark_expression(markexpr, only_gpu):
    from specverify.testing.pytest_plugin import selects_only_gpu

    assert selects_only_gpu(markexpr) is only_gpu


@pytest.mark.slow  # ~30 s on 2 shared cores: the conftests' imports
def test_a_gpu_only_run_without_cuda_skips_at_collection():
    """`pytest -m gpu` without CUDA: every test module skips unimported and the run exits 0 (it once
    collected the whole suite, 2,461 tests, to skip them: 62.6 s here; the module skips take < 1 s
    of the run, the rest is the conftests' imports of torch, hypothesis and scipy)."""
    import os
    import subprocess
    import sys
    import time

    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the gpu tests are collected and run")
    root = Path(__file__).resolve().parents[2]
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "gpu"],
                               capture_output=True, text=True, cwd=root, timeout=600,
                               env={**os.environ, "PYTHONPATH": str(root)})
    wall = time.perf_counter() - started
    summary = completed.stdout.strip().splitlines()[-1]
    print(f"pytest -m gpu without CUDA: {wall:.1f} s wall; {summary}")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert " skipped in " in summary and "passed" not in summary and "deselected" not in summary, summary
    assert "selects only gpu tests" in completed.stdout
