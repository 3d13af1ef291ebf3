"""Sequence-level exactness of the reference decoder on tiny real Hugging Face models.

The models (``specverify.hf.tiny_models``: a 2-layer Llama target, a correlated 1-layer draft,
vocabulary 8) are small enough that the exact law of every 3-token continuation of a prompt can
be enumerated (512 tuples).  Each check runs the decoder on a batch of two *different* prompts
of different lengths, interleaved row by row (so rows accept different numbers of drafts per
step and share one ragged KV cache), and tests the continuations of each prompt against the
enumerated target law with the Pearson goodness-of-fit test of ``specverify.core.stats``.
A step drafts only what a row can still use (``γ_b = min(γ, r_b − 1)``, ``r_b`` its tokens left),
so with 3 tokens every setting with γ ≥ 2 drafts 2 at its first step, rows of one step have
different ``γ_b``, and the last steps draft 1 or none; 3 is not a multiple of ``γ + 1`` for
γ ∈ {1, 3, 4}.

Statistical budget (``budget.py``): every check below is one execution of the suite's family of
statistical tests and runs at ``alpha = budget.alpha_per_execution(suite alpha)`` (Bonferroni
over all executions the suite counts, slow ones included).  Sample sizes are derived from the
deviation to detect: ``sample_size_for_tv(TV, alpha=alpha, power=0.99, num_cells=support)`` with
TV = 0.08 (fast) or 0.05 (slow); each check prints its alpha and the total variation it detects
with power 0.99 on the cells it actually tested (``stats.detectable_tv``).  Seeds come from
``derive_seed`` of the check's parameters and the run's base seed.

Every check is shown to fail on a broken decoder (tests ``..._fails_...``, not budgeted: they
must reject): the known-bug catalog's "residual is target" and "bonus from draft" rules patched
into the decoder, and a drafter whose tokens are not drawn from the law it reports.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import numpy as np
import pytest
import scipy.stats
import torch

from specverify.properties import budget

pytest.importorskip("transformers", reason="the reference decoder's properties run tiny transformers "
                    "models: pip install 'specverify[hf]'")

import reference.decoder
import reference.drafters
from reference.decoder import speculative_generate
from reference.drafters import EarlyExitDrafter, ModelDrafter, PromptLookupDrafter, truncated_view
from reference.request_stats import RequestStats, StatsRecorder
from specverify.auditing.sampler.catalog import CATALOG
from specverify.core import acceptance
from specverify.core.rules import VerifyResult, rejection_sample
from specverify.core.seeding import derive_seed
from specverify.core.stats import POWER, binomial_test, detectable_tv, goodness_of_fit, sample_size_for_tv
from specverify.hf.tiny_models import continuation_distribution, continuation_laws, tiny_target_and_draft

VOCAB = 8
LENGTH = 3  # continuation length: 512 cells, and up to 3 target passes per sample
PROMPTS = ((1, 2, 3, 4, 1, 2), (5, 6))  # the first has an n-gram to look up, the second none at first
FAST_TV = 0.08
SLOW_TV = 0.05
BUG_TV = 0.15  # the broken-decoder demonstrations reject with fewer samples (power grows with n)


@dataclass(frozen=True)
class Setting:
    drafter: str  # "model", "lookup" or "early-exit"
    gamma: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    @property
    def sampling(self) -> dict:
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)


FAST_SETTINGS = (
    Setting("model", 1),
    Setting("model", 3),
    Setting("model", 2, temperature=0.7, top_k=5),
    Setting("model", 3, temperature=1.3, top_p=0.8),
    Setting("lookup", 2),
    Setting("lookup", 3, temperature=0.8, top_k=6, top_p=0.9),
    Setting("early-exit", 2),
    Setting("early-exit", 3, min_p=0.1),
)
SLOW_SETTINGS = (
    Setting("model", 4),
    Setting("model", 2, temperature=0.5),
    Setting("lookup", 1, temperature=1.2),
    Setting("early-exit", 1, top_k=3),
)
TOKENS_PER_PASS_SETTINGS = (Setting("model", 3), Setting("early-exit", 3, temperature=0.8, top_k=6))

# Executions per test function, as counted in budget.STATISTICAL_TESTS: one goodness-of-fit check
# per prompt and setting; per tokens-per-pass setting one z-test plus one binomial test per position.
EXECUTIONS = {
    "test_continuations_follow_the_target_law": len(PROMPTS) * len(FAST_SETTINGS),
    "test_continuations_follow_the_target_law_closely": len(PROMPTS) * len(SLOW_SETTINGS),
    "test_tokens_per_pass_match_the_exact_expectation": sum(1 + s.gamma for s in TOKENS_PER_PASS_SETTINGS),
}


@pytest.fixture(scope="module")
def alpha(specverify_suite_alpha) -> float:
    """The level of each check: the suite's alpha split over every statistical execution."""
    return budget.alpha_per_execution(specverify_suite_alpha)


