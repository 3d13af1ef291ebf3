"""The sampler level of the audit (SPEC §1): test distributions, checks and the battery.

The check framework (budgets, plans, results, power sizing) is :mod:`specverify.auditing.checks`.

The sampler battery (:class:`SamplerBattery`, in run order):

- ``randomness-source`` (contract): all randomness comes from ``generator``;
- ``exact-step`` (only for functions taking ``uniforms=``): exact TV of one step on small chains;
- ``step-K1`` … ``step-K8-tail``, ``markov-step-K3`` (goodness of fit): one step with K = 1, 2,
  4, 8, rows spread over several different chains, the completed tokens of a window of positions
  tested jointly (cells: chain × tokens), context-free and context-dependent targets;
- edge cases (goodness of fit): ``bonus-position`` (q = p, every draft accepted),
  ``correction-position`` (rejection at position 2), ``disjoint-supports``, ``zeros-both-sides``,
  ``near-one-hot``, ``near-uniform``, ``tiny-masses`` (1e-8);
- the call patterns of :mod:`specverify.auditing.sampler.coverage`, with ``ragged-drafts`` and
  ``exact-ragged-drafts`` (functions taking ``num_draft_tokens=``; the exact one with ``uniforms=``):
  rows with their own draft counts, as engines verify them;
- ``exact-large-vocabulary`` (functions taking ``uniforms=``) and ``production-*``: production shapes
  (V up to 151,936, K up to 32, batches of 1,024, bf16/fp16, strided views;
  :mod:`specverify.auditing.sampler.production`);
- ``decoding-loop-order1/2`` (goodness of fit): whole decoding loops, continuous batching and K
  changing per call, the first L = 3 / 4 tokens of every sequence jointly;
- ``acceptance-rate`` (exact one-sided binomial): P(output = draft) ≤ Σ min(p, q);
- ``inputs-unchanged`` (contract): no call modified its inputs.

The test distributions are fixed (seeded by each check's name), so the power statement refers to
the same laws in every audit; the audit's seed only drives the sampling.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from specverify.auditing.audited import AuditSession
from specverify.auditing.checks import (  # the framework names are re-exported for the 0.1 path specverify.battery
    BUDGETS,
    EXACT_TOLERANCE,
    POWER,
    Battery,
    Check,
    CheckKind,
    CheckResult,
    ChiSquareCheck,
    ExactCase,
    InputsUnchangedCheck,
    Locus,
    Plan,
    SampleBudget,
    SequentialCheck,
    Tally,
    Verdict,
    binomial_detectable_rate,
    binomial_result,
    binomial_sample_size,
    declared_arithmetic_of,
    exact_cases_result,
    goodness_of_fit_result,
    resolve_budget,
    result_from_fault,
    skipped_result,
)
from specverify.auditing.cost import Cost, step_cost
from specverify.auditing.isolation.faults import (
    Fault,
    FaultKind,
    probe_randomness,
    seed_global_rng,
    validate_emitted,
)
from specverify.auditing.minimal_case import CaseSource, FailingStepSource, worst_cell_sources
from specverify.auditing.omissions import Omission, sampler_omissions
from specverify.core.chains import ChainBank, MarkovBank, PositionalBank
from specverify.core.rules import accepts_num_draft_tokens, accepts_uniforms
from specverify.core.seeding import derive_seed
from specverify.testing.harness import (
    DEFAULT_BATCH_ROWS,
    GuardedFunction,
    StepSample,
    markov_prefix_law,
    positional_window_law,
    propose,
    sample_runs,
    sample_steps,
)

"""An exact TV above this fails the exact check (integration rounding is ~1e-13)."""

# --------------------------------------------------------------------------------------------
# Test distributions (fixed: derived from each check's name, not from the audit's seed)
# --------------------------------------------------------------------------------------------


def _dirichlet(rng: np.random.Generator, size: int, support: np.ndarray | None = None) -> np.ndarray:
    law = np.zeros(size)
    tokens = np.arange(size) if support is None else support
    law[tokens] = rng.dirichlet(np.ones(len(tokens)))
    return law


def _one_hot_ish(rng: np.random.Generator, size: int, token: int) -> np.ndarray:
    law = 0.03 * _dirichlet(rng, size)
    law[token] += 0.97
    return law


def _with_tiny(law: np.ndarray, tokens: np.ndarray, mass: float = 1e-8) -> np.ndarray:
    law = law.copy()
    others = np.setdiff1d(np.arange(len(law)), tokens)
    law[others] *= (1.0 - mass * len(tokens)) / law[others].sum()
    law[tokens] = mass
    return law


def step_laws(rng: np.random.Generator, family: str, vocab_size: int, num_draft: int) -> tuple[np.ndarray, np.ndarray]:
    """One chain of a context-free step: ``p [K+1, V]`` and ``q [K, V]`` of the named family.

    random: independent Dirichlet(1) laws (TV(p_i, q_i) ≈ 0.3–0.5, frequent rejections);
    identical: q_i = p_i (every draft accepted, the bonus token carries the test);
    disjoint: p_i and q_i on disjoint halves of the vocabulary (every draft rejected);
    zeros: p_i is 0 on a third of the tokens that q_i proposes, q_i is 0 on a third that p_i allows;
    one-hot: 0.97 on one token (the draft's peak is the target's half of the time);
    near-uniform: uniform ±30 %;
    tiny: masses of 1e-8 in p on tokens q proposes, and in q on p's most likely token;
    deep-correction: q_0 = p_0, q_1 = p_1, then q_2 half disjoint from p_2 (rejection at position 2);
    zipf: large vocabulary, p_i ∝ rank^−1.1 over a random order, q_i a tempered, re-ordered variant.
    """
    v, k = vocab_size, num_draft
    p = np.stack([_dirichlet(rng, v) for _ in range(k + 1)])
    q = np.stack([_dirichlet(rng, v) for _ in range(k)])
    if family == "random":
        pass
    elif family == "identical":
        q = p[:k].copy()
    elif family == "disjoint":
        for i in range(k):
            order = rng.permutation(v)
            p[i], q[i] = _dirichlet(rng, v, order[: v // 2]), _dirichlet(rng, v, order[v // 2 :])
    elif family == "zeros":
        for i in range(k + 1):
            order = rng.permutation(v)
            p_only, both, q_only = order[: v // 3], order[v // 3 : 2 * v // 3], order[2 * v // 3 :]
            p[i] = _dirichlet(rng, v, np.concatenate([p_only, both]))
            if i < k:
                q[i] = _dirichlet(rng, v, np.concatenate([both, q_only]))
    elif family == "one-hot":
        peaks = rng.integers(0, v, size=k + 1)
        p = np.stack([_one_hot_ish(rng, v, t) for t in peaks])
        q = np.stack([_one_hot_ish(rng, v, t if rng.random() < 0.5 else int(rng.integers(0, v))) for t in peaks[:k]])
    elif family == "near-uniform":
        p = np.stack([1.0 + 0.3 * rng.uniform(-1, 1, v) for _ in range(k + 1)])
        q = np.stack([1.0 + 0.3 * rng.uniform(-1, 1, v) for _ in range(k)])
        p, q = p / p.sum(axis=1, keepdims=True), q / q.sum(axis=1, keepdims=True)
    elif family == "tiny":
        for i in range(k + 1):
            rare = rng.choice(v, size=2, replace=False)
            p[i] = _with_tiny(p[i], rare)
            if i < k:
                q[i] = _with_tiny(q[i], np.array([int(np.argmax(p[i]))]))
    elif family == "deep-correction":
        q[:2] = p[:2]
        unlikely = np.argsort(p[2], kind="stable")[: v // 2]
        q[2] = 0.5 * p[2] + 0.5 * _dirichlet(rng, v, unlikely)
    elif family == "zipf":
        p, q = _zipf_laws(rng, v, k)
    else:
        raise ValueError(f"family: unknown test-distribution family {family!r}")
    return p, q


def _zipf_laws(rng: np.random.Generator, vocab_size: int, num_draft: int) -> tuple[np.ndarray, np.ndarray]:
    weights = np.arange(1, vocab_size + 1, dtype=np.float64) ** -1.1
    p = np.stack([weights[rng.permutation(vocab_size)] for _ in range(num_draft + 1)])
    p /= p.sum(axis=1, keepdims=True)
    swapped = p[:num_draft] ** 0.7
    for row in swapped:  # move a tenth of the draft's tokens to other ranks
        chosen = rng.choice(vocab_size, size=vocab_size // 10, replace=False)
        row[chosen] = row[rng.permutation(chosen)]
    q = swapped / swapped.sum(axis=1, keepdims=True)
    return p, q


def positional_family_bank(name: str, family: str, vocab_size: int, num_draft: int, num_chains: int) -> PositionalBank:
    rng = np.random.default_rng(derive_seed("test-distributions", name, family, vocab_size, num_draft, num_chains))
    laws = [step_laws(rng, family, vocab_size, num_draft) for _ in range(num_chains)]
    return PositionalBank(np.stack([p for p, _ in laws]), np.stack([q for _, q in laws]))


def markov_family_bank(name: str, vocab_size: int, order: int, num_chains: int) -> MarkovBank:
    """Random Markov chains: target rows Dirichlet(1); draft rows ½·target + ½·Dirichlet(1)
    (acceptance around 0.7, so runs mix accepted drafts, corrections and bonus tokens)."""
    rng = np.random.default_rng(derive_seed("test-distributions", name, "markov", vocab_size, order, num_chains))
    states = vocab_size**order
    target = rng.dirichlet(np.ones(vocab_size), size=(num_chains, states))
    draft = 0.5 * target + 0.5 * rng.dirichlet(np.ones(vocab_size), size=(num_chains, states))
    prompts = rng.integers(0, vocab_size, size=(num_chains, order))
    return MarkovBank(target, draft, order, prompts)


# --------------------------------------------------------------------------------------------
# Sampler-level checks
# --------------------------------------------------------------------------------------------


@dataclass
class SamplerSession(AuditSession):
    """A guarded function plus the settings every sampler check shares."""

    function: GuardedFunction
    raw: Callable[..., Any]
    timeout_s: float
    batch_rows: int = DEFAULT_BATCH_ROWS


@dataclass
class StepLawCheck(ChiSquareCheck, FailingStepSource):
    """One verification step per row; the law of a window of the completed tokens, jointly.

    Cells: (chain of the row, cell of each window position); ``top_cells`` > 0 pools each
    position's tokens into its ``top_cells`` most likely target tokens plus one "rest" cell, fixed
    from the target law before sampling (large vocabularies).  Expected law: the row's chain is
    uniform over the bank, and within a chain the window's target law
    (:func:`specverify.testing.harness.positional_window_law` / :func:`~specverify.testing.harness.markov_prefix_law`).
    """

    name: str
    description: str
    bank: PositionalBank | MarkovBank
    num_draft: int
    window: tuple[int, int]
    family: str
    top_cells: int = 0
    locus: Locus | None = None
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        bank = self.bank
        self.cells_per_position = self.top_cells + 1 if self.top_cells else bank.vocab_size
        self.num_cells = bank.num_chains * self.cells_per_position ** self.window[1]
        self.parameters = {
            "chain": "positional" if bank.kind == "positional" else f"markov order {bank.order}",
            "family": self.family, "K": self.num_draft, "V": bank.vocab_size, "chains": bank.num_chains,
            "window": list(self.window), "cells": self.num_cells,
        }
        if self.top_cells:
            self.parameters["top_cells"] = self.top_cells
        if bank.kind == "markov" and self.window[0] != 0:
            raise ValueError(f"window: Markov windows must start at position 0 (got {self.window}); the law of a "
                             "later window would need the marginal over the earlier tokens")

    def _cell_maps(self) -> np.ndarray:
        """int64 ``[R, W, V]``: the cell of every token at every window position of every chain."""
        bank, (start, length) = self.bank, self.window
        identity = np.broadcast_to(np.arange(bank.vocab_size), (bank.num_chains, length, bank.vocab_size))
        if not self.top_cells:
            return np.ascontiguousarray(identity)
        maps = np.full((bank.num_chains, length, bank.vocab_size), self.top_cells, dtype=np.int64)
        for r in range(bank.num_chains):
            for j in range(length):
                top = np.argsort(-bank.target[r, start + j], kind="stable")[: self.top_cells]
                maps[r, j, top] = np.arange(self.top_cells)
        return maps

    def _expected(self, maps: np.ndarray) -> np.ndarray:
        bank = self.bank
        if isinstance(bank, PositionalBank):
            laws = [positional_window_law(bank, r, self.window, maps[r],
                                          self.cells_per_position) for r in range(bank.num_chains)]
        else:
            laws = [markov_prefix_law(bank, r, self.window[1]) for r in range(bank.num_chains)]
        return np.concatenate(laws) / bank.num_chains

    def _labels(self, maps: np.ndarray) -> tuple[str, ...]:
        bank, cells, length = self.bank, self.cells_per_position, self.window[1]
        labels = []
        for r in range(bank.num_chains):
            for index in range(cells**length):
                digits = [(index // cells ** (length - 1 - j)) % cells for j in range(length)]
                if self.top_cells:
                    names = ["rest" if d == self.top_cells else str(int(np.flatnonzero(maps[r, j] == d)[0]))
                             for j, d in enumerate(digits)]
                else:
                    names = [str(d) for d in digits]
                labels.append(f"chain {r} tokens ({', '.join(names)})")
        return tuple(labels)

    def _acceptance(self, accepted: np.ndarray) -> dict[str, tuple[float, ...]] | None:
        """Observed counts of 0..K accepted drafts and their law under optimal acceptance
        (context-free chains only): P(A ≥ a) = Π_{i<a} α_i with α_i = Σ_x min(p_i(x), q_i(x))
        (Leviathan et al. 2023, eq. (1)), averaged over the bank's chains."""
        if self.bank.kind != "positional":
            return None
        k = self.num_draft
        alphas = np.minimum(self.bank.target[:, :k], self.bank.draft[:, :k]).sum(axis=-1)  # [R, K]
        at_least = np.concatenate([np.ones((len(alphas), 1)), np.cumprod(alphas, axis=1)], axis=1)  # [R, K+1]
        exactly = at_least - np.concatenate([at_least[:, 1:], np.zeros((len(alphas), 1))], axis=1)
        return {"observed": tuple(float(c) for c in accepted.tolist()),
                "expected": tuple(float(e) for e in exactly.mean(axis=0))}

    @functools.cached_property
    def cells(self) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
        """The cell maps (:meth:`_cell_maps`), the expected law of the cells and their labels (fixed before
        sampling)."""
        maps = self._cell_maps()
        return maps, self._expected(maps), self._labels(maps)

    def cell_counts(self, sample: StepSample) -> np.ndarray:
        """Counts of the sampled rows in the cells (chain × window tokens)."""
        maps = self.cells[0]
        cells = torch.from_numpy(maps)[sample.chain[:, None], torch.arange(self.window[1]), sample.window]
        weights = self.cells_per_position ** torch.arange(self.window[1] - 1, -1, -1)
        index = sample.chain * self.cells_per_position ** self.window[1] + (cells * weights).sum(dim=1)
        return torch.bincount(index, minlength=self.num_cells).numpy()

    def tally(self, sample: StepSample, n: int) -> Tally:
        return Tally(n, {"cells": self.cell_counts(sample), "accepted": sample.accepted.numpy()})

    def cost(self, plan: Plan) -> Cost:
        return step_cost(plan.n, self.num_draft, self.bank.vocab_size)

    def draw(self, session: SamplerSession, plan: Plan, n: int, look: int) -> Tally:
        sample = sample_steps(session.function, self.bank, num_draft=self.num_draft, window=self.window, n=n,
                              batch_rows=session.batch_rows, harness_seed=derive_seed(plan.seed, "harness", look),
                              function_seed=derive_seed(plan.seed, "function", look), where=self.name)
        return self.tally(sample, n)

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        _, expected, labels = self.cells
        return goodness_of_fit_result(self, plan, tally.counts["cells"], expected, labels,
                                      self._acceptance(tally.counts["accepted"]), level=level, look=look)

    def case_sources(self, result: CheckResult) -> list[CaseSource]:
        return worst_cell_sources(self.bank, self.num_draft, self.window, result)


