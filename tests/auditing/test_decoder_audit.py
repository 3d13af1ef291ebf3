"""Tests of the decoder level of the audit (``specverify audit TARGET --level decoder``).

Two kinds of SPEC §2 decoders drive the battery:

- *table decoders* (:class:`TableDecoder`): stand-ins that sample each new token straight from the
  target's processed next-token law (cached, so a call costs microseconds).  The correct one is
  lossless by construction; each buggy one plants one mistake.  They test the battery's logic,
  its cells and its statistics at full budgets in seconds;
- *real decoders*: the reference speculative decoder (``reference.decoder.generate``) and two
  buggy variants of it, which show that the battery catches real decoder bugs end to end:
  the correction drawn from ``p`` instead of ``norm(max(0, p − q))`` (catalog entry
  ``residual_is_target`` swapped into the decoder), and a draft that ignores the temperature
  while the verifier assumes the tempered law.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

import reference.decoder
from reference.drafters import ModelDrafter
from specverify.auditing.checks import Plan
from specverify.auditing.decoder.battery import (
    DECODER_BUDGETS,
    FILTER_STRATA,
    MIN_EXPECTED,
    TEMPERATURE_STRATA,
    DecoderBattery,
    DecoderModels,
    SequenceLawCheck,
    Setting,
    audit_decoder,
    resolve_decoder_budget,
    sequence_index,
    validate_new_tokens,
)
from specverify.auditing.isolation.faults import Fault
from specverify.auditing.runner import EXIT_ERROR, EXIT_FAIL, EXIT_PASS, audit
from specverify.auditing.sampler.catalog import CATALOG
from specverify.core import stats
from specverify.core.processing import process_logits
from specverify.core.rules import VerifyResult, rejection_sample
from specverify.core.seeding import derive_seed
from specverify.hf.tiny_models import continuation_distribution

ALPHA = 1e-3


# --------------------------------------------------------------------------------------------
# Table decoders: exact target sampling, with planted bugs
# --------------------------------------------------------------------------------------------


class TableDecoder:
    """SPEC §2 stand-in: token i is drawn by inverse CDF from the target's processed law after
    the prompt and tokens ``< i`` (``u`` from ``numpy.random.default_rng(seed)``); greedy takes the
    argmax.  Next-token laws are cached per (model, prefix, setting)."""

    def __init__(self) -> None:
        self.laws: dict[tuple, np.ndarray] = {}

    def law(self, model: torch.nn.Module, prefix: tuple[int, ...], setting: Setting) -> np.ndarray:
        key = (id(model), prefix, setting)
        if key not in self.laws:
            with torch.no_grad():
                logits = model(torch.tensor([prefix])).logits[0, -1].double()
            probs = process_logits(logits, temperature=setting.temperature, top_k=setting.top_k, top_p=setting.top_p)
            self.laws[key] = probs.double().numpy() / float(probs.double().sum())
        return self.laws[key]

    def setting(self, temperature: float, top_k: int | None, top_p: float | None) -> Setting:
        return Setting(temperature, top_k, top_p)

    def model(self, target: torch.nn.Module, draft: torch.nn.Module, setting: Setting) -> torch.nn.Module:
        return target

    def uniforms(self, seed: int, count: int) -> np.ndarray:
        return np.random.default_rng(seed).random(count)

    def __call__(self, target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
        setting = self.setting(temperature, top_k, top_p)
        model = self.model(target, draft, setting)
        prefix = tuple(input_ids[0].tolist())
        for u in self.uniforms(seed, max_new_tokens):
            law = self.law(model, prefix, setting)
            token = (int(np.argmax(law)) if setting.temperature == 0
                     else int(np.searchsorted(np.cumsum(law), u * law.sum(), side="right")))
            prefix += (min(token, len(law) - 1),)
        return torch.tensor(prefix[input_ids.shape[1]:], dtype=torch.int64)


class IgnoresTemperature(TableDecoder):
    def setting(self, temperature, top_k, top_p):
        return Setting(1.0 if temperature > 0 else 0.0, top_k, top_p)  # BUG: samples at T=1


class IgnoresFilters(TableDecoder):
    def setting(self, temperature, top_k, top_p):
        return Setting(temperature)  # BUG: top-k / top-p dropped


class UsesGlobalRng(TableDecoder):
    def uniforms(self, seed, count):
        return torch.rand(count, dtype=torch.float64).numpy()  # BUG: global torch RNG, seed unused


class IgnoresSeed(TableDecoder):
    def uniforms(self, seed, count):
        return np.random.default_rng(0).random(count)  # BUG: the same uniforms whatever the seed


class GreedyFromDraft(TableDecoder):
    def model(self, target, draft, setting):
        return draft if setting.temperature == 0 else target  # BUG: greedy output of the draft


EXACT_SAMPLER = TableDecoder()


def audit_table(decoder, **options):
    options.setdefault("budget", "quick")
    return audit(decoder, level="decoder", **options)


def verdicts(report) -> dict[str, str]:
    return {check.name: check.verdict for check in report.checks}


# --------------------------------------------------------------------------------------------
# The battery's construction: laws, cells, sample sizes
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models() -> DecoderModels:
    return DecoderModels()


@pytest.fixture(scope="module")
def battery_checks(models):
    battery = DecoderBattery()
    session = battery.open_session(TableDecoder(), device="cpu", timeout_s=60)
    return {check.name: check for check in battery.checks(session)}


def test_sequence_law_matches_tiny_models_enumeration(models):
    stratum = FILTER_STRATA[2]
    setting, prompt = stratum
    law = models.sequence_law(stratum, 3)
    reference_law = continuation_distribution(models.target, prompt, 3, temperature=setting.temperature,
                                              top_k=setting.top_k, top_p=setting.top_p)
    for tokens, probability in reference_law.items():
        assert law[sequence_index(torch.tensor(tokens), 8)] == pytest.approx(probability, abs=1e-12)
    assert law.sum() == pytest.approx(1.0, abs=1e-12)


def test_greedy_cases_are_far_from_ties(battery_checks):
    """The identity check compares argmaxes computed with and without a KV cache; a top-2 logit gap
    far above float32 rounding (~1e-6) makes it exact."""
    assert battery_checks["greedy-identity"].parameters["smallest top-2 logit gap"] > 1e-2


@pytest.mark.parametrize("name", ["sampling-temperatures", "sampling-top-k-top-p"])
@pytest.mark.parametrize("budget", sorted(DECODER_BUDGETS))
def test_cells_are_fixed_with_enough_expected_count(battery_checks, name, budget):
    check: SequenceLawCheck = battery_checks[name]
    epsilon = DECODER_BUDGETS[budget]
    share = stats.bonferroni(ALPHA, 2)
    n = check.required_samples(epsilon, alpha=share, power=0.99)
    cells = check.cell_map(n)
    positive = cells.expected[: cells.num_positive]
    assert cells.expected.sum() == pytest.approx(1.0, abs=1e-12)
    assert (n * positive >= MIN_EXPECTED - 1e-9).all()  # the test pools nothing: the power statement is exact
    assert (cells.expected[cells.num_positive:] == 0).all()
    assert check.detectable_tv(n, alpha=share, power=0.99) <= epsilon
    assert check.detectable_tv(n - 1, alpha=share, power=0.99) > epsilon * 0.999  # n is (nearly) minimal
    # every continuation has a cell, and the cell's probability is the sum of its continuations'
    strata = len(check.strata)
    rebuilt = np.bincount(cells.index.reshape(-1), weights=(check.laws / strata).reshape(-1),
                          minlength=len(cells.expected))
    np.testing.assert_allclose(rebuilt, cells.expected, atol=1e-15)


def test_filter_strata_have_zero_probability_continuations(battery_checks):
    check = battery_checks["sampling-top-k-top-p"]
    cells = check.cell_map(200)
    assert len(cells.expected) > cells.num_positive
    assert all("probability 0" in label for label in cells.labels[cells.num_positive:])


def test_seed_sensitivity_false_alarm_is_negligible(battery_checks):
    check = battery_checks["seed-sensitivity"]
    assert check.false_alarm <= 1e-9
    assert float(np.sum(check.law ** (check.calls - 1))) > 1e-9  # the smallest such number of calls


def test_named_budgets_resolve_to_decoder_targets():
    assert resolve_decoder_budget("quick").epsilon == DECODER_BUDGETS["quick"]
    assert resolve_decoder_budget("Standard").epsilon == DECODER_BUDGETS["standard"]
    assert resolve_decoder_budget(300).samples == 300
    with pytest.raises(ValueError, match="budget"):
        resolve_decoder_budget("huge")


# --------------------------------------------------------------------------------------------
# Output validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ([1, 2, 3], "expected an int64 tensor"),
        (torch.tensor([1.0, 2.0, float("nan")]), "NaN"),
        (torch.tensor([1, 2, 3], dtype=torch.int32), "dtype torch.int32"),
        (torch.tensor([[1, 2, 3]]), r"shape \(1, 3\)"),
        (torch.tensor([5, 1, 2, 3]), "without the prompt"),
        (torch.tensor([1, 8, 3]), "outside the vocabulary"),
        (torch.tensor([1, -1, 3]), "outside the vocabulary"),
    ],
)
def test_validate_new_tokens_rejects_malformed_output(output, message):
    with pytest.raises(Fault, match=message) as caught:
        validate_new_tokens(output, 3, 8)
    assert caught.value.kind == "malformed"


def test_validate_new_tokens_accepts_spec_output():
    assert validate_new_tokens(torch.tensor([0, 7, 3]), 3, 8).tolist() == [0, 7, 3]


# --------------------------------------------------------------------------------------------
# Table decoders through the whole audit
# --------------------------------------------------------------------------------------------


@pytest.mark.statistical
@pytest.mark.parametrize("budget", ["quick", pytest.param("standard", marks=pytest.mark.slow)])
def test_exact_sampler_passes(budget):
    """A decoder that samples the target exactly passes (each audit fails it with probability ≤ α)."""
    report = audit_table(EXACT_SAMPLER, budget=budget)
    assert report.exit_code == EXIT_PASS, report.explain()
    assert report.detectable_tv <= DECODER_BUDGETS[budget]


@pytest.mark.slow
@pytest.mark.statistical
def test_exact_sampler_false_alarm_rate_is_within_alpha():
    """20 audits with random base seeds at α = 0.05: a lossless decoder fails at most α of them; 5 or
    more failures has probability ≤ 0.016 under the bound (binomial(20, 0.05))."""
    failures = sum(audit_table(EXACT_SAMPLER, budget="quick", alpha=0.05, seed=derive_seed("false-alarm", i)).exit_code
                   != EXIT_PASS for i in range(20))
    assert failures < 5


def test_exact_sampler_report_is_deterministic():
    first, second = audit_table(EXACT_SAMPLER, budget=60), audit_table(EXACT_SAMPLER, budget=60)
    strip = lambda report: [dataclasses.replace(c, seconds=0.0) for c in report.checks]  # noqa: E731
    assert strip(first) == strip(second)


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("decoder", "budget", "failing"),
    [
        # sampling at T=1 instead of 0.7 / 1.3: joint TV (0.224 + 0.198) / 3 = 0.14 on the temperature
        # check's strata, above the standard budget's 0.1 (quick's 0.25 need not see it)
        (IgnoresTemperature(), "standard", {"sampling-temperatures", "sampling-top-k-top-p"}),
        (IgnoresFilters(), "quick", {"sampling-top-k-top-p"}),
        (UsesGlobalRng(), "quick", {"determinism"}),
        (IgnoresSeed(), "quick", {"seed-sensitivity"}),
        (GreedyFromDraft(), "quick", {"greedy-identity"}),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, TableDecoder) else None,
)
def test_planted_bugs_are_caught_by_their_check(decoder, budget, failing):
    report = audit_table(decoder, budget=budget, fail_fast=False)  # every check, to see each that fails
    assert report.exit_code == EXIT_FAIL, report.explain()
    assert failing <= {name for name, verdict in verdicts(report).items() if verdict == "fail"}, report.explain()


def test_filtered_token_is_a_certain_loss():
    report = audit_table(IgnoresFilters(), checks=["sampling-top-k-top-p"])
    (check,) = report.checks
    assert check.verdict == "fail" and check.pvalue == 0.0 and "probability 0" in check.message


class ReturnsPromptToo(TableDecoder):
    def __call__(self, target, draft, input_ids, **settings):
        return torch.cat([input_ids[0], super().__call__(target, draft, input_ids, **settings)])


class ReturnsFloats(TableDecoder):
    def __call__(self, *args, **settings):
        return super().__call__(*args, **settings).float()


class ReturnsOutOfRange(TableDecoder):
    def __call__(self, *args, **settings):
        return super().__call__(*args, **settings) + 8


class Raises(TableDecoder):
    def __call__(self, *args, **settings):
        raise RuntimeError("CUDA error: device-side assert triggered")


class Hangs(TableDecoder):
    def __call__(self, *args, **settings):
        time.sleep(30)


@pytest.mark.parametrize(
    ("decoder", "message"),
    [(ReturnsPromptToo(), "without the prompt"), (ReturnsFloats(), "dtype torch.float32"),
     (ReturnsOutOfRange(), "outside the vocabulary"), (Raises(), "raised RuntimeError: CUDA error"),
     (Hangs(), "per-call timeout")],
    ids=lambda value: type(value).__name__ if isinstance(value, TableDecoder) else None,
)
def test_faults_make_the_audit_could_not_audit(decoder, message):
    # Only the hanging decoder gets a short deadline: a loaded CI machine can take longer than
    # 0.3 s for one honest call, and the other faults must be reported for what they are.
    report = audit_table(decoder, budget=20, timeout_s=0.3 if isinstance(decoder, Hangs) else 30.0)
    assert report.exit_code == EXIT_ERROR, report.explain()
    assert report.verdict == "could not audit" and message in report.summary
    assert not report.failed


class MutatesInput(TableDecoder):
    def __call__(self, target, draft, input_ids, **settings):
        tokens = super().__call__(target, draft, input_ids, **settings)
        input_ids[0, 0] = tokens[0]  # BUG: writes into the caller's tensor
        return tokens


class TrainsTheTarget(TableDecoder):
    def __call__(self, target, draft, input_ids, **settings):
        with torch.no_grad():
            target.lm_head.weight.mul_(1.0 + 1e-6)  # BUG: changes the model under audit
        return super().__call__(target, draft, input_ids, **settings)


@pytest.mark.parametrize(("decoder", "check"),
                         [(MutatesInput(), "inputs-unchanged"), (TrainsTheTarget(), "models-unchanged")],
                         ids=["mutates-input", "modifies-model"])
def test_contract_violations_fail(decoder, check):
    report = audit_table(decoder, budget=20)
    assert verdicts(report)[check] == "fail"
    assert report.exit_code == EXIT_FAIL


def test_audit_decoder_helper_and_unknown_builtin():
    report = audit_decoder(TableDecoder(), budget=20, checks=["greedy-identity", "sampling-temperatures"],
                           allow_underpowered=True)
    assert report.level == "decoder" and report.exit_code == EXIT_PASS, report.explain()
    assert [c.name for c in report.checks] == ["greedy-identity", "sampling-temperatures"]
    unknown = audit("no-such-decoder", level="decoder")
    assert unknown.exit_code == EXIT_ERROR and "no-such-decoder" in unknown.summary


# --------------------------------------------------------------------------------------------
# Real decoders: the reference and two buggy variants of it
# --------------------------------------------------------------------------------------------


class DraftIgnoresTemperature(ModelDrafter):
    """BUG: the draft model samples at temperature 1 while the verifier is told the draft law at
    the request's temperature T (q_T ∝ q_1^(1/T)), as when only the target's logits get divided by T."""

    def propose(self, sequences, gammas, params, generator):
        if params.temperature in (0, 1) or not bool(gammas.any()):  # no draft this step: nothing to misreport
            return super().propose(sequences, gammas, params, generator)
        draft = super().propose(sequences, gammas, dataclasses.replace(params, temperature=1.0), generator)
        believed = draft.probs.double() ** (1 / params.temperature)
        return dataclasses.replace(draft, probs=(believed / believed.sum(-1, keepdim=True)).float())


def generate_draft_ignores_temperature(target, draft, input_ids, **settings):
    return reference.decoder.generate(target, DraftIgnoresTemperature(draft), input_ids, **settings)


def rejection_sample_residual_from_target(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None,
                                          num_draft=None):
    """BUG (catalog ``residual_is_target``): after a rejection the correction is drawn from p.

    Batch 1 (SPEC §2 decodes one prompt): the step's ``n`` drafts and their uniforms in the rules'
    convention (columns ``0..n-1`` and ``K``) go to the catalog entry; a step with no draft (one
    token left to make) is a plain draw from ``p_0``, which the correct rule makes."""
    n = int(num_draft[0])
    if n == 0:
        return rejection_sample(target_probs, draft_probs, draft_tokens, uniforms=uniforms, num_draft=num_draft)
    columns = list(range(n)) + [draft_tokens.shape[1]]
    emitted = CATALOG["residual_is_target"].fn(target_probs[:, : n + 1], draft_probs[:, :n], draft_tokens[:, :n],
                                               uniforms=uniforms[:, columns])
    emitted = torch.cat([emitted, emitted.new_full((1, draft_tokens.shape[1] - n), -1)], 1)
    return VerifyResult(emitted, (emitted >= 0).sum(1) - 1)


def run_single_stratum(generate, stratum, n: int):
    """The battery's sequence-law check on one stratum only, at the audit's α share (α / 2)."""
    session = DecoderBattery().open_session(generate, device="cpu", timeout_s=60)
    check = SequenceLawCheck("single-stratum", "one stratum", (stratum,), 3,
                             session.models.sequence_law(stratum, 3)[None])
    share = stats.bonferroni(ALPHA, 2)
    plan = Plan(n, n, share, check.detectable_tv(n, alpha=share, power=0.99), derive_seed("single-stratum", n))
    return check.run(session, plan)


@pytest.mark.statistical
def test_reference_decoder_passes():
    """The correct reference decoder passes every check (a fixed budget of 120 calls per
    statistical check keeps this under half a minute; ``quick`` runs in the slow test below): a
    pass below the decoder level's power ceiling, so it is allowed explicitly."""
    report = audit("reference", level="decoder", budget=120, allow_underpowered=True)
    assert report.exit_code == EXIT_PASS, report.explain()
    assert report.shortfall is not None and "underpowered" in report.summary


