"""Tests of the decoder level of the audit (``specverify audit TARGET --level decoder``).

Three kinds of SPEC §2 decoders drive the battery:

- *table decoders* (:class:`TableDecoder`): stand-ins that sample each new token straight from the
  target's processed next-token law.  The correct one is lossless by construction; each buggy one
  plants one mistake.  They test the battery's checks through the whole audit in seconds;
- *batched samplers* (:func:`sampled_tally`): many continuations at once, exactly from the target
  (or from a planted wrong law, or with planted reuse of random numbers), counted by the
  position-law check itself, so that its level and its power are tested on thousands of calls
  in seconds;
- *real decoders*: the reference speculative decoder, the same with other drafters, and the
  decoder catalog (:mod:`specverify.auditing.decoder.catalog`), each entry the reference with
  one mistake: every entry whose ε̄ reaches quick's is killed by the position-law check and the
  correct ones pass (slow).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest
import torch

import reference.decoder
from reference.drafters import EarlyExitDrafter
from specverify.auditing.checks import Plan, Tally
from specverify.auditing.decoder.battery import (
    CONTINUATION_LENGTH,
    DECODER_BUDGETS,
    GREEDY_CASES,
    MODEL_PAIRS,
    PIT_BINS,
    PIT_LAGS,
    POSITION_STRATA,
    DecoderModels,
    PositionLawCheck,
    Setting,
    Stratum,
    audit_decoder,
    resolve_decoder_budget,
    validate_new_tokens,
)
from specverify.auditing.decoder.catalog import DECODER_CATALOG
from specverify.auditing.defaults import EXIT_ERROR, EXIT_FAIL, EXIT_PASS
from specverify.auditing.endpoint.pit import token_pit_values
from specverify.auditing.isolation.faults import Fault
from specverify.auditing.runner import audit
from specverify.core import stats
from specverify.core.processing import process_logits
from specverify.core.seeding import derive_seed
from specverify.core.sequential import final_look_alpha
from specverify.hf.tiny_models import continuation_laws

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


def audit_table(decoder, **options):
    options.setdefault("budget", 20)
    options.setdefault("allow_underpowered", True)
    return audit(decoder, level="decoder", **options)


def verdicts(report) -> dict[str, str]:
    return {check.name: check.verdict for check in report.checks}


# --------------------------------------------------------------------------------------------
# The battery's construction: models, laws, plans
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models() -> DecoderModels:
    return DecoderModels()


@pytest.fixture(scope="module")
def position_check(models) -> PositionLawCheck:
    return PositionLawCheck("position-laws", "test", POSITION_STRATA, CONTINUATION_LENGTH, models)


def test_model_pairs_have_the_stated_acceptance_and_vary(models):
    """Peaked and flat targets, drafts close to and far from them: Σ min(p, q) at T = 1 on 200
    random contexts is the pair's stated acceptance (±0.02)."""
    contexts = torch.randint(0, 8, (200, 10), generator=torch.Generator().manual_seed(0))
    for name, spec in MODEL_PAIRS.items():
        target, draft = models.pair(name)
        with torch.no_grad():
            p, q = (torch.softmax(m(contexts).logits.double(), -1) for m in (target, draft))
        assert torch.minimum(p, q).sum(-1).mean().item() == pytest.approx(spec.acceptance, abs=0.02), name
    assert {s.models for s in POSITION_STRATA} == set(MODEL_PAIRS)


def test_conditional_laws_are_the_enumerated_laws(models):
    """The teacher-forced pass gives, at every position, the law continuation_laws enumerates."""
    stratum = POSITION_STRATA[5]  # T=0.8, top-k 5, top-p 0.9
    laws = continuation_laws(models.pair(stratum.models)[0], stratum.prompt, 3, temperature=0.8, top_k=5, top_p=0.9)
    tokens = np.array([[0, 7, 3], [5, 5, 1]])
    got = models.conditional_laws(stratum, tokens)
    for row, (a, b, _) in enumerate(tokens):
        np.testing.assert_allclose(got[row], np.stack([laws[0], laws[1][a], laws[2][a, b]]), atol=1e-6)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-12)