def prefix_cells(bank: MarkovBank, length: int) -> tuple[np.ndarray, tuple[str, ...]]:
    """Cells of the first ``length`` tokens of a sequence jointly, per chain of a Markov ``bank``:
    cell ``r · V^L + Σ_j x_j V^(L−1−j)`` for chain ``r`` and tokens ``x_0 … x_{L−1}``, of expected
    probability ``P(x_0 … x_{L−1} | chain r) / R`` (the chain drawn uniformly among the R of the
    bank; :func:`~specverify.testing.harness.markov_prefix_law`).  Returns the expected law and a
    label per cell."""
    v = bank.vocab_size
    expected = np.concatenate([markov_prefix_law(bank, r, length) for r in range(bank.num_chains)]) / bank.num_chains
    labels = tuple(f"chain {r} tokens {tuple(int(d) for d in np.unravel_index(i, (v,) * length))}"
                   for r in range(bank.num_chains) for i in range(v**length))
    return expected, labels


def prefix_cell_counts(bank: ChainBank, chain: torch.Tensor, tokens: torch.Tensor) -> np.ndarray:
    """Counts of sampled sequences in the cells of :func:`prefix_cells` (``chain`` int64 ``[n]``,
    ``tokens`` int64 ``[n, L]``)."""
    v, length = bank.vocab_size, tokens.shape[1]
    weights = v ** torch.arange(length - 1, -1, -1)
    index = chain * v**length + (tokens * weights).sum(dim=1)
    return torch.bincount(index, minlength=bank.num_chains * v**length).numpy()


