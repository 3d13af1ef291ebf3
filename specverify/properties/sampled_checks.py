"""The property suite's sampled checks, run on the library's harness.

Every check drives the implementation under test (``--specverify-impl``) through the SPEC §1 signature
only, ``impl(target_probs, draft_probs, draft_tokens, generator)``, with the sampler harness of
:mod:`specverify.testing.harness`: it proposes drafts from the draft law along each row's path of
a bank of toy chains (:mod:`specverify.core.chains`), reads the target law along the same path,
calls the implementation on large float32 batches, validates every output with
:func:`specverify.auditing.isolation.faults.validate_emitted`, completes what it emitted by target sampling
(:func:`~specverify.testing.harness.sample_steps`) or runs whole decoding loops
(:func:`~specverify.testing.harness.sample_runs`), and compares the counts with the exact target
laws of the harness (:func:`~specverify.testing.harness.positional_window_law`,
:func:`~specverify.testing.harness.markov_prefix_law`).  There is no second sampler here: the
harness itself is checked against exact enumeration in ``tests/testing/test_harness.py``.

Completion (Leviathan et al. 2023, Theorem 1 applied step by step): a step is lossless iff the
tokens it emits, continued by ancestral sampling from the target up to ``K+1`` tokens, are
distributed as ``K+1`` tokens of target sampling.  The single-step checks therefore test the law
of a window of positions of the *completed* step; the loop check tests the first ``L`` tokens of
whole decoding runs directly.

Statistics (see ``budget.py``): each run is one test at level ``α`` with the ``n`` that detects a
TV deviation of ``budget.DETECTABLE_TV`` on the tested cells with probability ``budget.POWER``;
p-values from :mod:`specverify.core.stats` (Pearson with cells pooled by expected counts; exact
binomial for the acceptance rate).  Seeds are ``derive_seed`` of the check's name, the case and the
run's base seed.

The check runners, the fixed probe cases (:func:`probe_cases`) and :func:`all_checks` are used by
``test_statistical`` (Hypothesis-drawn cases), the catalog self-test and the calibration;
:func:`step_rule_law` and friends give the exact tested law of a rule that takes ``uniforms=``.
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specverify.auditing.isolation.faults import validate_emitted
from specverify.core import exact, stats
from specverify.core.chains import MarkovBank, MarkovChain, PositionalBank, PositionalChain
from specverify.core.seeding import derive_seed
from specverify.core.stats import monte_carlo_draws
from specverify.properties import budget
from specverify.testing.harness import (
    Proposal,
    StepSample,
    markov_prefix_law,
    positional_window_law,
    sample_runs,
    sample_steps,
)

Impl = Callable[..., Any]

CHUNK_ROWS = 16384
"""Rows per call of the implementation (fewer for large inputs, see ``harness.rows_per_call``)."""


# --------------------------------------------------------------------------------------------
# Calling the implementation
# --------------------------------------------------------------------------------------------


def call_impl(
    impl: Impl, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``impl(target_probs, draft_probs, draft_tokens, generator)`` (SPEC §1 signature only); the
    output validated by :func:`specverify.auditing.isolation.faults.validate_emitted`, which raises ``Fault``
    naming the first malformed row.  Returns ``(emitted [B, K+1], lengths [B])`` on the CPU."""
    result = impl(target_probs, draft_probs, draft_tokens, generator)
    return validate_emitted(result, draft_tokens, target_probs.shape[-1])


class DirectCall:
    """The harness's function interface (:class:`~specverify.testing.harness.ProposalFunction`:
    ``generator(seed)`` and a call on a :class:`~specverify.testing.harness.Proposal`) calling the
    implementation in-process, without deadline or copies: the property suite tests trusted code,
    and a crash or a malformed output fails the test that caused it."""

    def __init__(self, impl: Impl) -> None:
        self.impl = impl

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    def __call__(self, proposal: Proposal, generator: torch.Generator, *,
                 where: str) -> tuple[torch.Tensor, torch.Tensor]:
        return call_impl(self.impl, *proposal, generator)

    def call_each(self, items: Iterable[tuple[Any, Proposal]], generator: torch.Generator, *,
                  where: str) -> Iterator[tuple[Any, torch.Tensor, torch.Tensor]]:
        for tag, proposal in items:
            yield (tag, *self(proposal, generator, where=where))


