"""The pytest plugin's audit fixtures: one line in an engine's own test suite."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.statistical
def test_assert_lossless_fixture_passes_and_fails_with_an_explanation(pytester):
    pytester.makepyfile(test_engine=f"""
        from specverify.auditing.loading import load_target

        CHECKS = ["bonus-position", "step-K1"]

        def test_good(assert_lossless):
            report = assert_lossless(load_target({str(EXAMPLES / 'vectorized_verify.py') + ':verify'!r}), checks=CHECKS)
            assert report.seed == 5 and report.alpha == 0.01 and report.budget.name == "2000"

        def test_bad(assert_lossless):
            assert_lossless({str(EXAMPLES / 'buggy_bonus.py') + ':verify'!r}, checks=CHECKS)

        def test_report_of_impl(lossless_audit):
            report = lossless_audit(checks=CHECKS)
            assert report.target == "reference" and report.exit_code == 0
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:benchmark", "--specverify-seed", "5",
                                          "--specverify-alpha", "0.01", "--specverify-budget", "2000")
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