@dataclass
class DecodingLoopCheck(ChiSquareCheck):
    """Whole decoding loops (continuous batching, K varying per call) on Markov chains; the joint
    law of the first L tokens of every sequence against the target's (cells: chain × V^L)."""

    name: str
    description: str
    bank: MarkovBank
    length: int
    draft_schedule: tuple[int, ...]
    parameters: dict[str, Any] = field(init=False)
    locus = Locus.CONTEXT

    def __post_init__(self) -> None:
        self.num_cells = self.bank.num_chains * self.bank.vocab_size**self.length
        self.parameters = {"chain": f"markov order {self.bank.order}", "V": self.bank.vocab_size,
                           "chains": self.bank.num_chains, "L": self.length,
                           "K schedule": list(self.draft_schedule), "cells": self.num_cells}

    def cost(self, plan: Plan) -> Cost:
        mean_draft = sum(self.draft_schedule) / len(self.draft_schedule)
        return step_cost(plan.n * self.length, mean_draft, self.bank.vocab_size)  # at most a row per token

    def draw(self, session: SamplerSession, plan: Plan, n: int, look: int) -> Tally:
        sample = sample_runs(session.function, self.bank, length=self.length, draft_schedule=self.draft_schedule,
                             n=n, batch_rows=session.batch_rows, harness_seed=derive_seed(plan.seed, "harness", look),
                             function_seed=derive_seed(plan.seed, "function", look), where=self.name)
        return Tally(n, {"cells": prefix_cell_counts(self.bank, sample.chain, sample.tokens)})

    @functools.cached_property
    def cells(self) -> tuple[np.ndarray, tuple[str, ...]]:
        """The expected law of the cells (chain × first L tokens) and their labels (:func:`prefix_cells`)."""
        return prefix_cells(self.bank, self.length)

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        expected, labels = self.cells
        return goodness_of_fit_result(self, plan, tally.counts["cells"], expected, labels, None, level=level, look=look)


