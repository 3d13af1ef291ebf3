"""The endpoint level against in-process toy servers: it passes a lossless pair and flags each
planted bug (catalog rules, a greedy bug, a batch-dependent bug), with and without a baseline."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

pytest.importorskip("httpx", reason="the endpoint level needs httpx: pip install -e '.[endpoint]'")

from scipy.stats import binom

from specverify.auditing.endpoint.checks import VLLM_COUNTERS, homogeneity_detectable_tv, metric_violations
from specverify.auditing.endpoint.client import Completion
from specverify.auditing.endpoint.greedy import (
    TOLERANCE_FLOOR,
    exceedance_pvalue,
    greedy_tolerance,
    same_law_test,
    scored_row,
)
from specverify.auditing.endpoint.pit import pit_value, processed_law
from specverify.auditing.runner import audit
from specverify.auditing.sampler.catalog import CATALOG
from specverify.core import stats
from specverify.core.seeding import derive_seed


def _verdicts(report) -> dict[str, str]:
    return {c.name: c.verdict for c in report.checks}


CORE_CHECKS = ("greedy-identity", "batch-invariance", "pit-T1-top8", "pit-T0.7-top8", "context-law-T1-top4",
               "pit-burst-mixed", "pit-pairs-n2", "two-sample-top-p", "seed-reproducibility", "acceptance")
"""The battery without its request-space checks (tests/auditing/test_endpoint_request_space.py)."""


def test_lossless_pair_passes_every_check(toy_server) -> None:
    candidate, baseline = toy_server(speculative=True), toy_server(speculative=False)
    report = audit(candidate.url, level="endpoint", budget="quick", baseline=baseline.url, checks=CORE_CHECKS)
    assert report.exit_code == 0, report.explain()
    assert _verdicts(report) == {"greedy-identity": "pass", "batch-invariance": "pass", "pit-T1-top8": "pass",
                                 "pit-T0.7-top8": "pass", "context-law-T1-top4": "pass", "pit-burst-mixed": "pass",
                                 "pit-pairs-n2": "pass", "two-sample-top-p": "pass", "seed-reproducibility": "pass",
                                 "acceptance": "pass"}
    two_sample = next(c for c in report.checks if c.name == "two-sample-top-p")  # sequential: sized at its final look
    final_level = 1e-3 / 6 * 63 / 64  # six statistical checks share α
    assert two_sample.num_looks == 3 and two_sample.n_required == stats.homogeneity_sample_size(
        0.2, alpha=final_level, power=0.99, num_cells=16)
    assert report.detectable_tv == pytest.approx(homogeneity_detectable_tv(two_sample.n_required, alpha=final_level,
                                                                           power=0.99, num_cells=16))
    acceptance = next(c for c in report.checks if c.name == "acceptance")
    assert "tokens per pass" in acceptance.message and acceptance.message.startswith("counters consistent")


@pytest.mark.parametrize(("rule", "check", "budget"), [
    ("bonus_from_draft", "pit-T1-top8", "quick"),
    # binned-u TV ≈ 0.07 on the toy (benchmarks/toy_planted_tv.py): below quick's 0.1, above standard's 0.05
    ("greedy_acceptance_when_sampling", "pit-T1-top8", "standard"),
    ("residual_softmax", "pit-T1-top8", "quick"),
    ("typical_acceptance", "pit-T0.7-top8", "standard"),
    ("draft_temperature_in_acceptance", "two-sample-top-p", "standard"),
    ("residual_is_target", "two-sample-top-p", "quick"),  # the PIT's u-bins miss it (p = 0.24 at quick)
])
def test_planted_lossy_rule_is_flagged(toy_server, rule: str, check: str, budget: str) -> None:
    candidate = toy_server(speculative=True, rule=CATALOG[rule].fn)
    baseline = toy_server(speculative=False)
    report = audit(candidate.url, level="endpoint", budget=budget, baseline=baseline.url, checks=[check])
    assert report.exit_code == 1, report.explain()
    assert report.verdict == "loss detected"


def test_planted_greedy_bug_is_an_unexplained_divergence_with_a_replay_command(toy_server) -> None:
    candidate, baseline = toy_server(speculative=True, greedy_bug=True), toy_server(speculative=False)
    report = audit(candidate.url, level="endpoint", budget="quick", baseline=baseline.url,
                   checks=["greedy-identity", "pit-T1-top8"])
    greedy = report.checks[0]
    assert greedy.verdict == "fail" and report.exit_code == 1
    assert "UNEXPLAINED" in greedy.message and "curl -s " + candidate.url in greedy.message
    assert "--level endpoint" in report.replay_command and f"--baseline {baseline.url}" in report.replay_command


def test_a_greedy_bug_within_rounding_noise_is_judged_over_the_whole_sequence(toy_server) -> None:
    """Both servers round their batched evaluations (σ = 0.1 nats), so τ is wide; the candidate
    accepts drafts within log 2 of the argmax.  Every position of every completion is scored by the
    baseline's echo, not only each row's first divergence: more positions diverge than there are
    prompts, and the gaps beyond the tolerance fail the check."""
    candidate = toy_server(speculative=True, greedy_bug=True, path_noise=0.1)
    baseline = toy_server(speculative=False, path_noise=0.1)
    report = audit(candidate.url, level="endpoint", budget="quick", baseline=baseline.url, checks=["greedy-identity"])
    greedy = report.checks[0]
    assert greedy.verdict == "fail" and "UNEXPLAINED" in greedy.message, report.explain()
    prompts = len(greedy.parameters["prompts"])
    assert greedy.parameters["divergent positions"][0] > prompts and greedy.parameters["exceedances"] >= 1
    assert greedy.parameters["positions scored"] == prompts * greedy.parameters["max_tokens"]


def test_a_row_the_echo_cannot_score_is_judged_through_its_first_divergence() -> None:
    """Without echo laws (the text re-tokenized differently) the reference's own laws score the
    shared prefix and the first divergent position, where the prefixes are still the same."""
    laws = ({"a": -0.1, "b": -2.0}, {"b": -0.2, "c": -1.0}, {"a": -0.5, "c": -0.6}, {"a": -0.1})
    reference = Completion("abaa", ("a", "b", "a", "a"), (-0.1, -0.2, -0.5, -0.1), laws, "length")
    other = Completion("abcc", ("a", "b", "c", "c"), (None,) * 4, (None,) * 4, "length")
    row = scored_row("p", other, None, reference)
    assert row.positions.tolist() == [0, 1, 2] and row.gaps[2] == pytest.approx(0.1)
    assert scored_row("p", reference, None, reference).positions.tolist() == [0, 1, 2, 3]


def test_batch_dependent_bug_breaks_batch_invariance(toy_server) -> None:
    candidate, baseline = toy_server(speculative=True, batch_bug=True), toy_server(speculative=False)
    report = audit(candidate.url, level="endpoint", budget="quick", baseline=baseline.url,
                   checks=["greedy-identity", "batch-invariance", "pit-T1-top8"], concurrency=4)
    verdicts = _verdicts(report)
    assert verdicts["greedy-identity"] == "pass", report.explain()  # alone it decodes correctly
    assert verdicts["batch-invariance"] == "fail"
    assert "under concurrent load" in report.checks[1].message


def test_without_baseline_the_candidates_own_logprobs_judge_it(toy_server) -> None:
    clean = audit(toy_server(speculative=True).url, level="endpoint", budget="quick",
                  checks=[c for c in CORE_CHECKS if c != "two-sample-top-p"])
    assert clean.exit_code == 0, clean.explain()
    with pytest.raises(ValueError, match="unknown check name"):  # the two-sample check needs a baseline
        audit(toy_server(speculative=True).url, level="endpoint", budget="quick", checks=["two-sample-top-p"])
    greedy_bug = audit(toy_server(speculative=True, greedy_bug=True).url, level="endpoint", budget="quick",
                       checks=["greedy-identity", "pit-T1-top8"])
    assert _verdicts(greedy_bug)["greedy-identity"] == "fail"
    lossy = audit(toy_server(speculative=True, rule=CATALOG["bonus_from_draft"].fn).url, level="endpoint",
                  budget="quick", checks=["pit-T1-top8"])
    assert lossy.exit_code == 1


def test_echo_logprobs_one_position_late_are_detected_and_corrected(toy_server) -> None:
    candidate, baseline = toy_server(speculative=True), toy_server(speculative=False, echo_shift=True)
    report = audit(candidate.url, level="endpoint", budget="quick", baseline=baseline.url,
                   checks=["greedy-identity", "pit-T1-top8"])
    assert report.exit_code == 0, report.explain()
    assert "1 position(s) late" in report.checks[0].message
    assert "late" in str(report.checks[0].parameters["server notes"])
    assert "candidate vs baseline law at the sampled prefixes" in report.checks[1].message
    assert re.search(r"mean TV 0(;|$)", report.checks[1].message)  # the toy servers compute the same float64 law


def test_endpoint_budgets_state_their_detectable_tv_and_sizes() -> None:
    """The numbers of the battery's docstring table (quick, with a baseline: six statistical
    checks, each sized at its final look, 63/64 of its share)."""
    final = 1e-3 / 6 * 63 / 64
    assert stats.sample_size_for_tv(0.1, alpha=final, power=0.99, num_cells=10) == 1373
    assert stats.sample_size_for_tv(0.1, alpha=final, power=0.99, num_cells=31) == 1904
    assert stats.sample_size_for_tv(0.1, alpha=final, power=0.99, num_cells=16) == 1561
    assert stats.homogeneity_sample_size(0.2, alpha=final, power=0.99, num_cells=16) == 781
    n = stats.homogeneity_sample_size(0.2, alpha=final, power=0.99, num_cells=16)
    assert homogeneity_detectable_tv(n, alpha=final, power=0.99, num_cells=16) <= 0.2 + 1e-9


def test_randomized_pit_is_exactly_uniform_under_the_law() -> None:
    """Each token's u-interval [F(x−), F(x−) + p(x)) has length p(x): under x ~ p the u's law is
    the mixture Σ_x p(x)·Uniform(interval_x), which is Uniform(0, 1) exactly."""
    top = {"a": math.log(0.5), "b": math.log(0.3), "c": math.log(0.15), "d": math.log(0.05)}
    for temperature in (1.0, 0.7):
        law = processed_law(top, temperature=temperature, top_k=3)
        starts = [pit_value(law, t, 0.0, tie_tolerance=0.0) for t in law.tokens]
        ends = [pit_value(law, t, 1.0, tie_tolerance=0.0) for t in law.tokens]
        assert starts[0] == 0.0 and ends[-1] == pytest.approx(1.0)
        assert np.allclose(np.array(ends) - np.array(starts), law.probs)
        assert all(a == pytest.approx(b) for a, b in zip(starts[1:], ends[:-1]))
        assert pit_value(law, "d", 0.5, tie_tolerance=0.0) is None  # outside the top 3: probability 0
    expected = np.array([0.5, 0.3, 0.15]) ** (1 / 0.7)
    assert np.allclose(processed_law(top, temperature=0.7, top_k=3).probs, expected / expected.sum())


def test_rounding_noise_of_batched_paths_is_not_a_different_law(toy_server) -> None:
    """Both servers return batched evaluations (the candidate's verify pass, the baseline's echo)
    with deterministic N(0, 0.1²) noise, as batch-shape rounding does: the same-law test accepts
    the candidate, whose deviations are the size of the baseline's own between its paths."""
    candidate = toy_server(speculative=True, path_noise=0.1)
    baseline = toy_server(speculative=False, path_noise=0.1)
    report = audit(candidate.url, level="endpoint", budget="quick", baseline=baseline.url, checks=["greedy-identity"])
    assert report.checks[0].verdict == "pass", report.explain()
    parameters = report.checks[0].parameters
    assert parameters["same-law threshold"] > 0.1  # the echo's upper decile, above the floor