def test_pit_values_and_block_counts(position_check):
    laws = np.array([[[0.5, 0.25, 0.25, 0, 0, 0, 0, 0]] * 3])
    values = token_pit_values(laws, np.array([[1, 3, 0]]), np.array([[0.5, 0.5, 0.2]]))
    assert values[0, 0] == pytest.approx(0.625) and math.isnan(values[0, 1]) and values[0, 2] == pytest.approx(0.1)
    counts = position_check.empty_counts()[0]
    row = np.full((1, CONTINUATION_LENGTH), 0.1)
    row[0, :3] = values[0]
    position_check.count(counts, row)
    lag_1, lag_2 = PIT_LAGS.index(1), PIT_LAGS.index(2)
    assert counts[lag_1, 0, 0, 2] == 1  # u = 0.625: bin 2, first position's block
    assert counts[lag_1, 1, 2, PIT_BINS] == 1  # probability 0, after bin 2
    assert counts[lag_1, 2, 0, 0] == 1  # after an impossible token the block is bin 0
    assert counts[lag_2, 2, 2, 0] == 1  # two back: bin 2
    assert counts[lag_2, 1, 0, PIT_BINS] == 1  # position 2 has no token two back: bin 0
    assert (counts.sum((1, 2, 3)) == CONTINUATION_LENGTH).all()


def test_greedy_cases_are_far_from_ties(models):
    """The identity check compares argmaxes computed with and without a KV cache; a top-2 logit gap
    far above float32 rounding (~1e-6) makes it exact."""
    assert min(models.greedy(case, CONTINUATION_LENGTH)[1] for case in GREEDY_CASES) > 1e-2


@pytest.mark.parametrize("budget", sorted(DECODER_BUDGETS))
def test_position_check_is_sized_for_the_budget(position_check, budget):
    """n calls give n·L tokens, and n is the smallest with 4 n L ε² at the χ² noncentrality of the
    lag-1 test's dof at level α / Λ: the planned n detects ε, n − 1 does not."""
    epsilon, alpha = DECODER_BUDGETS[budget], final_look_alpha(ALPHA)
    n = position_check.required_samples(epsilon, alpha=alpha, power=0.99)
    assert position_check.detectable_tv(n, alpha=alpha, power=0.99) <= epsilon
    assert position_check.detectable_tv(n - 1, alpha=alpha, power=0.99) > epsilon
    assert stats.power_at(n * CONTINUATION_LENGTH, epsilon, alpha=alpha / len(PIT_LAGS),
                          num_cells=position_check.num_cells) >= 0.99
    assert position_check.num_cells - 1 == 8 * (1 + 15 * 4) * 3


def test_plans_state_their_calls(position_check):
    """The calls of the position-law check that the battery's docstring and docs/budgets.md state
    (α = 1e-3, its final look's level)."""
    calls = {budget: position_check.required_samples(epsilon, alpha=final_look_alpha(ALPHA), power=0.99)
             for budget, epsilon in DECODER_BUDGETS.items()}
    assert calls == {"quick": 2182, "standard": 13637, "thorough": 54545}


def test_named_budgets_resolve_to_decoder_targets():
    assert resolve_decoder_budget("quick").epsilon == DECODER_BUDGETS["quick"] == 0.05
    assert resolve_decoder_budget("Standard").epsilon == DECODER_BUDGETS["standard"] == 0.02
    assert resolve_decoder_budget(300).samples == 300
    with pytest.raises(ValueError, match="budget"):
        resolve_decoder_budget("huge")


# --------------------------------------------------------------------------------------------
# The position-law check on batched samplers: level and power on thousands of calls
# --------------------------------------------------------------------------------------------


def sample_batch(models, stratum: Stratum, uniforms: np.ndarray, setting: Setting | None = None) -> np.ndarray:
    """Continuations ``[N, L]`` drawn by inverse CDF with ``uniforms [N, L]`` from the stratum's
    target at ``setting`` (default: the stratum's own; one teacher-forced pass per position)."""
    sampling = dataclasses.replace(stratum, setting=setting or stratum.setting)
    tokens = np.zeros(uniforms.shape, dtype=np.int64)
    for t in range(uniforms.shape[1]):
        law = models.conditional_laws(sampling, tokens)[:, t]
        tokens[:, t] = np.minimum((np.cumsum(law, -1) <= uniforms[:, t:t + 1]).sum(-1), law.shape[-1] - 1)
    return tokens