@dataclass
class AcceptanceRateCheck(SequentialCheck, FailingStepSource):
    """Single-draft steps: P(first emitted token == draft token) must not exceed Σ_x min(p(x), q(x)).

    Coupling inequality: if the output y ~ p and the draft x ~ q, then P(y = x) ≤ 1 − TV(p, q) =
    Σ_x min(p(x), q(x)) (the maximal coupling; Leviathan et al. 2023, eq. (1)), so a verifier that
    keeps the draft more often than that is lossy, whatever its samples look like.  One-sided exact
    binomial test of H0: rate ≤ mean over the bank's chains of Σ min(p, q), at each look.
    """

    name: str
    description: str
    bank: ChainBank
    kind: ClassVar[CheckKind] = CheckKind.BINOMIAL
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = 2

    def __post_init__(self) -> None:
        self.bound = float(np.minimum(self.bank.target[:, 0], self.bank.draft[:, 0]).sum(axis=-1).mean())
        self.parameters = {"chain": "positional", "family": "random", "K": 1, "V": self.bank.vocab_size,
                           "chains": self.bank.num_chains, "acceptance bound": round(self.bound, 12)}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        return binomial_sample_size(epsilon, self.bound, alpha, power)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return binomial_detectable_rate(n, self.bound, alpha, power)

    def cost(self, plan: Plan) -> Cost:
        return step_cost(plan.n, 1, self.bank.vocab_size)

    def draw(self, session: SamplerSession, plan: Plan, n: int, look: int) -> Tally:
        sample = sample_steps(session.function, self.bank, num_draft=1, window=(0, 1), n=n,
                              batch_rows=session.batch_rows, harness_seed=derive_seed(plan.seed, "harness", look),
                              function_seed=derive_seed(plan.seed, "function", look), where=self.name)
        return Tally(n, {"kept": np.array(sample.first_is_draft)})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        return binomial_result(
            self, plan, int(tally.counts["kept"]), tally.n, self.bound, ("first token = draft", "first token ≠ draft"),
            failing=("keeps the draft token in {rate:.4f} of steps, more than the maximal-coupling bound "
                     "Σ min(p, q) = {bound:.4f} (p-value {pvalue:.3g} ≤ {where}): its output law is at TV ≥ "
                     "{excess:.4f} from the target's"),
            passing="acceptance {rate:.4f} within the bound Σ min(p, q) = {bound:.4f} (p-value {pvalue:.3g} > {where})",
            level=level, look=look)

    def case_sources(self, result: CheckResult) -> list[CaseSource]:
        return worst_cell_sources(self.bank, 1, (0, 0), result)


