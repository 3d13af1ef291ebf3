"""Sampled statistical checks of the implementation under test (``--impl``, default the reference).

Every check drives the implementation through the SPEC §1 signature only,
``impl(target_probs, draft_probs, draft_tokens, generator)``, on inputs it builds itself from toy
language models (``specverify.core.chains``): it samples the draft tokens from the draft law along each
row's path, reads the target law along the same path, calls the implementation on large batches,
checks the output format, and compares what came out with the target's exact law.

Completion (Leviathan et al. 2023, Theorem 1 applied step by step): a step is lossless iff the
tokens it emits, continued by ancestral sampling from the target up to ``K+1`` tokens, are
distributed as ``K+1`` tokens of target sampling.  The single-step checks therefore test the law
of chosen positions of the *completed* step; the loop check tests the first ``L`` tokens of whole
decoding runs directly.

Statistics (see ``budget.py``): each Hypothesis example is one test at level
``α = α_suite / M`` with the ``n`` that detects a TV deviation of ``budget.DETECTABLE_TV`` on the
tested cells with probability ``budget.POWER``; p-values from ``specverify.core.stats`` (Pearson with
cells pooled by expected counts; exact binomial for the acceptance rate).  Seeds are
``derive_seed`` of the check's name, the drawn parameters and the run's base seed, never a
Hypothesis integer.  Sampling with a token of target probability 0 is a certain failure.

The check functions (``run_step_check``, ``run_loop_check``, ``run_acceptance_check``) and the
fixed probe cases in :data:`CHECKS` are also used by the catalog self-test and the calibration.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import budget
from specverify.core import exact, stats
from specverify.core.chains import MarkovChain, PositionalChain
from specverify.core.seeding import derive_seed
from specverify.testing.strategies import draft_target_pairs, markov_chains, positional_chains, probability_vectors

Impl = Callable[..., Any]

INPUT_DTYPE = torch.float32
"""dtype of the probabilities handed to the implementation (what engines pass)."""

CHUNK_ROWS = 16384
"""Rows per call of the implementation."""

STATISTICAL_SETTINGS = dict(
    deadline=None,
    database=None,
    # No shrinking: a search over failing examples would be a search for an unlucky draw.
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


# --------------------------------------------------------------------------------------------
# Driving the implementation
# --------------------------------------------------------------------------------------------


def sample_categorical(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of float64 ``probs [N, V]`` by inverse CDF: the first ``t`` with
    ``cumsum(p)[t] > u · sum(p)``, ``u ~ U[0, 1)``.  A token of zero mass is never drawn (the
    cumulative sum strictly increases at the drawn token)."""
    cumulative = probs.cumsum(-1)
    total = cumulative[:, -1:]
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64)
    threshold = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cumulative, threshold, right=True).squeeze(-1)