@pytest.mark.parametrize("path_noise", [0.0, 0.1])
def test_planted_different_law_fails_the_same_law_test(toy_server, path_noise: float) -> None:
    """A candidate serving the toy LM at temperature 1.1 (same greedy tokens, other logprobs)
    fails greedy-identity on its logprobs alone, with or without rounding noise on both servers."""
    candidate = toy_server(speculative=True, law_temperature=1.1, path_noise=path_noise)
    baseline = toy_server(speculative=False, path_noise=path_noise)
    report = audit(candidate.url, level="endpoint", budget="quick", baseline=baseline.url, checks=["greedy-identity"])
    greedy = report.checks[0]
    assert greedy.verdict == "fail" and report.exit_code == 1, report.explain()
    assert "different law" in greedy.message
    assert greedy.parameters["same-law p-value"] <= 1e-3


def test_same_law_test_counts_exceedances_of_the_baselines_upper_decile() -> None:
    noise = list(np.linspace(0.0, 0.2, 101))  # 11th largest (upper decile): 0.18
    one_in_ten = [0.01] * 90 + [0.3] * 10
    assert same_law_test(one_in_ten, [noise, [0.0] * 50]).same_law
    shifted = [0.19] * 60 + [0.01] * 40
    test = same_law_test(shifted, [[0.0] * 50, noise])  # the noisier sample sets the threshold
    assert not test.same_law and test.exceeding == 60 and test.threshold == pytest.approx(0.18)
    assert same_law_test([0.04] * 50, [[0.0] * 50]).same_law  # below the floor: decimal rounding
    assert not same_law_test([0.06] * 50, [[0.0] * 50]).same_law