@pytest.fixture(scope="module")
def models():
    return tiny_target_and_draft(vocab_size=VOCAB, seed=0)


def make_drafter(name: str, target, draft):
    if name == "model":
        return ModelDrafter(draft)
    if name == "lookup":
        return PromptLookupDrafter()
    return EarlyExitDrafter(target, num_layers=1)


def continuation_counts(tokens: torch.Tensor) -> dict[tuple[int, ...], int]:
    """Counts of each LENGTH-token tuple among the rows of ``tokens [N, LENGTH]``."""
    codes = (tokens * VOCAB ** torch.arange(LENGTH - 1, -1, -1)).sum(1)
    counts = torch.bincount(codes, minlength=VOCAB**LENGTH).tolist()
    return dict(zip(itertools.product(range(VOCAB), repeat=LENGTH), counts))


def exactness_fits(setting: Setting, target_tv: float, alpha: float, base_seed: int, models) -> list:
    """Sample each prompt's continuations from ONE interleaved batch; goodness of fit per prompt."""
    target, draft = models
    expected = [continuation_distribution(target, prompt, LENGTH, **setting.sampling) for prompt in PROMPTS]
    support = max(sum(probability > 0 for probability in law.values()) for law in expected)
    n = sample_size_for_tv(target_tv, alpha=alpha, power=POWER, num_cells=support)
    seed = derive_seed("reference-decoder-exactness", asdict(setting), target_tv, base=base_seed)
    prompts = [torch.tensor(prompt) for prompt in PROMPTS] * n
    generation = speculative_generate(
        target, make_drafter(setting.drafter, target, draft), prompts,
        max_new_tokens=LENGTH, gamma=setting.gamma, seed=seed, **setting.sampling,
    )
    fits = []
    for index, law in enumerate(expected):
        fit = goodness_of_fit(continuation_counts(generation.tokens[index :: len(PROMPTS)]), law, seed=seed)
        tv = detectable_tv(n, alpha=alpha, power=POWER, num_cells=max(fit.dof + 1, 2))
        stats = generation.stats.pooled(slice(index, None, len(PROMPTS)))
        print(
            f"{setting} prompt {PROMPTS[index]}: Pearson {fit.statistic:.1f} on {fit.dof} dof "
            f"({len(fit.pooled_cells)} pooled groups), p-value {fit.pvalue:.4g} [{fit.method}], n={n}, "
            f"empirical TV {fit.empirical_tv:.4f}; alpha={alpha:.3g}, detects TV >= {tv:.4f} "
            f"with power {POWER}; tokens/pass {stats.tokens_per_pass:.3f}, "
            f"acceptance by position {tuple(round(a, 3) for a in stats.acceptance_by_position)}"
        )
        fits.append(fit)
    return fits


@pytest.mark.statistical
@pytest.mark.parametrize("setting", FAST_SETTINGS, ids=str)
def test_continuations_follow_the_target_law(setting, models, alpha, specverify_base_seed):
    fits = exactness_fits(setting, FAST_TV, alpha, specverify_base_seed, models)
    assert all(fit.pvalue > alpha for fit in fits), [fit.pvalue for fit in fits]


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("setting", SLOW_SETTINGS, ids=str)
def test_continuations_follow_the_target_law_closely(setting, models, alpha, specverify_base_seed):
    fits = exactness_fits(setting, SLOW_TV, alpha, specverify_base_seed, models)
    assert all(fit.pvalue > alpha for fit in fits), [fit.pvalue for fit in fits]


# ------------------------------------------------------------------------------------------------
# The checks above fail on broken decoders
# ------------------------------------------------------------------------------------------------


def catalog_rule_for_decoder(name: str):
    """A catalog entry (SPEC §1 signature: every row has K drafts) in the shape the decoder calls
    ``rejection_sample``: the rows with ``n ≥ 1`` drafts go through the entry with their first n
    columns and their uniforms in the rules' convention (columns ``0..n-1`` and ``K``); rows with no
    draft (their remaining tokens allow none) take the correct rule, a plain draw from ``p_0``."""
    buggy = CATALOG[name].fn

    def rule(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None, num_draft=None):
        result = rejection_sample(target_probs, draft_probs, draft_tokens, uniforms=uniforms, num_draft=num_draft)
        emitted = result.emitted.clone()
        width = draft_tokens.shape[1]
        for n in set(num_draft.tolist()) - {0}:
            rows = num_draft == n
            columns = list(range(n)) + [width]
            step = buggy(target_probs[rows][:, : n + 1], draft_probs[rows][:, :n], draft_tokens[rows][:, :n],
                         uniforms=uniforms[rows][:, columns])
            emitted[rows] = torch.cat([step, step.new_full((step.shape[0], width - n), -1)], 1)
        return VerifyResult(emitted, (emitted >= 0).sum(1) - 1)

    return rule