def _array_key(*arrays: np.ndarray) -> str:
    digest = hashlib.blake2b(digest_size=12)
    for array in arrays:
        digest.update(np.ascontiguousarray(array, dtype=np.float64).tobytes())
        digest.update(str(array.shape).encode())
    return digest.hexdigest()


def law_array(law: dict[tuple[int, ...], float], vocab_size: int, width: int) -> np.ndarray:
    """A ``specverify.core.exact`` law over ``width``-tuples as a flat array, first token most significant."""
    array = np.zeros(vocab_size**width)
    for tokens, prob in law.items():
        cell = 0
        for token in tokens:
            cell = cell * vocab_size + token
        array[cell] += prob
    return array


def total_variation(law_a: np.ndarray, law_b: np.ndarray) -> float:
    """``½ Σ |a − b|`` of two laws given as arrays over the same cells."""
    return 0.5 * float(np.abs(law_a - law_b).sum())


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StepCase:
    """One verification step for ``R`` context-free requests (:class:`PositionalChain`, equal ``K``
    and ``V``).  Row ``b`` of every batch belongs to chain ``b mod R`` (rows of different requests
    interleaved); the check tests, per chain, the joint law of the completed tokens at
    ``positions``, consecutive positions within ``0..K`` (the harness's window)."""

    chains: tuple[PositionalChain, ...]
    positions: tuple[int, ...]
    bank: PositionalBank = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bank", PositionalBank.of(self.chains))
        first = self.positions[0] if self.positions else -1
        if not (0 <= first and self.positions == tuple(range(first, first + len(self.positions)))
                and self.positions[-1] <= self.num_draft):
            raise ValueError(f"positions: expected consecutive positions within 0..K = 0..{self.num_draft}, "
                             f"got {self.positions}")

    @property
    def num_draft(self) -> int:
        return self.chains[0].num_draft

    @property
    def vocab_size(self) -> int:
        return self.chains[0].vocab_size

    @property
    def window(self) -> tuple[int, int]:
        return self.positions[0], len(self.positions)

    @property
    def num_cells(self) -> int:
        return self.vocab_size ** len(self.positions)

    def key(self) -> str:
        return _array_key(*(array for chain in self.chains for array in (chain.p, chain.q)), np.array(self.positions))

    def __repr__(self) -> str:
        return f"StepCase(R={len(self.chains)}, K={self.num_draft}, V={self.vocab_size}, positions={self.positions})"


@dataclass(frozen=True, eq=False)
class LoopCase:
    """Whole decoding runs on a :class:`MarkovChain` with ``K = num_draft`` drafts per step; the check
    tests the joint law of the first ``length`` generated tokens."""

    chain: MarkovChain
    num_draft: int
    length: int
    bank: MarkovBank = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bank", MarkovBank.of([self.chain]))

    @property
    def vocab_size(self) -> int:
        return self.chain.vocab_size

    @property
    def num_cells(self) -> int:
        return self.vocab_size**self.length

    def key(self) -> str:
        chain = self.chain
        return _array_key(chain.target_table, chain.draft_table, np.array(chain.prompt + (self.num_draft, self.length)))

    def __repr__(self) -> str:
        return f"LoopCase(V={self.vocab_size}, order={self.chain.order}, K={self.num_draft}, L={self.length})"


# --------------------------------------------------------------------------------------------
# Sampling through the harness, and the target laws
# --------------------------------------------------------------------------------------------


def sample_step(impl: Impl, case: StepCase, n: int, seed: int) -> StepSample:
    """Run ``n`` single steps per chain (``R·n`` rows, row ``b`` of chain ``b mod R``) through
    :func:`~specverify.testing.harness.sample_steps`, collecting the completed tokens at the
    tested positions.  Two streams: the harness's generator (drafts ``x_i ~ q_i``, completion
    ``~ p_j``) and the implementation's generator, both seeded from ``seed``."""
    num_chains = len(case.chains)
    return sample_steps(DirectCall(impl), case.bank, num_draft=case.num_draft, window=case.window, n=num_chains * n,
                        batch_rows=CHUNK_ROWS, harness_seed=derive_seed("harness", seed), function_seed=seed,
                        where=repr(case), chains=torch.arange(num_chains * n) % num_chains)