@dataclass
class ExactStepCheck(Check, FailingStepSource):
    """Exact integration over the uniforms (specverify.core.exact) of one step on small chains; cannot
    flake.  Only for functions that take ``uniforms=`` (docs/ARCHITECTURE.md convention)."""

    name: str
    description: str
    cases: tuple[tuple[str, ChainBank, int], ...]
    kind: ClassVar[CheckKind] = CheckKind.EXACT
    locus = Locus.ONE_ROW_EXACT
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = 0

    def __post_init__(self) -> None:
        self.parameters = {"cases": [f"{label} (V={bank.vocab_size}, K={k})" for label, bank, k in self.cases]}


    def run(self, session: SamplerSession, plan: Plan) -> CheckResult:
        from specverify.core import exact

        def rule(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
            # The uniforms are the only randomness the function gets (the generator is withheld,
            # as SPEC §1 rules may refuse both); exact.py still detects a function that draws
            # other randomness, because its output then changes between two evaluations.
            try:
                result = session.raw(target_probs, draft_probs, draft_tokens, None, uniforms=uniforms)
            except Exception as error:
                raise Fault("exception", f"the function (in {self.name}, with uniforms=) raised "
                                         f"{type(error).__name__}: {error}") from error
            return validate_emitted(result, draft_tokens, target_probs.shape[-1])[0]

        cases = [ExactCase(label, functools.partial(exact.exact_step_tv, rule, bank.chain(0), k), k, bank.vocab_size)
                 for label, bank, k in self.cases]
        arithmetic, declared = declared_arithmetic_of(session.function)
        return exact_cases_result(self, plan, cases, 10 * session.timeout_s, arithmetic, declared)

    def case_sources(self, result: CheckResult) -> list[CaseSource]:
        return [CaseSource(bank, 0, k) for _, bank, k in self.cases]


@dataclass
class RandomnessSourceCheck(Check):
    """All randomness must come from ``generator`` (SPEC §1): same generator seed under different
    global seeds (torch, numpy, random) → same output; the same run twice → same output; a second
    call with the advanced generator → a different output.  A violation is a contract failure
    (exit 1): seeded runs would not be reproducible, or successive steps would share randomness."""

    name: str
    description: str
    bank: ChainBank
    num_draft: int
    rows: int
    kind: ClassVar[CheckKind] = CheckKind.CONTRACT
    locus = Locus.RANDOMNESS_SOURCE
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = 0

    def __post_init__(self) -> None:
        self.parameters = {"K": self.num_draft, "V": self.bank.vocab_size, "rows": self.rows}


    def run(self, session: SamplerSession, plan: Plan) -> CheckResult:
        generator = torch.Generator().manual_seed(derive_seed(plan.seed, "harness"))
        chain = torch.arange(self.rows) % self.bank.num_chains
        proposal = propose(self.bank, self.bank.initial_state(chain), self.num_draft, generator)

        def run_twice(generator_seed: int, global_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
            seed_global_rng(global_seed)
            function_generator = session.function.generator(generator_seed)
            first = session.function(proposal, function_generator, where=self.name)[0]
            return first, session.function(proposal, function_generator, where=self.name)[0]

        probe = probe_randomness(run_twice, derive_seed(plan.seed, "function"),
                                 (derive_seed(plan.seed, "global", 1), derive_seed(plan.seed, "global", 2)))
        if probe.uses_only_generator:
            return self.report(plan, Verdict.PASS,
                               "the output depends on the generator's stream only")
        if not probe.repeatable:
            message = ("the output changed between two runs with the same generator seed and the same global "
                       "seeds: the function draws randomness from outside both (OS entropy, time); draw "
                       "everything from `generator`")
        elif not probe.independent_of_global:
            message = ("the output changed when only the global RNG seeds changed (same generator seed): the "
                       "function uses the global torch/numpy/random RNG instead of `generator`, so seeded runs "
                       "are not reproducible")
        else:
            message = ("two successive calls with the same generator gave identical outputs on inputs that "
                       "need randomness: the function reseeds or ignores `generator`, so successive steps reuse "
                       "the same random numbers")
        return self.report(plan, Verdict.FAIL, message,
                           fault=FaultKind.GLOBAL_RNG)


# --------------------------------------------------------------------------------------------
# The sampler battery
# --------------------------------------------------------------------------------------------


class SamplerBattery(Battery):
    """SPEC §1 battery: one verification step, and whole decoding loops, driven by the harness."""

    level = "sampler"
    first_looks_first = True

    def __init__(self, batch_rows: int = DEFAULT_BATCH_ROWS) -> None:
        self.batch_rows = batch_rows

    def open_session(self, fn: Callable[..., Any], *, device: str, timeout_s: float,
                     isolation: str = "none") -> SamplerSession:
        """The session of ``fn``; the production checks' laws are built meanwhile
        (:func:`~specverify.auditing.sampler.production.build_production_laws`), half in a thread
        while the worker process starts, half in this thread once it has started.  An error
        there is left to :meth:`checks`, which builds the same laws again and raises it."""
        from specverify.auditing.sampler.production import build_production_laws

        building = threading.Thread(target=_quietly, args=(functools.partial(build_production_laws, large=True),),
                                    name="specverify-build", daemon=True)
        building.start()
        try:
            function = GuardedFunction(fn, timeout_s=timeout_s, device=device, isolation=isolation)
            _quietly(functools.partial(build_production_laws, large=False))
        finally:
            building.join()
        return SamplerSession(function, function.raw, timeout_s, self.batch_rows)

    def omitted(self, session: SamplerSession) -> list[Omission]:
        return sampler_omissions(session)

    def checks(self, session: SamplerSession) -> list[Check]:
        steps = [self._step(*spec) for spec in _STEP_CHECKS]
        loops = [
            DecodingLoopCheck("decoding-loop-order1",
                              "Whole decoding loops on context-dependent (order-1 Markov) targets, batches of "
                              "sequences at different stages, K changing every call: the first 3 tokens of each "
                              "sequence must jointly follow the target.",
                              markov_family_bank("decoding-loop-order1", 4, 1, 2), 3, (1, 3, 2, 5)),
            DecodingLoopCheck("decoding-loop-order2",
                              "Whole decoding loops on order-2 Markov targets with up to 8 drafts per call: the "
                              "first 4 tokens of each sequence must jointly follow the target.",
                              markov_family_bank("decoding-loop-order2", 3, 2, 2), 4, (4, 1, 8, 2)),
        ]
        acceptance = AcceptanceRateCheck(
            "acceptance-rate",
            "Single-draft steps: the function may keep the draft token at most Σ min(p, q) of the time "
            "(the maximal coupling); keeping it more often proves loss whatever the samples look like.",
            positional_family_bank("acceptance-rate", "random", 6, 1, 3))
        checks: list[Check] = [
            RandomnessSourceCheck(
                "randomness-source",
                "Randomness must come from the generator only: the same generator seed under other global RNG "
                "seeds gives the same output, and a second call with the advanced generator a new one.",
                positional_family_bank("randomness-source", "random", 8, 4, 3), 4, 512),
        ]
        if accepts_uniforms(session.raw):
            checks.append(ExactStepCheck(
                "exact-step",
                "The function takes uniforms=, so one step's output law is integrated exactly over the "
                "uniforms on small cases and compared with the target's (no sampling, cannot flake).",
                (("random positional", positional_family_bank("exact-random", "random", 3, 2, 1), 2),
                 ("positional with zeros", positional_family_bank("exact-zeros", "zeros", 3, 2, 1), 2),
                 ("order-1 Markov", markov_family_bank("exact-markov", 3, 1, 1), 2))))
        from specverify.auditing.sampler.coverage import contract_checks, coverage_checks, late_checks, ragged_checks
        from specverify.auditing.sampler.production import exact_production_check, production_checks

        if accepts_uniforms(session.raw):
            checks.append(exact_production_check())
        ragged = ragged_checks(accepts_uniforms(session.raw)) if accepts_num_draft_tokens(session.raw) else []
        checks += (steps + coverage_checks() + ragged + production_checks(session.function) + loops + [acceptance]
                   + late_checks())
        checks.append(InputsUnchangedCheck("inputs-unchanged",
                                           "No call may modify the tensors it is given (engines reuse them)."))
        return checks + contract_checks()

    def _step(self, name: str, locus: Locus, description: str, family: str, vocab_size: int, num_draft: int,
              num_chains: int, window: tuple[int, int]) -> StepLawCheck:
        bank: PositionalBank | MarkovBank
        if family == "markov":
            bank = markov_family_bank(name, vocab_size, 2, num_chains)
        else:
            bank = positional_family_bank(name, family, vocab_size, num_draft, num_chains)
        return StepLawCheck(name, description, bank, num_draft, window, family, locus=locus)


def _quietly(build: Callable[[], None]) -> None:
    """Run ``build``, leaving any error to the later call that builds the same and raises it."""
    try:
        build()
    except Exception:  # noqa: BLE001 - checks() makes the same call and raises it
        return


# (name, the piece of the rule it isolates, description, family, V, K, chains, window (start, length))
_STEP_CHECKS: tuple[tuple[Any, ...], ...] = (
    ("step-K1", Locus.SINGLE_DRAFT,
     "One step with K=1 on three different random chains per batch: the emitted token, continued by "
     "target sampling, must follow the target at positions 0-1 (jointly, per chain).",
     "random", 4, 1, 3, (0, 2)),
    ("step-K2", Locus.MULTI_DRAFT,
     "One step with K=2, rows drawn from three different random chains: positions 0-2 jointly.",
     "random", 4, 2, 3, (0, 3)),
    ("step-K4", Locus.MULTI_DRAFT,
     "One step with K=4: positions 2-4 jointly (the deep drafts and the bonus position).",
     "random", 4, 4, 3, (2, 3)),
    ("step-K8-head", Locus.MULTI_DRAFT,
     "One step with K=8: positions 0-2 jointly.", "random", 4, 8, 3, (0, 3)),
    ("step-K8-tail", Locus.MULTI_DRAFT,
     "One step with K=8: positions 6-8 jointly (position 8 is the bonus position).",
     "random", 4, 8, 3, (6, 3)),
    ("markov-step-K3", Locus.CONTEXT,
     "One step with K=3 on context-dependent (order-2 Markov) targets, whose law at each "
     "position depends on the draft tokens before it: positions 0-2 jointly.",
     "markov", 4, 3, 2, (0, 3)),
    ("bonus-position", Locus.BONUS,
     "Draft identical to target, so every draft is accepted and the bonus token's law is "
     "tested alone (with the last draft): positions 2-3 with K=3.",
     "identical", 4, 3, 3, (2, 2)),
    ("correction-position", Locus.CORRECTION,
     "Drafts equal the target at positions 0-1 and differ at position 2, so the "
     "correction token at position 2 is exercised: positions 1-2 with K=4.",
     "deep-correction", 4, 4, 3, (1, 2)),
    ("disjoint-supports", Locus.RESIDUAL_IS_TARGET,
     "Draft and target on disjoint tokens: every draft is rejected and the first token "
     "is the correction, which must follow the target.",
     "disjoint", 6, 2, 3, (0, 1)),
    ("zeros-both-sides", Locus.EDGE_CASE,
     "The draft proposes tokens the target forbids and misses tokens the target allows: "
     "positions 0-1 jointly.", "zeros", 6, 3, 3, (0, 2)),
    ("near-one-hot", Locus.EDGE_CASE,
     "Both laws put 0.97 on one token (the same one or not): positions 0-1 jointly.",
     "one-hot", 6, 3, 3, (0, 2)),
    ("near-uniform", Locus.EDGE_CASE,
     "Both laws within ±30 % of uniform (almost everything accepted): positions 1-2 with K=2, "
     "position 2 being the bonus.", "near-uniform", 6, 2, 3, (1, 2)),
    ("tiny-masses", Locus.EDGE_CASE,
     "Probabilities of 1e-8 on both sides (huge and tiny acceptance ratios): positions 0-1 jointly.",
     "tiny", 6, 3, 3, (0, 2)),
)


__all__ = [
    "SamplerBattery", "SamplerSession", "StepLawCheck", "DecodingLoopCheck", "AcceptanceRateCheck", "ExactStepCheck",
    "RandomnessSourceCheck", "step_laws", "positional_family_bank", "markov_family_bank", "accepts_uniforms",
    "prefix_cells", "prefix_cell_counts",
    "EXACT_TOLERANCE",
    # re-exported from specverify.auditing.checks (0.1 path specverify.battery)
    "BUDGETS", "POWER", "Battery", "Check", "CheckResult", "InputsUnchangedCheck", "Plan", "SampleBudget",
    "goodness_of_fit_result", "resolve_budget", "result_from_fault", "skipped_result",
]