def test_the_candidates_deviations_widen_the_tolerance_only_as_one_law() -> None:
    """The baseline's repeat and echo noise enter by their maximum; the candidate's deviations by
    their upper decile, and not at all when the same-law test rejects them."""
    repeat, echo = [0.0] * 100, list(np.linspace(0.0, 0.2, 101))
    accepted = [0.01] * 90 + [0.3] * 10
    law = same_law_test(accepted, [repeat, echo])
    assert law.same_law and greedy_tolerance(repeat, echo, accepted, law).tolerance == pytest.approx(0.4)
    wide = [0.5] * 60 + [0.01] * 40
    rejected = same_law_test(wide, [repeat, echo])
    assert not rejected.same_law
    assert greedy_tolerance(repeat, echo, wide, rejected).tolerance == pytest.approx(0.4)  # the echo's max
    admitted = greedy_tolerance(repeat, echo, wide, dataclasses.replace(rejected, pvalue=1.0))
    assert admitted.tolerance == pytest.approx(1.0) and admitted.set_by == "candidate deviations"
    assert greedy_tolerance().tolerance == TOLERANCE_FLOOR  # nothing measured yet


def test_exceedance_distribution_is_exact_and_tends_to_the_binomial() -> None:
    """Σ_x P(X = x) = 1; for m → ∞ X ~ Binomial(n, r/m); simulated exchangeable draws agree."""
    assert exceedance_pvalue(0, 20, 3, 30) == pytest.approx(1.0)
    big = exceedance_pvalue(5, 40, 1000, 10000)
    assert big == pytest.approx(float(binom.sf(4, 40, 0.1)), rel=0.05)
    rng = np.random.default_rng(derive_seed("exceedance-test"))
    draws = rng.standard_normal((20000, 50))
    cross, noise = draws[:, :20], draws[:, 20:]
    threshold = np.sort(noise, axis=1)[:, -3]  # the 3rd largest of 30
    counts = (cross > threshold[:, None]).sum(axis=1)
    assert np.mean(counts >= 6) == pytest.approx(exceedance_pvalue(6, 20, 3, 30), abs=0.005)