def sampled_tally(check: PositionLawCheck, n: int, seed: int, *, reuse: str | None = None,
                  setting_of=lambda stratum: None) -> Tally:
    """The check's counts for n calls split evenly over its strata, sampled in batches.  ``reuse``
    plants a randomness bug: ``"every-4"`` reuses the first 4 uniforms in every run of 4 positions
    (a generator replayed at each step of a decoder emitting 4 tokens a step), ``"antithetic"``
    uses 1 − u of the previous position at every second position."""
    rng = np.random.default_rng(seed)
    counts = check.empty_counts()
    per_stratum = n // len(check.strata)
    for s, stratum in enumerate(check.strata):
        u = rng.random((per_stratum, check.length))
        if reuse == "every-4":
            u = np.tile(u[:, :4], (1, check.length // 4))
        elif reuse == "antithetic":
            u[:, 1::2] = 1.0 - u[:, 0::2]
        tokens = sample_batch(check.models, stratum, u, setting_of(stratum))
        values = token_pit_values(check.models.conditional_laws(stratum, tokens), tokens, rng.random(tokens.shape))
        check.count(counts[s], values)
    return Tally(per_stratum * len(check.strata), {"blocks": counts})


def judge_at(check: PositionLawCheck, tally: Tally, level: float):
    return check.judge(Plan(tally.n, tally.n, level, None, 0), tally, level, None)


@pytest.mark.statistical
def test_position_check_holds_its_level_on_exact_samples(position_check):
    """Exact target sampling, 24 replicates of 400 calls at level 0.05: the number of rejections is
    Binomial(24, ≤ 0.05) under the asymptotic χ² (P(≥ 6) ≤ 0.0066), so ≥ 6 means a miscalibrated test.
    The p-values are also not piled at 1 (a check that cannot fail): at least 4 are below 0.5."""
    pvalues = [judge_at(position_check, sampled_tally(position_check, 400, derive_seed("level", r)), 0.05).pvalue
               for r in range(24)]
    assert sum(p <= 0.05 for p in pvalues) < 6, pvalues
    assert sum(p < 0.5 for p in pvalues) >= 4, pvalues


def _temperature_one(stratum: Stratum) -> Setting:
    return dataclasses.replace(stratum.setting, temperature=1.0)


@pytest.mark.statistical
@pytest.mark.parametrize(("reuse", "setting_of", "n"), [
    ("every-4", lambda s: None, 400),
    ("antithetic", lambda s: None, 400),
    (None, _temperature_one, 800),
], ids=["uniforms-replayed-each-step", "uniforms-correlated", "temperature-ignored"])
def test_position_check_catches_planted_losses(position_check, reuse, setting_of, n):
    """Randomness replayed every 4 tokens or anti-correlated between positions (marginally exact:
    only the blocks by the PIT value 4 or 1 positions back see it), and sampling at T = 1 in the 5
    strata at T ≠ 1: each fails at α = 1e-3 on n calls."""
    result = judge_at(position_check, sampled_tally(position_check, n, derive_seed("power", n), reuse=reuse,
                                                    setting_of=setting_of), ALPHA)
    assert result.verdict == "fail", result.message


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
def test_exact_sampler_passes_in_process_and_in_a_worker():
    """Every check, through the in-process call and through the worker (which builds the five
    model pairs itself): a correct decoder passes (a fixed budget, below the power ceiling)."""
    for isolation in ("none", "process"):
        report = audit_table(TableDecoder(), budget=40, isolation=isolation)
        assert report.exit_code == EXIT_PASS, report.explain()


def test_exact_sampler_report_is_deterministic():
    def strip(report):
        return [dataclasses.replace(c, seconds=0.0) for c in report.checks]

    first, second = (audit_table(TableDecoder(), checks=["position-laws"], isolation="none") for _ in range(2))
    assert strip(first) == strip(second)


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("decoder", "failing"),
    [
        (IgnoresFilters(), {"position-laws"}),
        (UsesGlobalRng(), {"determinism"}),
        (IgnoresSeed(), {"seed-sensitivity"}),
        (GreedyFromDraft(), {"greedy-identity"}),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, TableDecoder) else None,
)
def test_planted_bugs_are_caught_by_their_check(decoder, failing):
    report = audit_table(decoder, fail_fast=False, isolation="none")  # every check, to see each that fails
    assert report.exit_code == EXIT_FAIL, report.explain()
    assert failing <= {name for name, verdict in verdicts(report).items() if verdict == "fail"}, report.explain()


def test_filtered_token_is_a_certain_loss():
    report = audit_table(IgnoresFilters(), checks=["position-laws"], isolation="none")
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
    report = audit_table(decoder, timeout_s=0.3 if isinstance(decoder, Hangs) else 30.0, allow_underpowered=False)
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
    report = audit_table(decoder, isolation="none")
    assert verdicts(report)[check] == "fail"
    assert report.exit_code == EXIT_FAIL


def test_audit_decoder_helper_and_unknown_builtin():
    report = audit_decoder(TableDecoder(), budget=20, checks=["greedy-identity", "position-laws"],
                           allow_underpowered=True, isolation="none")
    assert report.settings.level == "decoder" and report.exit_code == EXIT_PASS, report.explain()
    assert [c.name for c in report.checks] == ["greedy-identity", "position-laws"]
    unknown = audit("no-such-decoder", level="decoder")
    assert unknown.exit_code == EXIT_ERROR and "no-such-decoder" in unknown.summary


# --------------------------------------------------------------------------------------------
# Real decoders: the reference, other drafters, and the decoder catalog
# --------------------------------------------------------------------------------------------


def generate_prompt_lookup(target, draft, input_ids, **settings):
    return reference.decoder.generate(target, None, input_ids, **settings)


def generate_early_exit(target, draft, input_ids, **settings):
    return reference.decoder.generate(target, EarlyExitDrafter(target, 1), input_ids, **settings)


@pytest.mark.statistical
def test_reference_decoder_passes():
    """The correct reference decoder passes every check, in its worker (a fixed budget of 20 calls
    keeps this short; ``quick`` runs in the slow tests below)."""
    report = audit("reference", level="decoder", budget=20, allow_underpowered=True)
    assert report.exit_code == EXIT_PASS, report.explain()


@pytest.mark.parametrize("name", sorted(DECODER_CATALOG))
def test_catalog_entry_is_greedy_exact_and_changes_the_sampled_tokens(models, name):
    """Each entry is a bug of the sampled path: at temperature 0 it is the reference token for token;
    at T = 0.7 with top-k 4 (close draft, so full acceptances and two steps occur) some seed of 4 makes
    it differ from the reference."""
    entry = DECODER_CATALOG[name]
    greedy = GREEDY_CASES[0]
    target, draft = models.pair(greedy.models)
    settings = {"max_new_tokens": CONTINUATION_LENGTH, "temperature": 0.0, "top_k": None, "top_p": None}
    prompt = torch.tensor([greedy.prompt])
    assert torch.equal(entry.fn(target, draft, prompt, seed=0, **settings),
                       reference.decoder.generate(target, draft, prompt, seed=0, **settings))
    stratum = POSITION_STRATA[7]
    target, draft = models.pair(stratum.models)
    settings = {"max_new_tokens": CONTINUATION_LENGTH, "temperature": 0.7, "top_k": 4, "top_p": None}
    prompt = torch.tensor([stratum.prompt])
    assert any(not torch.equal(entry.fn(target, draft, prompt, seed=seed, **settings),
                               reference.decoder.generate(target, draft, prompt, seed=seed, **settings))
               for seed in range(4))


def killed_at_quick(name: str):
    """The entry's parameter: an xfail where its ε̄ (``tv``) is below quick's, so quick has no power
    against it."""
    tv = DECODER_CATALOG[name].tv
    if tv is None or tv >= DECODER_BUDGETS["quick"]:
        return name
    return pytest.param(name, marks=pytest.mark.xfail(
        reason=f"ε̄ {tv} < quick's {DECODER_BUDGETS['quick']}: quick's power against it is 0.002, standard's 0.79, "
               "thorough's 1.0 (benchmarks/decoder_catalog_tv.py)", strict=False))


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("name", [killed_at_quick(name) for name in sorted(DECODER_CATALOG)])
def test_catalog_entry_is_killed_at_quick(name):
    """Every entry whose ε̄ reaches quick's fails the position-law check at ``quick`` (in this
    process: the entries are importable, but the fixture-free call keeps the run short)."""
    report = audit(DECODER_CATALOG[name].fn, level="decoder", budget="quick", checks=["position-laws"],
                   isolation="none")
    assert report.exit_code == EXIT_FAIL, report.explain()


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("generate", [reference.decoder.generate, generate_prompt_lookup, generate_early_exit],
                         ids=["reference", "prompt-lookup", "early-exit"])
def test_correct_decoders_pass_quick(generate):
    report = audit(generate, level="decoder", budget="quick", isolation="none")
    assert report.exit_code == EXIT_PASS, report.explain()


@pytest.mark.slow
@pytest.mark.statistical
def test_reference_decoder_has_no_false_alarm_over_20_seeds():
    """20 quick audits of the reference with different base seeds at α = 1e-3: a false alarm in
    any has probability ≤ 0.02 (union bound), so none is expected; prints the count."""
    failures = [seed for seed in range(20)
                if audit("reference", level="decoder", budget="quick", seed=derive_seed("false-alarm", seed),
                         checks=["position-laws"]).exit_code != EXIT_PASS]
    print(f"reference decoder, quick, 20 seeds: {len(failures)} false alarm(s) {failures}")
    assert not failures