def check_emitted(result: Any, draft_tokens: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Assert that ``result`` is a SPEC §1 output for ``draft_tokens [B, K]``; return the emitted
    tokens (int64 CPU ``[B, K+1]``) and the number emitted per row ``[B]`` (``1..K+1``).

    The format law: an int64 tensor ``[B, K+1]``; per row the accepted draft tokens (equal to the
    drafts at their positions), then exactly one correction-or-bonus token, then ``-1`` padding;
    every token in ``[0, V)``.
    """
    assert isinstance(result, torch.Tensor), f"impl must return a torch.Tensor, got {type(result).__name__}"
    batch, num_draft = draft_tokens.shape
    assert tuple(result.shape) == (batch, num_draft + 1), (
        f"impl must return emitted of shape [B, K+1] = {[batch, num_draft + 1]}, got {list(result.shape)}"
    )
    assert result.dtype == torch.int64, f"impl must return int64 tokens, got {result.dtype}"
    emitted = result.detach().cpu()
    columns = torch.arange(num_draft + 1)
    present = emitted >= 0
    lengths = present.sum(-1)
    problems = {
        "a token outside [0, V) or padding other than -1": (emitted < -1) | (emitted >= vocab_size),
        "a row that emits no token": (lengths < 1)[:, None].expand_as(emitted),
        "a token after -1 padding": present != (columns < lengths[:, None]),
        "an accepted slot that differs from the draft token": (columns[:-1] < lengths[:, None] - 1)
        & (emitted[:, :-1] != draft_tokens.cpu()),
    }
    for problem, mask in problems.items():
        if bool(mask.any()):
            row = int(mask.nonzero()[0, 0])
            raise AssertionError(
                f"impl output breaks SPEC §1: {problem} (row {row}: emitted {emitted[row].tolist()}, "
                f"drafts {draft_tokens[row].tolist()})"
            )
    return emitted, lengths


def call_impl(
    impl: Impl, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``impl(target_probs, draft_probs, draft_tokens, generator)`` (SPEC §1 signature only),
    output checked by :func:`check_emitted`."""
    result = impl(target_probs, draft_probs, draft_tokens, generator)
    return check_emitted(result, draft_tokens, target_probs.shape[-1])


def encode(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Cell index of each row of ``tokens [N, W]``: base-``V`` digits, first column most significant."""
    weights = vocab_size ** torch.arange(tokens.shape[1] - 1, -1, -1, dtype=torch.int64)
    return (tokens * weights).sum(-1)


def law_array(law: dict[tuple[int, ...], float], vocab_size: int, width: int) -> np.ndarray:
    """A ``specverify.core.exact`` law over ``width``-tuples as a flat array indexed like :func:`encode`."""
    array = np.zeros(vocab_size**width)
    for tokens, prob in law.items():
        cell = 0
        for token in tokens:
            cell = cell * vocab_size + token
        array[cell] += prob
    return array


def _array_key(*arrays: np.ndarray) -> str:
    digest = hashlib.blake2b(digest_size=12)
    for array in arrays:
        digest.update(np.ascontiguousarray(array, dtype=np.float64).tobytes())
        digest.update(str(array.shape).encode())
    return digest.hexdigest()


def _monte_carlo_draws(alpha: float) -> int:
    """Monte-Carlo draws whose smallest p-value ``1/(1 + draws)`` lies below ``alpha / 2``."""
    return math.ceil(2.0 / alpha)


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StepCase:
    """One verification step for ``R`` context-free requests (:class:`PositionalChain`, equal ``K``
    and ``V``).  Row ``b`` of every batch belongs to chain ``b mod R`` (rows of different requests
    interleaved); the check tests, per chain, the joint law of the completed tokens at
    ``positions`` (a subset of ``0..K``)."""

    chains: tuple[PositionalChain, ...]
    positions: tuple[int, ...]

    def __post_init__(self) -> None:
        shapes = {(chain.num_draft, chain.vocab_size) for chain in self.chains}
        if len(shapes) != 1:
            raise ValueError(f"chains: expected equal K and V for every chain, got {sorted(shapes)}")
        if not self.positions or not all(0 <= j <= self.num_draft for j in self.positions):
            raise ValueError(f"positions: expected a non-empty subset of 0..K = 0..{self.num_draft}")

    @property
    def num_draft(self) -> int:
        return self.chains[0].num_draft

    @property
    def vocab_size(self) -> int:
        return self.chains[0].vocab_size

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
# Sampling
# --------------------------------------------------------------------------------------------


def sample_step(impl: Impl, case: StepCase, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Run ``n`` single steps per chain; return the counts of the tested cells ``[R, cells]`` and the
    number of rows per chain that accepted at least one draft ``[R]``.

    Two streams: the harness's generator (drafts ``x_i ~ q_i``, completion ``~ p_j``) and the
    implementation's generator, both seeded from ``seed``.
    """
    num_chains, num_draft, vocab = len(case.chains), case.num_draft, case.vocab_size
    p = torch.from_numpy(np.stack([chain.p for chain in case.chains]))  # [R, K+1, V]
    q = torch.from_numpy(np.stack([chain.q for chain in case.chains]))  # [R, K, V]
    harness = torch.Generator().manual_seed(derive_seed("harness", seed))
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(num_chains, case.num_cells, dtype=torch.int64)
    accepted = torch.zeros(num_chains, dtype=torch.int64)
    chunk = num_chains * max(1, CHUNK_ROWS // num_chains)
    total = num_chains * n
    for start in range(0, total, chunk):
        chain_of_row = torch.arange(min(chunk, total - start)) % num_chains
        drafts = torch.stack([sample_categorical(q[chain_of_row, i], harness) for i in range(num_draft)], dim=1)
        target_probs, draft_probs = p[chain_of_row], q[chain_of_row]
        emitted, lengths = call_impl(impl, target_probs.to(INPUT_DTYPE), draft_probs.to(INPUT_DTYPE), drafts, generator)
        completed = emitted.clone()
        for j in range(num_draft + 1):
            missing = j >= lengths
            completed[missing, j] = sample_categorical(target_probs[missing, j], harness)
        cells = encode(completed[:, list(case.positions)], vocab)
        counts += torch.bincount(chain_of_row * case.num_cells + cells, minlength=counts.numel()).reshape(counts.shape)
        accepted += torch.bincount(chain_of_row[lengths >= 2], minlength=num_chains)
    return counts.numpy(), accepted.numpy()


def sample_loop(impl: Impl, case: LoopCase, n: int, seed: int) -> np.ndarray:
    """Run ``n`` decoding loops in lockstep (row ``b`` is always request ``b``) until each has
    ``L`` tokens; return the counts of the first ``L`` tokens ``[V**L]``.

    Per step and row: drafts ``x_i ~ q(· | context, x_<i)``, target laws ``p(· | context, x_<i)``
    for ``i ≤ K``, one call for all rows, then the row's context advances by what it emitted.
    """
    chain, num_draft, length, vocab = case.chain, case.num_draft, case.length, case.vocab_size
    target_table, draft_table = torch.tensor(chain.target_table), torch.tensor(chain.draft_table)
    harness = torch.Generator().manual_seed(derive_seed("harness", seed))
    generator = torch.Generator().manual_seed(seed)

    def advance(context: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        return torch.cat([context[:, 1:], token[:, None]], dim=1) if chain.order else context

    context = torch.tensor(chain.prompt, dtype=torch.int64).repeat(n, 1).reshape(n, chain.order)
    tokens = torch.full((n, length), -1, dtype=torch.int64)
    produced = torch.zeros(n, dtype=torch.int64)
    rows = torch.arange(n)
    while bool((produced < length).any()):
        drafts, target_rows, draft_rows, path = [], [], [], context
        for _ in range(num_draft):
            state = chain.state_index(path)
            draft_rows.append(draft_table[state])
            target_rows.append(target_table[state])
            drafts.append(sample_categorical(draft_table[state], harness))
            path = advance(path, drafts[-1])
        target_rows.append(target_table[chain.state_index(path)])
        target_probs = torch.stack(target_rows, dim=1).to(INPUT_DTYPE)
        draft_probs = torch.stack(draft_rows, dim=1).to(INPUT_DTYPE)
        draft_tokens = torch.stack(drafts, dim=1)
        outputs = [
            call_impl(impl, target_probs[s:s + CHUNK_ROWS], draft_probs[s:s + CHUNK_ROWS], draft_tokens[s:s + CHUNK_ROWS], generator)
            for s in range(0, n, CHUNK_ROWS)
        ]
        emitted = torch.cat([out[0] for out in outputs])
        lengths = torch.cat([out[1] for out in outputs])
        for slot in range(num_draft + 1):
            emits = slot < lengths
            keep = emits & (produced < length)
            tokens[rows[keep], produced[keep]] = emitted[keep, slot]
            produced += keep.long()
            context = torch.where(emits[:, None], advance(context, emitted[:, slot].clamp(min=0)), context)
    return torch.bincount(encode(tokens, vocab), minlength=case.num_cells).numpy()


# --------------------------------------------------------------------------------------------
# Target laws, and exact laws of a rule that accepts `uniforms=`
# --------------------------------------------------------------------------------------------


def step_target_law(case: StepCase, chain_index: int) -> np.ndarray:
    """Target law of the tested cells: ``Π_{j in positions} p_j`` (tokens of a context-free step are
    independent under target sampling)."""
    law = np.ones(1)
    for j in case.positions:
        law = np.outer(law, case.chains[chain_index].p[j]).reshape(-1)
    return law


def loop_target_law(case: LoopCase) -> np.ndarray:
    """Target law of the first ``L`` tokens: ``Π_t p(y_t | prompt, y_<t)`` by enumeration."""
    return law_array(exact.target_sequence_distribution(case.chain, case.length), case.vocab_size, case.length)


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
        group_tokens, group_u = tokens.repeat(rows, 1, 1), torch.full((rows, num_chains, num_draft + 1), 0.5, dtype=torch.float64)
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


def total_variation(law_a: np.ndarray, law_b: np.ndarray) -> float:
    return 0.5 * float(np.abs(law_a - law_b).sum())


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
    counts, _ = sample_step(impl, case, n, seed)
    results = tuple(
        stats.goodness_of_fit(
            counts[r], step_target_law(case, r), seed=derive_seed("monte-carlo", seed, r),
            monte_carlo_draws=_monte_carlo_draws(per_chain_alpha),
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
        counts, loop_target_law(case), seed=derive_seed("monte-carlo", seed), monte_carlo_draws=_monte_carlo_draws(alpha)
    )
    detectable = budget.detectable_at(n, case.num_cells, alpha=alpha)
    return CheckOutcome(name, result.pvalue, alpha, n, case.num_cells, detectable, (result,))


def run_acceptance_check(
    impl: Impl, case: StepCase, *, alpha: float, seed: int, n: int | None = None, name: str = "acceptance_rate"
) -> CheckOutcome:
    """Exact two-sided binomial test of the acceptance rate of the first draft against
    ``β = Σ_x min(p_0(x), q_0(x)) = 1 − TV(p_0, q_0)`` (Leviathan et al. 2023, §3.3).  The rate of a
    Bernoulli law is its TV distance, so ``n`` is the 2-cell sample size."""
    n = n or budget.sample_size(2, alpha=alpha)
    _, accepted = sample_step(impl, case, n, seed)
    chain = case.chains[0]
    rate = exact.acceptance_probability(chain.p[0], chain.q[0])
    result = stats.binomial_test(int(accepted[0]), n, min(1.0, rate), "two-sided")
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
class Check:
    """A statistical check as the self-test and the calibration use it: its runner, its probe case,
    and the exact deviation of its tested law under a rule that takes ``uniforms=``."""

    name: str
    run: Callable[..., CheckOutcome]
    case: StepCase | LoopCase

    def __call__(self, impl: Impl, *, alpha: float, seed: int, n: int | None = None) -> CheckOutcome:
        return self.run(impl, self.case, alpha=alpha, seed=seed, n=n, name=self.name)

    def default_n(self, alpha: float) -> int:
        """The sample size the check runs with at level ``alpha`` (detects ``budget.DETECTABLE_TV``)."""
        return self.sample_size_for(budget.DETECTABLE_TV, alpha)

    def sample_size_for(self, tv: float, alpha: float) -> int:
        """Samples per tested law that detect a deviation ``tv`` with ``budget.POWER`` at level ``alpha``
        (per request at ``alpha / R`` for ``R`` interleaved requests)."""
        if self.run is run_acceptance_check:
            return budget.sample_size(2, alpha=alpha, tv=tv)
        chains = len(self.case.chains) if isinstance(self.case, StepCase) else 1
        return budget.sample_size(self.case.num_cells, alpha=alpha / chains, tv=tv)

    def num_cells(self) -> int:
        return 2 if self.run is run_acceptance_check else self.case.num_cells

    def exact_deviation(self, rule: Impl) -> float | None:
        """TV between the tested law under ``rule`` (exactly, by ``specverify.core.exact``) and the target's;
        None for steps with ``K > MAX_EXACT_DRAFTS`` (integration cost grows as cells^(K+1))."""
        case = self.case
        if isinstance(case, StepCase) and case.num_draft > MAX_EXACT_DRAFTS:
            return None
        if isinstance(case, LoopCase):
            law = exact.sequence_distribution(rule, case.chain, case.num_draft, case.length)
            return total_variation(law_array(law, case.vocab_size, case.length), loop_target_law(case))
        if self.run is run_acceptance_check:
            chain = case.chains[0]
            return abs(acceptance_rule_rate(case, rule) - exact.acceptance_probability(chain.p[0], chain.q[0]))
        return max(
            total_variation(step_rule_law(case, r, rule), step_target_law(case, r)) for r in range(len(case.chains))
        )


def all_checks() -> tuple[Check, ...]:
    """Every statistical check on its probe case."""
    cases = probe_cases()
    runners = {"decoding_loop_joint": run_loop_check, "acceptance_rate": run_acceptance_check}
    return tuple(Check(name, runners.get(name, run_step_check), case) for name, case in cases.items())


# --------------------------------------------------------------------------------------------
# Hypothesis strategies of the checks' cases
# --------------------------------------------------------------------------------------------


@st.composite
def rejecting_chains(draw: st.DrawFn) -> PositionalChain:
    """Context-free steps with frequent rejection: TV(p_i, q_i) in [0.3, 0.9] at every position,
    ``V^(K+1) ≤ 81`` (K = 2..3)."""
    vocab, num_draft = draw(st.sampled_from([(2, 2), (2, 3), (3, 2), (3, 3), (4, 2)]))
    distances = st.floats(0.3, 0.9)
    pairs = [draw(distances.flatmap(lambda tv: draft_target_pairs(vocab, relation="tv", tv=tv))) for _ in range(num_draft)]
    bonus = draw(probability_vectors(vocab))
    return PositionalChain(np.stack([p for p, _ in pairs] + [bonus]), np.stack([q for _, q in pairs]))


@st.composite
def loop_cases(draw: st.DrawFn) -> LoopCase:
    """Markov chains (V = 2..4, order 1..2, V^order ≤ 9), K = 1..3 drafts, L = 2..3 with V^L ≤ 64."""
    vocab, order = draw(st.sampled_from([(2, 1), (3, 1), (4, 1), (2, 2), (3, 2)]))
    chain = draw(markov_chains(vocab, order))
    length = draw(st.sampled_from([length for length in (2, 3) if vocab**length <= 64]))
    return LoopCase(chain, draw(st.integers(1, 3)), length)


@st.composite
def batched_cases(draw: st.DrawFn) -> StepCase:
    """R = 2..3 different requests (same V = 2..4, K = 1..2, V^(K+1) ≤ 64) interleaved in every batch."""
    vocab, num_draft = draw(st.sampled_from([(2, 1), (3, 1), (4, 1), (2, 2), (3, 2), (4, 2)]))
    chains = draw(st.lists(positional_chains(vocab, num_draft), min_size=2, max_size=3))
    return StepCase(tuple(chains), tuple(range(num_draft + 1)))


@st.composite
def long_draft_cases(draw: st.DrawFn) -> StepCase:
    """K = 4..8 drafts, the joint of all K+1 completed tokens (V^(K+1) ≤ 512)."""
    vocab, num_draft = draw(st.sampled_from([(2, 4), (2, 5), (2, 6), (2, 7), (2, 8), (3, 4)]))
    chain = draw(positional_chains(vocab, num_draft))
    return StepCase((chain,), tuple(range(num_draft + 1)))


def _run_and_assert(outcome: CheckOutcome) -> None:
    print(outcome)
    assert not outcome.rejected, f"loss detected: {outcome}"


# --------------------------------------------------------------------------------------------
# The statistical tests (budgeted in budget.STATISTICAL_TESTS)
# --------------------------------------------------------------------------------------------


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_first_token_marginal"), **STATISTICAL_SETTINGS)
@given(chain=positional_chains(st.integers(2, 6), st.integers(1, 3)))
def test_first_token_marginal(chain, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """The first emitted token is distributed as p_0."""
    case = StepCase((chain,), (0,))
    alpha = budget.alpha_per_execution(specverify_suite_alpha)
    seed = derive_seed("test_first_token_marginal", case.key(), base=specverify_base_seed)
    _run_and_assert(run_step_check(specverify_impl, case, alpha=alpha, seed=seed, name="first_token_marginal"))


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_step_joint_with_frequent_rejection"), **STATISTICAL_SETTINGS)
@given(chain=rejecting_chains())
def test_step_joint_with_frequent_rejection(chain, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """The completed K+1 tokens of one step are distributed as target sampling, with rejections (and
    so corrections) frequent at every position."""
    case = StepCase((chain,), tuple(range(chain.num_draft + 1)))
    alpha = budget.alpha_per_execution(specverify_suite_alpha)
    seed = derive_seed("test_step_joint_with_frequent_rejection", case.key(), base=specverify_base_seed)
    _run_and_assert(run_step_check(specverify_impl, case, alpha=alpha, seed=seed, name="step_joint"))


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_bonus_position"), **STATISTICAL_SETTINGS)
@given(chain=positional_chains(st.integers(2, 6), st.integers(1, 4), relation="identical"))
def test_bonus_position(chain, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """With q_i = p_i every draft is accepted, so the token at position K is the bonus: law p_K."""
    case = StepCase((chain,), (chain.num_draft,))
    alpha = budget.alpha_per_execution(specverify_suite_alpha)
    seed = derive_seed("test_bonus_position", case.key(), base=specverify_base_seed)
    _run_and_assert(run_step_check(specverify_impl, case, alpha=alpha, seed=seed, name="bonus_position"))


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_decoding_loop_joint"), **STATISTICAL_SETTINGS)
@given(case=loop_cases())
def test_decoding_loop_joint(case, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """The first L tokens of whole decoding loops (context-dependent targets, per-row state) are
    distributed as L tokens of target sampling."""
    alpha = budget.alpha_per_execution(specverify_suite_alpha)
    seed = derive_seed("test_decoding_loop_joint", case.key(), base=specverify_base_seed)
    _run_and_assert(run_loop_check(specverify_impl, case, alpha=alpha, seed=seed))


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_batched_rows_that_differ"), **STATISTICAL_SETTINGS)
@given(case=batched_cases())
def test_batched_rows_that_differ(case, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """In batches that interleave different requests every request's completed step has its own
    target law (no row reads another row's laws or randomness)."""
    alpha = budget.alpha_per_execution(specverify_suite_alpha)
    seed = derive_seed("test_batched_rows_that_differ", case.key(), base=specverify_base_seed)
    _run_and_assert(run_step_check(specverify_impl, case, alpha=alpha, seed=seed, name="batched_rows"))


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_long_drafts"), **STATISTICAL_SETTINGS)
@given(case=long_draft_cases())
def test_long_drafts(case, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """K = 4..8 drafts: the completed K+1 tokens are distributed as target sampling."""
    alpha = budget.alpha_per_execution(specverify_suite_alpha)
    seed = derive_seed("test_long_drafts", case.key(), base=specverify_base_seed)
    _run_and_assert(run_step_check(specverify_impl, case, alpha=alpha, seed=seed, name="long_drafts"))


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_acceptance_rate_is_one_minus_tv"), **STATISTICAL_SETTINGS)
@given(chain=positional_chains(st.integers(2, 6), 1))
def test_acceptance_rate_is_one_minus_tv(chain, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """A single draft x ~ q is accepted with probability Σ min(p, q) = 1 − TV(p, q)."""
    case = StepCase((chain,), (0,))
    alpha = budget.alpha_per_execution(specverify_suite_alpha)
    seed = derive_seed("test_acceptance_rate_is_one_minus_tv", case.key(), base=specverify_base_seed)
    _run_and_assert(run_acceptance_check(specverify_impl, case, alpha=alpha, seed=seed))