def cell_counts(case: StepCase, sample: StepSample) -> np.ndarray:
    """int64 ``[R, cells]``: per chain, the counts of the tested cells (base-``V`` digits of the
    window, first position most significant)."""
    weights = case.vocab_size ** torch.arange(case.window[1] - 1, -1, -1)
    cells = sample.chain * case.num_cells + (sample.window * weights).sum(dim=1)
    return torch.bincount(cells, minlength=len(case.chains) * case.num_cells).reshape(-1, case.num_cells).numpy()


def sample_loop(impl: Impl, case: LoopCase, n: int, seed: int) -> np.ndarray:
    """Run ``n`` whole decoding loops with K = ``num_draft`` drafts per call until each has ``L``
    tokens; return the counts of the first ``L`` tokens ``[V**L]``."""
    run = sample_runs(DirectCall(impl), case.bank, length=case.length, draft_schedule=(case.num_draft,), n=n,
                      batch_rows=CHUNK_ROWS, harness_seed=derive_seed("harness", seed), function_seed=seed,
                      where=repr(case))
    weights = case.vocab_size ** torch.arange(case.length - 1, -1, -1)
    return torch.bincount((run.tokens * weights).sum(dim=1), minlength=case.num_cells).numpy()


def step_target_law(case: StepCase, chain_index: int) -> np.ndarray:
    """Target law of the tested cells: ``Π_{j in positions} p_j`` (tokens of a context-free step are
    independent under target sampling)."""
    identity = np.tile(np.arange(case.vocab_size), (len(case.positions), 1))
    return positional_window_law(case.bank, chain_index, case.window, identity, case.vocab_size)


def loop_target_law(case: LoopCase) -> np.ndarray:
    """Target law of the first ``L`` tokens: ``Π_t p(y_t | prompt, y_<t)`` by enumeration."""
    return markov_prefix_law(case.bank, 0, case.length)


# --------------------------------------------------------------------------------------------
# Exact laws of a rule that accepts `uniforms=`
# --------------------------------------------------------------------------------------------