def test_inconsistent_speculation_counters_violate_the_acceptance_contract(toy_server) -> None:
    """A server that counts each pass's own token as an accepted draft reports as many accepted
    drafts as emitted tokens (and more than drafted on repetitive text): contract violated."""
    candidate, baseline = toy_server(speculative=True, fault="bad-counters"), toy_server(speculative=False)
    report = audit(candidate.url, level="endpoint", budget="quick", baseline=baseline.url,
                   checks=["greedy-identity", "acceptance", "pit-T1-top8"])
    verdicts = _verdicts(report)
    assert verdicts == {"greedy-identity": "pass", "acceptance": "fail", "pit-T1-top8": "pass"}, report.explain()
    assert report.verdict == "contract violated" and report.exit_code == 1
    acceptance = next(c for c in report.checks if c.name == "acceptance")
    assert "each pass emits one token of its own" in acceptance.message


def test_prometheus_counter_claims() -> None:
    accepted, drafted = VLLM_COUNTERS["accepted"], VLLM_COUNTERS["drafted"]
    assert metric_violations({accepted: 3, drafted: 8}, {accepted: 10, drafted: 20}) == []
    assert "decreased" in " ".join(metric_violations({accepted: 3, drafted: 8}, {accepted: 3, drafted: 4}))
    assert any(f"{accepted} 9 > {drafted} 8" in v for v in metric_violations({accepted: 9, drafted: 8}, {}))