@pytest.mark.slow
@pytest.mark.statistical
def test_reference_decoder_passes_quick():
    report = audit("reference", level="decoder", budget="quick")
    assert report.exit_code == EXIT_PASS, report.explain()


# Measured effects of the two real bugs (Pearson X² − dof per call, on cells of the continuations
# of probability ≥ 0.01, 500–800 calls per stratum): residual from p: 0.11 / 0.24 / 0.06 per call at
# T = 1 / 0.7 / 1.3 (plug-in 3-token TV 0.2–0.27); draft ignoring T: 0 / 0.093 / 0.029.  The
# sample sizes below give power ≥ 0.98 at α / 2 even if the true effect is 25 % smaller.


@pytest.mark.statistical
def test_reference_decoder_with_residual_from_target_fails(monkeypatch):
    """Sampling the correction from p (first token min(p, q) + (1 − α) p instead of p): the
    sequence-law check on the T = 0.7 stratum catches it with 250 calls."""
    monkeypatch.setattr(reference.decoder, "rejection_sample", rejection_sample_residual_from_target)
    result = run_single_stratum(reference.decoder.generate, TEMPERATURE_STRATA[1], 250)
    assert result.verdict == "fail", result.message


@pytest.mark.slow
@pytest.mark.statistical
def test_reference_decoder_with_residual_from_target_fails_the_audit(monkeypatch):
    monkeypatch.setattr(reference.decoder, "rejection_sample", rejection_sample_residual_from_target)
    # In this process: a worker would import the unpatched module.
    report = audit("reference", level="decoder", budget="standard", checks=["sampling-temperatures"],
                   isolation="none")
    assert report.exit_code == EXIT_FAIL, report.explain()


@pytest.mark.slow
@pytest.mark.statistical
def test_reference_decoder_with_draft_ignoring_temperature_fails_the_audit():
    """Invisible at T = 1 (the believed and the real draft laws coincide) and at quick; the standard
    temperature check (2397 calls) has power ≈ 0.9–1 against it."""
    report = audit(generate_draft_ignores_temperature, level="decoder", budget="standard",
                   checks=["sampling-temperatures"])
    assert report.exit_code == EXIT_FAIL, report.explain()