def with_fixed_companions(rule: Impl, case: StepCase, chain_index: int) -> Impl:
    """``rule`` evaluated in batches where each evaluated row sits in slot ``chain_index`` of a group
    of ``R`` rows; the other slots hold the other chains' requests with fixed drafts (``argmax q_i``)
    and fixed uniforms (``0.5``).  The exact law of the evaluated slot is then its law conditional
    on its companions, which for a rule with independent rows is the rule's single-row law."""
    num_chains, num_draft, vocab = len(case.chains), case.num_draft, case.vocab_size
    p = torch.from_numpy(np.stack([chain.p for chain in case.chains]))
    q = torch.from_numpy(np.stack([chain.q for chain in case.chains]))
    tokens = q.argmax(-1)

    def rule_in_batch(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
        rows = target_probs.shape[0]
        group_p, group_q = p.repeat(rows, 1, 1, 1), q.repeat(rows, 1, 1, 1)
        group_tokens, group_u = tokens.repeat(rows, 1, 1), torch.full((rows, num_chains, num_draft + 1), 0.5,
                                                                      dtype=torch.float64)
        group_p[:, chain_index], group_q[:, chain_index] = target_probs, draft_probs
        group_tokens[:, chain_index], group_u[:, chain_index] = draft_tokens, uniforms
        result = rule(
            group_p.reshape(-1, num_draft + 1, vocab), group_q.reshape(-1, num_draft, vocab),
            group_tokens.reshape(-1, num_draft), None, uniforms=group_u.reshape(-1, num_draft + 1),
        )
        emitted = result.emitted if hasattr(result, "emitted") else result
        return emitted.reshape(rows, num_chains, num_draft + 1)[:, chain_index]

    return rule_in_batch


def step_rule_law(case: StepCase, chain_index: int, rule: Impl) -> np.ndarray:
    """Exact law (``specverify.core.exact``) of the tested cells of chain ``chain_index`` under ``rule``,
    which takes ``uniforms=``; with ``R > 1`` chains the row is evaluated among fixed companions
    (:func:`with_fixed_companions`)."""
    chain = case.chains[chain_index]
    batched_rule = rule if len(case.chains) == 1 else with_fixed_companions(rule, case, chain_index)
    step = exact.step_distribution(batched_rule, chain, case.num_draft)
    completed = exact.completed_step_distribution(step, chain, case.num_draft)
    marginal: dict[tuple[int, ...], float] = {}
    for tokens, prob in completed.items():
        cell = tuple(tokens[j] for j in case.positions)
        marginal[cell] = marginal.get(cell, 0.0) + prob
    return law_array(marginal, case.vocab_size, len(case.positions))


def acceptance_rule_rate(case: StepCase, rule: Impl) -> float:
    """Exact probability that ``rule`` accepts at least one draft (emits ≥ 2 tokens) on chain 0."""
    step = exact.step_distribution(rule, case.chains[0], case.num_draft)
    return math.fsum(prob for tokens, prob in step.items() if len(tokens) >= 2)


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckOutcome:
    """One statistical check: its p-value against its level, and what its sample size guarantees.

    ``n`` samples per tested law on ``num_cells`` cells detect a TV deviation of ``detectable_tv``
    with probability ``budget.POWER``; ``results`` are the ``specverify.core.stats`` results (one per
    request of the batch, combined by Bonferroni: ``pvalue = min(1, R · min_r p_r)``).
    """

    check: str
    pvalue: float
    alpha: float
    n: int
    num_cells: int
    detectable_tv: float
    results: tuple[Any, ...]

    @property
    def rejected(self) -> bool:
        return self.pvalue <= self.alpha

    def __str__(self) -> str:
        verdict = "REJECTED" if self.rejected else "passed"
        details = "; ".join(str(result) for result in self.results)
        return (
            f"{self.check}: {verdict}, p-value {self.pvalue:.4g} vs alpha {self.alpha:.4g}; n={self.n} per law on "
            f"{self.num_cells} cells detects TV {self.detectable_tv:.4g} with power {budget.POWER:g} [{details}]"
        )


def run_step_check(
    impl: Impl, case: StepCase, *, alpha: float, seed: int, n: int | None = None, name: str = "step"
) -> CheckOutcome:
    """Pearson goodness of fit of each chain's completed cells against :func:`step_target_law`, each
    at level ``α/R`` (Bonferroni over the ``R`` interleaved requests)."""
    per_chain_alpha = alpha / len(case.chains)
    n = n or budget.sample_size(case.num_cells, alpha=per_chain_alpha)
    counts = cell_counts(case, sample_step(impl, case, n, seed))
    results = tuple(
        stats.goodness_of_fit(
            counts[r], step_target_law(case, r), seed=derive_seed("monte-carlo", seed, r),
            monte_carlo_draws=monte_carlo_draws(per_chain_alpha), confirm_below=per_chain_alpha,
        )
        for r in range(len(case.chains))
    )
    pvalue = min(1.0, len(results) * min(result.pvalue for result in results))
    detectable = budget.detectable_at(n, case.num_cells, alpha=per_chain_alpha)
    return CheckOutcome(name, pvalue, alpha, n, case.num_cells, detectable, results)


def run_loop_check(
    impl: Impl, case: LoopCase, *, alpha: float, seed: int, n: int | None = None, name: str = "decoding_loop_joint"
) -> CheckOutcome:
    """Pearson goodness of fit of the first ``L`` tokens of ``n`` decoding runs against
    :func:`loop_target_law`."""
    n = n or budget.sample_size(case.num_cells, alpha=alpha)
    counts = sample_loop(impl, case, n, seed)
    result = stats.goodness_of_fit(
        counts, loop_target_law(case), seed=derive_seed("monte-carlo", seed),
        monte_carlo_draws=monte_carlo_draws(alpha), confirm_below=alpha,
    )
    detectable = budget.detectable_at(n, case.num_cells, alpha=alpha)
    return CheckOutcome(name, result.pvalue, alpha, n, case.num_cells, detectable, (result,))


def run_acceptance_check(
    impl: Impl, case: StepCase, *, alpha: float, seed: int, n: int | None = None, name: str = "acceptance_rate"
) -> CheckOutcome:
    """Exact two-sided binomial test of the acceptance rate of the first draft against
    ``β = Σ_x min(p_0(x), q_0(x)) = 1 − TV(p_0, q_0)`` (Leviathan et al. 2023, §3.3).  The rate of a
    Bernoulli law is its TV distance, so ``n`` is the 2-cell sample size.  One request (``R = 1``)."""
    if len(case.chains) != 1:
        raise ValueError(f"case: the acceptance check takes one request, got R = {len(case.chains)}")
    n = n or budget.sample_size(2, alpha=alpha)
    accepted = n - int(sample_step(impl, case, n, seed).accepted[0])  # rows that emitted ≥ 2 tokens
    chain = case.chains[0]
    rate = exact.acceptance_probability(chain.p[0], chain.q[0])
    result = stats.binomial_test(accepted, n, min(1.0, rate), "two-sided")
    return CheckOutcome(name, result.pvalue, alpha, n, 2, budget.detectable_at(n, 2, alpha=alpha), (result,))


# --------------------------------------------------------------------------------------------
# Probe cases: fixed small cases where each class of bug is visible (self-test, calibration)
# --------------------------------------------------------------------------------------------

# Position 0: partial acceptance (β = 0.65), a residual on two tokens, and token 3 with p = 0 < q.
# Position 1: a different target law (β = 0.5) whose residual lives on other tokens.
# Position 2 (bonus): different from p_1 and from q_1.
MAIN_P = np.array([[0.45, 0.30, 0.25, 0.00], [0.05, 0.15, 0.50, 0.30], [0.70, 0.10, 0.10, 0.10]])
MAIN_Q = np.array([[0.15, 0.25, 0.30, 0.30], [0.40, 0.30, 0.20, 0.10]])
LOOP_TARGET = np.array([[0.6, 0.3, 0.1], [0.1, 0.5, 0.4], [0.3, 0.0, 0.7]])
LOOP_DRAFT = np.array([[0.3, 0.3, 0.4], [0.4, 0.4, 0.2], [0.2, 0.5, 0.3]])


def _long_chain(num_draft: int = 6) -> PositionalChain:
    """V = 2, partial acceptance at every position, the laws drifting with the position."""
    shift = 0.1 * np.arange(num_draft)
    p = np.stack([0.3 + shift, 0.7 - shift], axis=1)
    q = np.stack([0.6 - shift / 2, 0.4 + shift / 2], axis=1)
    return PositionalChain(np.vstack([p, [[0.95, 0.05]]]), q)


def probe_cases() -> dict[str, StepCase | LoopCase]:
    """The fixed case of every check (see the comments at :data:`MAIN_P`)."""
    main = PositionalChain(MAIN_P, MAIN_Q)
    mirrored = PositionalChain(MAIN_P[:, ::-1], MAIN_Q[:, ::-1])
    return {
        "first_token_marginal": StepCase((main,), (0,)),
        "step_joint": StepCase((main,), (0, 1, 2)),
        "bonus_position": StepCase((PositionalChain(MAIN_P, MAIN_P[:2]),), (2,)),
        "decoding_loop_joint": LoopCase(MarkovChain(LOOP_TARGET, LOOP_DRAFT, 1, (0,)), 2, 3),
        "batched_rows": StepCase((main, mirrored), (0, 1, 2)),
        "long_drafts": StepCase((_long_chain(),), tuple(range(7))),
        "acceptance_rate": StepCase((PositionalChain(MAIN_P[:2], MAIN_Q[:1]),), (0,)),
    }


MAX_EXACT_DRAFTS = 3
"""Largest K whose step law :meth:`Check.exact_deviation` integrates."""


@dataclass(frozen=True)
class Check(ABC):
    """A statistical check as the self-test and the calibration use it: its probe case, how it runs
    and is sized, and the exact deviation of its tested law under a rule that takes ``uniforms=``."""

    name: str
    case: StepCase | LoopCase

    @abstractmethod
    def __call__(self, impl: Impl, *, alpha: float, seed: int, n: int | None = None) -> CheckOutcome:
        """Run the check on ``impl`` at level ``alpha``, with ``n`` samples or its own sample size."""

    @abstractmethod
    def num_cells(self) -> int:
        """Cells of the tested law."""

    @abstractmethod
    def sample_size_for(self, tv: float, alpha: float) -> int:
        """Samples per tested law that detect a deviation ``tv`` with ``budget.POWER`` at level ``alpha``."""

    @abstractmethod
    def exact_deviation(self, rule: Impl) -> float | None:
        """TV between the tested law under ``rule`` (exactly, by ``specverify.core.exact``) and the
        target's; None where the integration is too costly."""

    def default_n(self, alpha: float) -> int:
        """The sample size the check runs with at level ``alpha`` (detects ``budget.DETECTABLE_TV``)."""
        return self.sample_size_for(budget.DETECTABLE_TV, alpha)


@dataclass(frozen=True)
class StepCheck(Check):
    """The joint law of a step's emitted tokens, per interleaved request (:func:`run_step_check`)."""

    case: StepCase

    def __call__(self, impl: Impl, *, alpha: float, seed: int, n: int | None = None) -> CheckOutcome:
        return run_step_check(impl, self.case, alpha=alpha, seed=seed, n=n, name=self.name)

    def num_cells(self) -> int:
        return self.case.num_cells

    def sample_size_for(self, tv: float, alpha: float) -> int:
        """Per request at ``alpha / R`` for the ``R`` interleaved requests."""
        return budget.sample_size(self.case.num_cells, alpha=alpha / len(self.case.chains), tv=tv)

    def exact_deviation(self, rule: Impl) -> float | None:
        """None for steps with ``K > MAX_EXACT_DRAFTS`` (integration cost grows as cells^(K+1))."""
        if self.case.num_draft > MAX_EXACT_DRAFTS:
            return None
        return max(total_variation(step_rule_law(self.case, r, rule), step_target_law(self.case, r))
                   for r in range(len(self.case.chains)))


@dataclass(frozen=True)
class LoopCheck(Check):
    """The joint law of a decoding loop's first ``L`` tokens (:func:`run_loop_check`)."""

    case: LoopCase

    def __call__(self, impl: Impl, *, alpha: float, seed: int, n: int | None = None) -> CheckOutcome:
        return run_loop_check(impl, self.case, alpha=alpha, seed=seed, n=n, name=self.name)

    def num_cells(self) -> int:
        return self.case.num_cells

    def sample_size_for(self, tv: float, alpha: float) -> int:
        return budget.sample_size(self.case.num_cells, alpha=alpha, tv=tv)

    def exact_deviation(self, rule: Impl) -> float | None:
        law = exact.sequence_distribution(rule, self.case.chain, self.case.num_draft, self.case.length)
        return total_variation(law_array(law, self.case.vocab_size, self.case.length), loop_target_law(self.case))


@dataclass(frozen=True)
class AcceptanceCheck(Check):
    """The first draft's acceptance rate against Σ min(p, q) (:func:`run_acceptance_check`): a
    Bernoulli law, whose TV is the difference of the rates, on 2 cells."""

    case: StepCase

    def __call__(self, impl: Impl, *, alpha: float, seed: int, n: int | None = None) -> CheckOutcome:
        return run_acceptance_check(impl, self.case, alpha=alpha, seed=seed, n=n, name=self.name)

    def num_cells(self) -> int:
        return 2

    def sample_size_for(self, tv: float, alpha: float) -> int:
        return budget.sample_size(2, alpha=alpha, tv=tv)

    def exact_deviation(self, rule: Impl) -> float | None:
        chain = self.case.chains[0]
        return abs(acceptance_rule_rate(self.case, rule) - exact.acceptance_probability(chain.p[0], chain.q[0]))


def all_checks() -> tuple[Check, ...]:
    """Every statistical check on its probe case (:func:`probe_cases`, in its order): the kind of
    each check is declared here, steps unless named."""
    kinds: dict[str, type[Check]] = {"decoding_loop_joint": LoopCheck, "acceptance_rate": AcceptanceCheck}
    return tuple(kinds.get(name, StepCheck)(name, case) for name, case in probe_cases().items())
