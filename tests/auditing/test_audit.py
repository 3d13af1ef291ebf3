"""The sampler-level audit: verdicts, budgets and power, the catalog of known bugs, assert_lossless."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specverify
from specverify.auditing.defaults import EXIT_ERROR, EXIT_FAIL, EXIT_PASS
from specverify.auditing.runner import assert_lossless, audit, plan_checks
from specverify.auditing.sampler.battery import POWER, SamplerBattery, resolve_budget
from specverify.auditing.sampler.catalog import CATALOG
from specverify.cli.listing import PRODUCTION_EXACT_TV
from specverify.core import stats
from specverify.core.rules import verify as reference

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VECTORIZED = f"{EXAMPLES / 'vectorized_verify.py'}:verify"
BUGGY_BONUS = f"{EXAMPLES / 'buggy_bonus.py'}:verify"


def battery_checks(fn=reference):
    battery = SamplerBattery()
    return battery.checks(battery.open_session(fn, device="cpu", timeout_s=10))


STATISTICAL_SMALL_VOCAB = [c.name for c in battery_checks() if c.statistical and not c.name.startswith("production-")]
CONTRACT = ["randomness-source", "inputs-unchanged"]


@pytest.fixture(scope="module")
def reference_quick():
    return audit("reference", budget="quick")


@pytest.mark.statistical
def test_reference_passes_at_quick(reference_quick):
    report = reference_quick
    assert report.exit_code == EXIT_PASS and report.verdict == "no loss detected", report.explain()
    assert all(c.verdict == "pass" for c in report.checks)
    exact_check = next(c for c in report.checks if c.name == "exact-step")
    assert exact_check.empirical_tv < 1e-9
    assert "α = 0.001" in report.summary and "power 0.99" in report.summary and "TV ≥ 0.05" in report.summary


def test_battery_covers_the_required_cases():
    checks = {c.name: c for c in battery_checks()}
    ks = {c.parameters["K"] for c in checks.values() if "K" in c.parameters}
    assert {1, 2, 4, 8} <= ks
    assert {"bonus-position", "correction-position", "disjoint-supports", "zeros-both-sides", "near-one-hot",
            "near-uniform", "tiny-masses", "acceptance-rate", "exact-step", "exact-large-vocabulary",
            "randomness-source", "inputs-unchanged"} <= set(checks)
    production = [c for c in checks.values() if c.name.startswith("production-")]
    vocabularies = {c.parameters["V"] for c in production}
    assert max(vocabularies) >= 150_000 and any(v > 65_536 for v in vocabularies)
    assert any(v % 128 for v in vocabularies if v >= 32_000)
    assert {12, 32} <= {c.parameters["K"] for c in production}
    assert max(c.parameters["B"] for c in production) == 1024
    loops = [c for c in checks.values() if c.name.startswith("decoding-loop")]
    assert loops and all(c.parameters["L"] >= 3 for c in loops)
    assert all(c.parameters["chains"] >= 2 for c in checks.values() if c.kind == "goodness-of-fit"
               and not c.name.startswith("production-"))


def test_functions_without_uniforms_get_no_exact_check():
    def no_uniforms(target_probs, draft_probs, draft_tokens, generator):
        return reference(target_probs, draft_probs, draft_tokens, generator)

    assert "exact-step" not in {c.name for c in battery_checks(no_uniforms)}


@pytest.mark.parametrize("budget, epsilon", [("quick", 0.05), ("standard", 0.02), ("thorough", 0.01)])
def test_named_budgets_size_every_check_for_their_tv(budget, epsilon):
    checks = battery_checks()
    plans, share = plan_checks(checks, resolve_budget(budget), 1e-3, 0, "sampler")
    statistical = [(c, p) for c, p in zip(checks, plans) if c.statistical]
    assert share == pytest.approx(1e-3 / len(statistical))
    for check, plan in statistical:
        # Sequential checks: the final look runs at share − α(1/2) and is sized for it alone.
        final = plan.look_alphas[-1]
        assert final == pytest.approx(share * 63 / 64) and sum(plan.look_alphas) == pytest.approx(share)
        # The production-shape checks are sized for their own TV per budget (check.target_tvs).
        tv = check.target_tv(resolve_budget(budget))
        assert tv == (check.target_tvs[budget] if check.sized_for_own_tv else epsilon)
        assert plan.looks[-1] == plan.n == plan.n_required == check.required_samples(tv, alpha=final, power=POWER)
        assert plan.detectable_tv <= tv
        # n: the power calculation's minimum: used/minimum = 1.0
        if check.kind == "goodness-of-fit" and not check.name.startswith("production-"):
            assert plan.n == stats.sample_size_for_tv(epsilon, alpha=final, power=POWER, num_cells=check.num_cells)
            assert stats.power_at(plan.n, epsilon, alpha=final, num_cells=check.num_cells) >= POWER
            fixed = stats.sample_size_for_tv(epsilon, alpha=share, power=POWER, num_cells=check.num_cells)
            assert plan.n <= 1.15 * fixed  # the bound on the inflation (measured: ≤ 1.3 %)


def test_fixed_budget_reports_the_tv_it_can_detect():
    checks = battery_checks()
    plans, share = plan_checks(checks, resolve_budget(5000), 1e-3, 0, "sampler")
    for check, plan in zip(checks, plans):
        if check.statistical:
            # A production check at V = 151,936 has no guaranteed power from 5,000 rows (inf).
            assert plan.n == 5000 and 0.02 < plan.detectable_tv
            assert plan.detectable_tv < 1 or check.name.startswith("production-")


def test_seeds_depend_on_the_base_seed_and_the_check():
    checks = battery_checks()
    first, _ = plan_checks(checks, resolve_budget("quick"), 1e-3, 0, "sampler")
    again, _ = plan_checks(checks, resolve_budget("quick"), 1e-3, 0, "sampler")
    other, _ = plan_checks(checks, resolve_budget("quick"), 1e-3, 1, "sampler")
    assert [p.seed for p in first] == [p.seed for p in again]
    assert len({p.seed for p in first}) == len(first)
    assert all(a.seed != b.seed for a, b in zip(first, other))


@pytest.mark.parametrize("bad", ["fast", "3", 0, -5, True, "1e3"])
def test_bad_budgets_are_value_errors(bad):
    with pytest.raises(ValueError, match="budget"):
        resolve_budget(bad)


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="alpha"):
        audit(reference, alpha=2.0)
    with pytest.raises(ValueError, match="level"):
        audit(reference, level="kernel")
    with pytest.raises(ValueError, match="checks"):
        audit(reference, checks=["no-such-check"])
    with pytest.raises(ValueError, match="timeout_s"):
        audit(reference, timeout_s=0)
    with pytest.raises(ValueError, match="device"):
        audit(reference, device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where CUDA is absent")
def test_cuda_without_cuda_is_a_value_error():
    with pytest.raises(ValueError, match="CUDA is not available"):
        audit(reference, device="cuda")


@pytest.mark.gpu
@pytest.mark.statistical
def test_audit_on_cuda_tensors():
    report = audit(VECTORIZED, device="cuda", budget=3000,
                   checks=["randomness-source", "exact-step", "step-K8-tail", "production-K32", "inputs-unchanged"])
    assert report.exit_code == EXIT_PASS, report.explain()


def test_unloadable_target_could_not_be_audited():
    report = audit("no/such/file.py:verify", budget="quick")
    assert report.exit_code == EXIT_ERROR and "does not exist" in report.summary


def test_package_exports_the_audit_functions():
    assert specverify.audit is audit and specverify.assert_lossless is assert_lossless


# --------------------------------------------------------------------------------------------
# Known bugs
# --------------------------------------------------------------------------------------------


TOY_SHAPED = sorted(name for name, entry in CATALOG.items() if not entry.production_shaped and not entry.ragged_only)
RAGGED_ONLY = sorted(name for name, entry in CATALOG.items() if entry.ragged_only)
"""Exact on full rows: killed by the ragged checks (tests/auditing/test_ragged.py)."""
PRODUCTION_SHAPED = sorted(name for name, entry in CATALOG.items() if entry.production_shaped)


@pytest.mark.statistical
@pytest.mark.parametrize("name", TOY_SHAPED)
def test_catalog_entry_is_caught_by_the_statistical_and_contract_checks(name):
    """Reduced default-run budget (3000 samples per check, small vocabularies, no exact check: what a
    third-party function without uniforms= gets)."""
    report = audit(f"catalog:{name}", budget=3000, checks=STATISTICAL_SMALL_VOCAB + CONTRACT)
    assert report.exit_code == EXIT_FAIL, report.explain()


# The production check that kills each production-shape entry first at the quick budget (the
# measured kill table of all five production checks per entry is in docs/budgets.md).
PRODUCTION_KILLER = {
    "bfloat16_cdf_path": "production-qwen-K1", "bonus_library_top_k": "production-gpt2-K4",
    "contiguous_stride_reads": "production-K32", "draft_length_specialised_kernel": "production-K32",
    "draft_length_specialised_to_16": "production-K32",
    "bonus_tempered_at_large_vocab": "production-qwen-K1",
    "half_precision_cdf_at_large_vocab": "production-qwen-K1", "partial_last_tile_dropped": "production-batch-1024",
    "row_block_offset_dropped": "production-batch-1024", "vocabulary_tile_drops_high_ids": "production-qwen-K1",
}


def test_every_production_entry_has_its_killer():
    assert set(PRODUCTION_KILLER) == set(PRODUCTION_SHAPED)


@pytest.mark.statistical
@pytest.mark.parametrize("name", PRODUCTION_SHAPED)
def test_production_entry_is_caught_by_its_production_check(name):
    """Right at toy shapes, wrong at production shapes: the production check fails at quick (a
    loss the toy checks cannot see: test_catalog_entry_is_caught... runs them on toy entries only)."""
    report = audit(f"catalog:{name}", budget="quick", checks=[PRODUCTION_KILLER[name]])
    assert report.exit_code == EXIT_FAIL, report.explain()
    assert "production shapes only" in report.diagnosis


# Not integrable one row at a time: the randomness entries, the cross-row entries, and the stride
# reader (on a padded view its final draw is no inverse CDF in token order, so the exact check
# declines it and the strided production checks judge it).
NOT_INTEGRABLE_ALONE = ("global_torch_rng", "reseeded_every_call", "batch_rows_rolled", "row_block_offset_dropped",
                        "contiguous_stride_reads")


@pytest.mark.parametrize("name", sorted(n for n in CATALOG if n not in NOT_INTEGRABLE_ALONE + tuple(RAGGED_ONLY)))
def test_exact_check_measures_the_loss_of_catalog_entries(name):
    exact = "exact-large-vocabulary" if CATALOG[name].production_shaped else "exact-step"
    report = audit(f"catalog:{name}", checks=[exact])
    assert report.exit_code == EXIT_FAIL and report.checks[0].empirical_tv > 1e-6, report.explain()
    if CATALOG[name].production_shaped:  # the TV `specverify audit --list` shows
        assert report.checks[0].empirical_tv == pytest.approx(PRODUCTION_EXACT_TV[name], abs=1e-6)


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("name", sorted(CATALOG))
def test_catalog_entry_is_caught_at_standard(name):
    report = audit(f"catalog:{name}", budget="standard")
    assert report.exit_code == EXIT_FAIL, report.explain()


@pytest.mark.statistical
def test_buggy_bonus_example_is_caught_at_the_bonus_position():
    report = audit(BUGGY_BONUS, budget="quick", checks=["bonus-position", "step-K8-head"])
    verdicts = {c.name: c.verdict for c in report.checks}
    assert report.exit_code == EXIT_FAIL and verdicts["bonus-position"] == "fail"


def test_assert_lossless_explains_the_failure(monkeypatch):
    """The short message: verdict, diagnosis, the repro and the replay; the details with SPECVERIFY_VERBOSE=1."""
    with pytest.raises(AssertionError) as caught:
        assert_lossless(BUGGY_BONUS, budget="quick", checks=["bonus-position"])
    text = str(caught.value)
    for fragment in ("LOSS DETECTED", "bonus-position", "diagnosis:", "def test_", "--seed 0", "SPECVERIFY_VERBOSE=1"):
        assert fragment in text, text
    monkeypatch.setenv("SPECVERIFY_VERBOSE", "1")
    with pytest.raises(AssertionError) as caught:
        assert_lossless(BUGGY_BONUS, budget="quick", checks=["bonus-position"])
    text = str(caught.value)
    for fragment in ("what it checks", "inputs: ", "family=identical", "observed", "expected", "p-value",
                     "estimated TV"):
        assert fragment in text, text


@pytest.mark.statistical
def test_assert_lossless_returns_the_report_of_a_lossless_function():
    report = assert_lossless(VECTORIZED, budget=2000, checks=["step-K2", "decoding-loop-order1"])
    assert report.exit_code == EXIT_PASS