def flattened_sample_from(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draws from sqrt(q) renormalised while the decoder is told q: a draft-law mismatch."""
    flat = probs.sqrt()
    return torch.multinomial(flat / flat.sum(-1, keepdim=True), 1, generator=generator).squeeze(1)


@pytest.mark.parametrize("bug", ["residual_is_target", "bonus_from_draft", "draft_not_drawn_from_q"])
def test_exactness_check_fails_on_a_broken_decoder(bug, models, alpha, specverify_base_seed, monkeypatch):
    if bug == "draft_not_drawn_from_q":
        monkeypatch.setattr(reference.drafters, "sample_from", flattened_sample_from)
    else:
        monkeypatch.setattr(reference.decoder, "rejection_sample", catalog_rule_for_decoder(bug))
    setting = Setting("model", 1 if bug == "bonus_from_draft" else 2)
    fits = exactness_fits(setting, BUG_TV, alpha, specverify_base_seed, models)
    assert any(fit.pvalue <= alpha for fit in fits), [fit.pvalue for fit in fits]


# ------------------------------------------------------------------------------------------------
# Tokens per target pass against the exact expectation 1 + Σ_j Π_{i<=j} α_i
# ------------------------------------------------------------------------------------------------


def first_pass_acceptance(target, drafter_model, prompt, setting: Setting) -> tuple[float, ...]:
    """Exact α_j of the first pass from ``prompt``: P(drafts 1..j accepted) / P(drafts 1..j-1 accepted).

    Draft ``x_i`` is drawn from ``q_i`` and accepted with probability ``min(1, p_i/q_i)``, so
    ``P(drafts 1..j accepted) = Σ_{x_1..x_j} Π_{i<=j} min(p_i(x_i), q_i(x_i))`` over all draft paths
    (each law conditioned on the path's earlier tokens), enumerated from the models' exact laws.
    """
    p_laws = continuation_laws(target, prompt, setting.gamma, **setting.sampling)
    q_laws = continuation_laws(drafter_model, prompt, setting.gamma, **setting.sampling)
    reach, all_accepted = np.ones(()), [1.0]
    for p_law, q_law in zip(p_laws, q_laws):
        reach = reach[..., None] * np.minimum(p_law, q_law)
        all_accepted.append(float(reach.sum()))
    return tuple(all_accepted[j] / all_accepted[j - 1] for j in range(1, setting.gamma + 1))


class FirstPassDrafter:
    """A drafter that records what the decoder accepted at its first step (``num_accepted [B]``)."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter
        self.first_accepted: torch.Tensor | None = None
        self.first_num_draft: torch.Tensor | None = None

    def check_target(self, target) -> None:
        self.drafter.check_target(target)

    def start(self, sequences) -> None:
        self.drafter.start(sequences)

    def propose(self, sequences, gammas, params, generators):
        draft = self.drafter.propose(sequences, gammas, params, generators)
        if self.first_num_draft is None:
            self.first_num_draft = draft.num_draft.clone()
        return draft

    def accepted(self, num_accepted: torch.Tensor) -> None:
        if self.first_accepted is None:
            self.first_accepted = num_accepted.clone()
        self.drafter.accepted(num_accepted)


def first_pass_run(setting: Setting, models, base_seed: int, n: int) -> RequestStats:
    """The statistics of the first target pass of n rows of the same prompt.  Each row asks for
    γ + 1 tokens, so its first step drafts all γ (a step drafts only the tokens a row can still
    use); the later steps are not counted."""
    target, draft = models
    seed = derive_seed("reference-decoder-tokens-per-pass", asdict(setting), n, base=base_seed)
    drafter = FirstPassDrafter(make_drafter(setting.drafter, target, draft))
    speculative_generate(
        target, drafter, [torch.tensor(PROMPTS[0])] * n,
        max_new_tokens=setting.gamma + 1, gamma=setting.gamma, seed=seed, **setting.sampling,
    )
    first_num_draft, first_accepted = drafter.first_num_draft, drafter.first_accepted
    assert first_num_draft is not None and first_accepted is not None
    assert bool((first_num_draft == setting.gamma).all())
    recorder = StatsRecorder(n, setting.gamma, torch.device("cpu"))
    recorder.record_pass(torch.ones(n, dtype=torch.bool), first_num_draft, first_accepted, 0.0, 0.0)
    return recorder.finish().pooled()


TOKENS_PER_PASS_SAMPLES = 20_000


def tokens_per_pass_checks(setting: Setting, models, alpha: float, base_seed: int):
    """(measured mean, exact mean, tolerance, per-position binomial results, pooled stats) for one
    setting: the tolerance is the two-sided z-test's half-width z·σ/√n, with σ² the exact variance
    of the tokens per pass."""
    target, draft = models
    drafter_model = draft if setting.drafter == "model" else truncated_view(target, 1)
    alphas = first_pass_acceptance(target, drafter_model, PROMPTS[0], setting)
    expected = acceptance.expected_tokens_per_step(alphas)
    # accepted count a: P(a >= j) = Π_{i<=j} α_i, so E[a^2] = Σ_j (2j - 1) P(a >= j)
    tail = np.cumprod(alphas)
    variance = float(((2 * np.arange(1, setting.gamma + 1) - 1) * tail).sum() - tail.sum() ** 2)
    z_critical = float(scipy.stats.norm.isf(alpha / 2))  # two-sided z-test at alpha
    tolerance = z_critical * (variance / TOKENS_PER_PASS_SAMPLES) ** 0.5
    stats = first_pass_run(setting, models, base_seed, TOKENS_PER_PASS_SAMPLES)
    positions = [
        binomial_test(accepted, verified, alpha, alternative="two-sided")
        for accepted, verified, alpha in zip(stats.accepted_by_position, stats.verified_by_position, alphas)
        if verified > 0
    ]
    print(
        f"{setting}: tokens/pass measured {stats.tokens_per_pass:.4f}, exact 1 + Σ Π α = {expected:.4f} "
        f"± {tolerance:.4f} (z-test at alpha={alpha:.3g}, n={TOKENS_PER_PASS_SAMPLES}); "
        f"α exact {tuple(round(a, 4) for a in alphas)}, measured "
        f"{tuple(round(a, 4) for a in stats.acceptance_by_position)}; "
        f"1 + Σ Π α̂ = {stats.predicted_tokens_per_pass:.4f}"
    )
    return stats.tokens_per_pass, expected, tolerance, positions, stats


@pytest.mark.statistical
@pytest.mark.parametrize("setting", TOKENS_PER_PASS_SETTINGS, ids=str)
def test_tokens_per_pass_match_the_exact_expectation(setting, models, alpha, specverify_base_seed):
    measured, expected, tolerance, positions, stats = tokens_per_pass_checks(setting, models, alpha,
                                                                             specverify_base_seed)
    assert abs(measured - expected) <= tolerance
    assert all(result.pvalue > alpha for result in positions), [str(r) for r in positions]
    # the position-dependent formula evaluated at the measured rates is the measured mean (bookkeeping)
    assert stats.predicted_tokens_per_pass == pytest.approx(measured, rel=1e-12)


def test_tokens_per_pass_check_fails_when_drafts_are_not_drawn_from_q(models, alpha, specverify_base_seed, monkeypatch):
    monkeypatch.setattr(reference.drafters, "sample_from", flattened_sample_from)
    measured, expected, tolerance, positions, _ = tokens_per_pass_checks(
        TOKENS_PER_PASS_SETTINGS[0], models, alpha, specverify_base_seed
    )
    assert abs(measured - expected) > tolerance or any(result.pvalue <= alpha for result in positions)


def test_predicted_tokens_per_pass_is_the_measured_mean_over_whole_runs(models, specverify_base_seed):
    """Bookkeeping of the statistics the decoder records over multi-pass runs (exact, no sampling
    tolerance): every pass emits its accepted drafts plus one token, so tokens per pass is
    ``1 + Σ_j accepted_j / passes``.  1 + Σ_j Π_{i<=j} α̂_j (α̂ measured per position) equals it when
    every pass drafts γ (the per-position counts telescope; exact on first passes, see
    :func:`first_pass_run`), but a request's last passes draft only the tokens it still needs
    (``min(γ, remaining − 1)``) and verify fewer positions, so over whole runs it can only be
    larger: ``verified_1 <= passes`` and ``verified_j <= accepted_{j-1}``."""
    target, draft = models
    seed = derive_seed("reference-decoder-stats-identity", base=specverify_base_seed)
    generation = speculative_generate(
        target, ModelDrafter(draft), [torch.tensor(p) for p in PROMPTS] * 200, max_new_tokens=12, gamma=3, seed=seed
    )
    pooled = generation.stats.pooled()
    assert pooled.emitted_tokens == pooled.target_passes + sum(pooled.accepted_by_position)
    assert pooled.predicted_tokens_per_pass >= pooled.tokens_per_pass
    assert pooled.target_passes == int(generation.stats.target_passes.sum())
    assert pooled.emitted_tokens >= 12 * len(generation.tokens)


def test_budget_counts_every_check_of_this_file():
    """budget.STATISTICAL_TESTS must count this file's executions, or the suite's alpha is overspent."""
    for name, executions in EXECUTIONS.items():
        assert budget.examples(name) == executions, name
