"""Sampler checks for how engines call a sampler: one row per call, small and ragged batches,
late calls of a long-lived (possibly drifting) implementation, large vocabularies with
top-k/top-p-truncated targets, and outputs that stay valid after they are returned.

Engines do not call a verifier only with large batches.  B = 1 is the latency path they optimise
separately; small batches (2–64 rows) often take another kernel; continuous batching gives
every size, and a long-running server calls the same object millions of times.  A bug confined
to one of these paths passes every large-batch check, so each gets its own goodness-of-fit check
(:class:`GroupedStepCheck`): the harness draws the rows as for
:class:`specverify.auditing.sampler.battery.StepLawCheck` and calls the function once per group of
consecutive rows (:meth:`specverify.auditing.isolation.guarded.GuardedFunction.call_groups`), group
sizes following the check's pattern, one generator throughout.  The law tested, the cells and the
sample size are those of a StepLawCheck (:func:`specverify.core.stats.sample_size_for_tv` at
the check's Bonferroni share of α, power ``POWER``), so each detects a TV of ε in its cells.

Cost (reference rule, 2-core CPU): the B = 1 check makes n calls — 8,393 at ``quick``, 52,454 at
``standard`` — at ~17 µs of the worker's and the audit's own work plus ~19 µs of the function's
per call (:data:`specverify.auditing.cost.HARNESS_S_PER_CALL`, ``PRIOR_S_PER_CALL``); the others
make n/33 or fewer calls.

Late calls.  :class:`LateCallsCheck` first brings the function's life (calls and rows since its
worker started) to at least :data:`LATE_CALLS` calls and :data:`LATE_ROWS` rows with warm-up
calls (validated, not tested; a fixed number of calls and rows, whatever the function's speed, so
the calls tested are the same in every run with one seed), then tests the law of the calls after
that.  Its message states
the calls and rows tested; drift after them is not covered.

Truncated vocabularies.  Half-precision sampling paths emit tokens of target probability 0 at
a rate of about V × 6e-8 per draw.  :class:`TruncatedVocabularyCheck` tests V = 8192 targets cut
by top-k and by top-p (most tokens exactly 0) against untruncated drafts, with cells: the
target's most likely tokens, one cell for the rest of its support, and one cell for all tokens of
probability 0, of expected count 0 — a single emitted zero-probability token fails the check
(p = 0, certain loss), at any vocabulary size.

Ragged rows.  A function that takes ``num_draft_tokens=`` (docs/spec.md §1) is called as vLLM V1,
SGLang and EAGLE call their verifiers: each row with its own draft count ``k_b`` in ``0..K``, the
other columns holding decoy padding (:func:`specverify.testing.harness.propose_ragged`).
:class:`RaggedStepCheck` (``ragged-drafts``) mixes draft counts 0, 1 and K = 2, start positions 0
and 1, random and greedy (point-mass target) requests in calls of 1 to 1,000 rows and tests every
row's first ``k_b + 1`` tokens against the target (χ² on 234 cells, sized like every
goodness-of-fit check: TV ε at the check's α share with power ``POWER``); a row emitting more
than ``k_b + 1`` tokens is an impossible output.  :class:`RaggedExactCheck`
(``exact-ragged-drafts``, with ``uniforms=`` too) integrates single padded rows exactly
(:func:`specverify.core.exact.step_distribution` with ``width``); cross-row mistakes need the
statistical check.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from specverify.auditing.checks import (
    CallLogCheck,
    Check,
    CheckKind,
    ChiSquareCheck,
    ExactCase,
    Tally,
    Verdict,
    declared_arithmetic_of,
    exact_cases_result,
    goodness_of_fit_result,
)
from specverify.auditing.cost import Cost, step_cost
from specverify.auditing.isolation.faults import Fault, FaultKind, validate_emitted
from specverify.auditing.isolation.guarded import CallLog
from specverify.auditing.sampler.battery import (
    CheckResult,
    Plan,
    StepLawCheck,
    positional_family_bank,
)
from specverify.core.chains import ChainBank, PositionalBank, RowState
from specverify.core.seeding import derive_seed
from specverify.testing.harness import (
    Proposal,
    RaggedSample,
    StepSample,
    complete,
    group_sizes,
    propose,
    sample_ragged_steps,
)

LATE_CALLS = 500
"""Calls of the function's life before the late-calls check samples (2.5× the 200 of
tests/auditing/hostile/drift_calls.py)."""

LATE_ROWS = 1 << 19
"""Rows of the function's life before the late-calls check samples (2× the 250 000 of
tests/auditing/hostile/drift_rows.py)."""

LATE_ROWS_PER_SAMPLE = 10
"""Under a fixed budget of N samples (``--budget N``, a smoke test) the late-calls check warms the
function up to at most this many rows per sample and N calls, instead of LATE_CALLS and LATE_ROWS;
named budgets always warm up fully.  Both depend on the plan only, so the calls tested are the
same on every machine."""

CHUNK_ROWS = 4096
"""Rows the harness proposes at once before handing them to the function in groups."""


def sample_steps_in_groups(function: Any, bank: ChainBank, *, num_draft: int, window: tuple[int, int], n: int,
                           pattern: Sequence[int], harness_seed: int, function_seed: int,
                           where: str) -> tuple[StepSample, int]:
    """Like :func:`specverify.testing.harness.sample_steps`, but each chunk of proposed rows is
    passed to the function as consecutive groups whose sizes cycle through ``pattern`` (one call
    per group, one generator for all).  The rows and proposals are drawn from ``harness_seed``,
    the completions from a seed derived from it, so that the next chunk is proposed while the
    function runs (:meth:`~specverify.auditing.isolation.guarded.GuardedFunction.call_each_in_groups`)
    without changing any draw.  Returns the sample and the number of calls."""
    start, length = window
    proposing = torch.Generator().manual_seed(harness_seed)
    completing = torch.Generator().manual_seed(derive_seed(harness_seed, "completion"))
    function_generator = function.generator(function_seed)
    sizes = itertools.cycle(pattern)

    def chunks() -> Iterator[tuple[tuple[torch.Tensor, RowState, torch.Tensor, int], Proposal, list[int]]]:
        for offset in range(0, n, CHUNK_ROWS):
            rows = min(CHUNK_ROWS, n - offset)
            groups = group_sizes(sizes, rows)
            chain = torch.randint(bank.num_chains, (rows,), generator=proposing)
            state = bank.initial_state(chain)
            proposal = propose(bank, state, num_draft, proposing)
            yield (chain, state, proposal.draft_tokens[:, 0], len(groups)), proposal, groups

    chains, windows, calls = [], [], 0
    accepted = torch.zeros(num_draft + 1, dtype=torch.int64)
    first_is_draft = 0
    for (chain, state, first_drafts, groups), emitted, lengths in function.call_each_in_groups(
            chunks(), function_generator, where=where):
        calls += groups
        completed = complete(bank, state, emitted, lengths, start + length, completing)
        chains.append(chain)
        windows.append(completed[:, start:])
        accepted += torch.bincount(lengths - 1, minlength=num_draft + 1)
        first_is_draft += int((emitted[:, 0] == first_drafts).sum())
    return StepSample(torch.cat(chains), torch.cat(windows), accepted, first_is_draft), calls


@dataclass
class GroupedStepCheck(StepLawCheck):
    """A :class:`~specverify.auditing.sampler.battery.StepLawCheck` whose rows reach the function in
    groups of the sizes in ``pattern`` (cycled), one call per group."""

    pattern: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.parameters["batch sizes"] = list(self.pattern)

    def cost(self, plan: Plan) -> Cost:
        rows_per_call = sum(self.pattern) / len(self.pattern)
        return step_cost(plan.n, self.num_draft, self.bank.vocab_size, rows_per_call=rows_per_call)

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        sample, calls = sample_steps_in_groups(
            session.function, self.bank, num_draft=self.num_draft, window=self.window, n=n, pattern=self.pattern,
            harness_seed=derive_seed(plan.seed, "harness", look),
            function_seed=derive_seed(plan.seed, "function", look),
            where=self.name)
        tally = self.tally(sample, n)
        return Tally(n, dict(tally.counts, calls=np.array(calls)))

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        result = super().judge(plan, tally, level, look)
        return _with_note(result, f"{int(tally.counts['calls'])} calls of the function ({tally.n} rows)")


def _with_note(result: CheckResult, note: str) -> CheckResult:
    import dataclasses

    return dataclasses.replace(result, message=f"{result.message}; {note}")


@dataclass
class LateCallsCheck(GroupedStepCheck):
    """The law of calls made after the function has lived :data:`LATE_CALLS` calls and
    :data:`LATE_ROWS` rows (fewer under a small fixed budget: :data:`LATE_ROWS_PER_SAMPLE`); a
    stateful implementation that drifts fails here."""

    runs_in_parts: ClassVar[bool] = False  # the warm-up comes first

    def run(self, session: Any, plan: Plan) -> CheckResult:
        function = session.function
        life_calls, life_rows = LATE_CALLS, LATE_ROWS
        if plan.fixed_budget:
            life_calls, life_rows = min(LATE_CALLS, plan.n), min(LATE_ROWS, LATE_ROWS_PER_SAMPLE * plan.n)
        warm_calls, warm_rows = _warm_up(function, self.bank, self.num_draft, derive_seed(plan.seed, "warm-up"),
                                         self.name, life_calls, life_rows)
        first_call, first_row = function.life_calls, function.life_rows
        result = super().run(session, plan)
        note = (f"tested calls {first_call + 1}–{function.life_calls} and rows {first_row + 1}–{function.life_rows} of "
                f"the function's life (after {warm_calls} warm-up calls with {warm_rows} rows); calls and rows after "
                "these are not covered")
        return _with_note(result, note)


def _warm_up(function: Any, bank: ChainBank, num_draft: int, seed: int, where: str, life_calls: int,
             life_rows: int) -> tuple[int, int]:
    """Call the function until its life reaches ``life_calls`` calls and ``life_rows`` rows: one-row
    calls for the calls, full chunks for the rows (outputs validated, not tested)."""
    generator = torch.Generator().manual_seed(seed)
    chain = torch.randint(bank.num_chains, (CHUNK_ROWS,), generator=generator)
    proposal = propose(bank, bank.initial_state(chain), num_draft, generator)
    function_generator = function.generator(derive_seed(seed, "function"))
    calls_before, rows_before = function.life_calls, function.life_rows
    missing_calls = life_calls - function.life_calls
    while missing_calls > 0:
        rows = min(missing_calls, CHUNK_ROWS)
        part = type(proposal)(*(t[:rows] for t in proposal))
        function.call_groups(part, function_generator, [1] * rows, where=f"{where}, warm-up")
        missing_calls -= rows
    while function.life_rows < life_rows:
        function.call_groups(proposal, function_generator, [CHUNK_ROWS], where=f"{where}, warm-up")
    return function.life_calls - calls_before, function.life_rows - rows_before


def truncated_bank(name: str, vocab_size: int, top_k: int, top_p: float) -> Any:
    """Two chains over ``vocab_size`` tokens, K = 1: Zipf-like targets (p ∝ rank^−1.1, random
    order) cut to their top ``top_k`` tokens (chain 0) and to their top-p ``top_p`` nucleus
    (chain 1), renormalised; drafts untruncated (tempered, re-ranked), so most drafts are tokens
    of target probability 0 that must be rejected."""
    rng = np.random.default_rng(derive_seed("test-distributions", name, vocab_size, top_k, top_p))
    weights = np.arange(1, vocab_size + 1, dtype=np.float64) ** -1.1
    targets, drafts = [], []
    for cut in ("top-k", "top-p"):
        p = np.stack([weights[rng.permutation(vocab_size)] for _ in range(2)])
        p /= p.sum(axis=1, keepdims=True)
        q = p[:1] ** 0.5
        q[0] = q[0][rng.permutation(vocab_size)] * 0.5 + q[0] * 0.5
        q /= q.sum(axis=1, keepdims=True)
        for row in p:
            order = np.argsort(-row, kind="stable")
            keep = top_k if cut == "top-k" else int(np.searchsorted(np.cumsum(row[order]), top_p) + 1)
            row[order[keep:]] = 0.0
            row /= row.sum()
        targets.append(p)
        drafts.append(q)
    return PositionalBank(np.stack(targets), np.stack(drafts))


@dataclass
class TruncatedVocabularyCheck(StepLawCheck):
    """A step law check whose cells per position are the target's ``top_cells`` most likely
    tokens, one cell for the rest of the target's support, and one cell of expected count 0 for
    every token of target probability 0 (so a single zero-probability token fails it).  Sized
    on all its cells, the zero cells included (slightly conservative: they add no degree of
    freedom)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.cells_per_position = self.top_cells + 2
        self.num_cells = self.bank.num_chains * self.cells_per_position ** self.window[1]
        self.parameters["cells"] = self.num_cells
        self.parameters["zero-probability cell"] = True
        self.parameters["zero-probability tokens"] = int((self.bank.target[:, self.window[0]] == 0).sum())

    def _cell_maps(self) -> np.ndarray:
        bank, (start, length) = self.bank, self.window
        maps = np.full((bank.num_chains, length, bank.vocab_size), self.top_cells, dtype=np.int64)
        for r in range(bank.num_chains):
            for j in range(length):
                law = bank.target[r, start + j]
                top = np.argsort(-law, kind="stable")[: self.top_cells]
                maps[r, j, law == 0] = self.top_cells + 1
                maps[r, j, top] = np.arange(self.top_cells)
        return maps

    def _labels(self, maps: np.ndarray) -> tuple[str, ...]:
        cells, length = self.cells_per_position, self.window[1]
        labels = []
        for r in range(self.bank.num_chains):
            for index in range(cells**length):
                digits = [(index // cells ** (length - 1 - j)) % cells for j in range(length)]
                names = ["rest" if d == self.top_cells else "p=0" if d == self.top_cells + 1
                         else str(int(np.flatnonzero(maps[r, j] == d)[0])) for j, d in enumerate(digits)]
                labels.append(f"chain {r} tokens ({', '.join(names)})")
        return tuple(labels)


RAGGED_WIDTH = 2
"""K of the ragged checks' calls: each row drafts 0, 1 or 2 tokens (0 and K both included)."""

RAGGED_STARTS = (0, 1)
"""Positions in their sequences at which the ragged checks' rows start (the laws differ by position)."""

RAGGED_PATTERN = (1, 5, 64, 3, 257, 17, 1000, 2)
"""Group sizes of the ragged checks' calls: a one-row call, a last row at every offset of the flattened layout."""


def ragged_bank(name: str, vocab_size: int, width: int, starts: tuple[int, ...]) -> PositionalBank:
    """Three context-free chains over ``max(starts) + width + 1`` positions: two random
    (Dirichlet(1) targets and drafts), one greedy request (each target law a point mass on the
    argmax of a Dirichlet(1) draw: a temperature-0 target after processing; random drafts)."""
    rng = np.random.default_rng(derive_seed("test-distributions", name, vocab_size, width, starts))
    positions = max(starts) + width + 1
    target = rng.dirichlet(np.ones(vocab_size), size=(3, positions))
    draft = rng.dirichlet(np.ones(vocab_size), size=(3, positions - 1))
    greedy = np.zeros((positions, vocab_size))
    greedy[np.arange(positions), target[2].argmax(axis=-1)] = 1.0
    target[2] = greedy
    return PositionalBank(target, draft)


@dataclass
class RaggedStepCheck(ChiSquareCheck):
    """One step per row on ragged batches (docs/spec.md §1, ``num_draft_tokens=``): each row draws
    its chain (random or greedy), its start position and its draft count ``k_b`` uniformly, and
    rows of every kind share calls of the sizes in ``pattern``.  Row b's law is the chain's one-step
    law truncated at ``k_b`` drafts, so its first ``k_b + 1`` completed tokens follow the target:
    cells (chain, start, k_b, tokens at positions start..start+k_b), of expected probability
    ``1/(R·S·C) · Π_j p_{start+j}(x_j)`` (R chains, S starts, C draft counts)."""

    name: str
    description: str
    bank: PositionalBank
    width: int
    draft_counts: tuple[int, ...]
    starts: tuple[int, ...]
    pattern: tuple[int, ...]
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        vocab = self.bank.vocab_size
        self.block_sizes = [vocab ** (k + 1) for k in self.draft_counts]
        self.block_starts = np.concatenate([[0], np.cumsum(self.block_sizes)])
        self.cells_per_start = int(self.block_starts[-1])
        self.num_cells = self.bank.num_chains * len(self.starts) * self.cells_per_start
        self.parameters = {"chain": "positional, one greedy chain", "K": self.width, "V": vocab,
                           "chains": self.bank.num_chains, "draft counts": list(self.draft_counts),
                           "starts": list(self.starts), "batch sizes": list(self.pattern), "cells": self.num_cells}

    def _block(self, chain: int, start_index: int, count_index: int) -> int:
        return (chain * len(self.starts) + start_index) * self.cells_per_start + int(self.block_starts[count_index])

    @functools.cached_property
    def cells(self) -> tuple[np.ndarray, tuple[str, ...]]:
        """The expected law of the cells and their labels (fixed before sampling)."""
        expected, labels = np.zeros(self.num_cells), []
        weight = 1.0 / (self.bank.num_chains * len(self.starts) * len(self.draft_counts))
        for chain in range(self.bank.num_chains):
            for start_index, start in enumerate(self.starts):
                for count_index, k in enumerate(self.draft_counts):
                    law = np.ones(1)
                    for j in range(k + 1):
                        law = np.outer(law, self.bank.target[chain, start + j]).reshape(-1)
                    first = self._block(chain, start_index, count_index)
                    expected[first:first + len(law)] = weight * law
                    labels += [f"chain {chain} start {start} k={k} tokens "
                               f"{tuple(int(d) for d in np.unravel_index(i, (self.bank.vocab_size,) * (k + 1)))}"
                               for i in range(len(law))]
        return expected, tuple(labels)

    def cell_counts(self, sample: RaggedSample) -> np.ndarray:
        """Counts of the sampled rows in the cells: each row's first ``k_b + 1`` completed tokens."""
        vocab = self.bank.vocab_size
        start_index = torch.searchsorted(torch.tensor(self.starts), sample.start)
        count_index = torch.searchsorted(torch.tensor(self.draft_counts), sample.num_draft_tokens)
        blocks = torch.tensor([[[self._block(r, s, c) for c in range(len(self.draft_counts))]
                                for s in range(len(self.starts))] for r in range(self.bank.num_chains)])
        code = torch.zeros_like(sample.chain)
        for j in range(self.width + 1):
            code = torch.where(j <= sample.num_draft_tokens, code * vocab + sample.window[:, j], code)
        index = blocks[sample.chain, start_index, count_index] + code
        return torch.bincount(index, minlength=self.num_cells).numpy()

    def cost(self, plan: Plan) -> Cost:
        return step_cost(plan.n, self.width, self.bank.vocab_size)

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        sample = sample_ragged_steps(session.function, self.bank, width=self.width, draft_counts=self.draft_counts,
                                     starts=self.starts, n=n, pattern=self.pattern,
                                     harness_seed=derive_seed(plan.seed, "harness", look),
                                     function_seed=derive_seed(plan.seed, "function", look), where=self.name)
        return Tally(n, {"cells": self.cell_counts(sample)})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        expected, labels = self.cells
        return goodness_of_fit_result(self, plan, tally.counts["cells"], expected, labels, None, level=level, look=look)


@dataclass
class RaggedExactCheck(Check):
    """Exact integration (:func:`specverify.core.exact.step_distribution` with ``width``) of ragged
    rows: each case ``(label, bank, chain, k, prefix)`` a row with ``k`` real drafts among ``width``
    columns of decoy padding, after ``prefix`` (its start position) in a chain of the bank; the law
    must be the chain's one-step law truncated at ``k``.  Cannot flake.  Only for functions that
    take both ``uniforms=`` and ``num_draft_tokens=``."""

    name: str
    description: str
    cases: tuple[tuple[str, PositionalBank, int, int, tuple[int, ...]], ...]
    width: int
    kind: ClassVar[CheckKind] = CheckKind.EXACT
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = 0

    def __post_init__(self) -> None:
        self.parameters = {"K": self.width, "cases": [f"{label} (V={bank.vocab_size}, k={k}, start {len(prefix)})"
                                                      for label, bank, _, k, prefix in self.cases]}

    def run(self, session: Any, plan: Plan) -> CheckResult:
        from specverify.core import exact

        def rule(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None, num_draft_tokens=None):
            try:
                result = session.raw(target_probs, draft_probs, draft_tokens, None, uniforms=uniforms,
                                     num_draft_tokens=num_draft_tokens)
            except Exception as error:
                raise Fault("exception", f"the function (in {self.name}, with uniforms= and num_draft_tokens=) "
                                         f"raised {type(error).__name__}: {error}") from error
            return validate_emitted(result, draft_tokens, target_probs.shape[-1],
                                    num_draft_tokens=num_draft_tokens)[0]

        cases = [ExactCase(label, functools.partial(exact.exact_step_tv, rule, bank.chain(chain), k, prefix,
                                                    width=self.width), self.width, bank.vocab_size)
                 for label, bank, chain, k, prefix in self.cases]
        arithmetic, declared = declared_arithmetic_of(session.function)
        return exact_cases_result(self, plan, cases, 10 * session.timeout_s, arithmetic, declared)


def ragged_checks(exact: bool) -> list[Any]:
    """The ragged-batch checks of a function that takes ``num_draft_tokens=`` (the exact one when
    it also takes ``uniforms=``)."""
    bank = ragged_bank("ragged-drafts", 3, RAGGED_WIDTH, RAGGED_STARTS)
    checks: list[Any] = []
    if exact:
        exact_bank = ragged_bank("exact-ragged-drafts", 3, RAGGED_WIDTH, RAGGED_STARTS)
        checks.append(RaggedExactCheck(
            "exact-ragged-drafts",
            "Ragged rows (num_draft_tokens=) integrated exactly: rows with 0, 1 and K=2 real drafts among K columns "
            "of decoy padding, at positions 0 and 1 of random and greedy chains; each row's law must be its chain's "
            "one-step law truncated at its own draft count.",
            (("random, k=0, start 1", exact_bank, 0, 0, (0,)),
             ("random, k=1, start 0", exact_bank, 1, 1, ()),
             ("random, k=K, start 1", exact_bank, 0, RAGGED_WIDTH, (0,)),
             ("greedy, k=1, start 1", exact_bank, 2, 1, (0,))), RAGGED_WIDTH))
    checks.append(RaggedStepCheck(
        "ragged-drafts",
        "Ragged batches (num_draft_tokens=) as vLLM V1, SGLang and EAGLE verify them: rows with 0, 1 or K=2 drafts, "
        "at positions 0 or 1, random and greedy (point-mass target) requests mixed in calls of 1 to 1000 rows; each "
        "row's first k_b+1 tokens must follow the target.",
        bank, RAGGED_WIDTH, tuple(range(RAGGED_WIDTH + 1)), RAGGED_STARTS, RAGGED_PATTERN))
    return checks


@dataclass
class OutputsUnaliasedCheck(CallLogCheck):
    """After all other checks: no call may overwrite the tensor an earlier call returned."""

    def judge_log(self, plan: Plan, log: CallLog) -> CheckResult:
        if log.aliasing:
            return self.report(plan, Verdict.FAIL, log.aliasing[0], parameters={"calls": log.calls},
                               fault=FaultKind.ALIASING)
        return self.report(plan, Verdict.PASS, f"no call changed an output returned earlier ({log.calls} calls)",
                           parameters={"calls": log.calls})


def coverage_checks() -> list[Any]:
    """The call-pattern and truncated-vocabulary checks, in run order (before the decoding loops)."""
    return [
        GroupedStepCheck(
            "batch-size-1",
            "One row per call (the latency path engines optimise separately): one step with K=2 on two random "
            "chains, positions 0-1 jointly.",
            positional_family_bank("batch-size-1", "random", 4, 2, 2), 2, (0, 2), "random", pattern=(1,)),
        GroupedStepCheck(
            "small-batches",
            "Batches of 2 to 64 rows (engines often take a separate small-batch path): one step with K=2, "
            "positions 0-2 jointly.",
            positional_family_bank("small-batches", "random", 4, 2, 2), 2, (0, 3), "random",
            pattern=(2, 3, 5, 8, 13, 21, 34, 55, 64, 4, 7, 16, 32, 48, 63)),
        GroupedStepCheck(
            "ragged-batches",
            "Batches of awkward sizes (3, 63, 65, 127, 129, 255, 257, 1000, ...) whose rows differ in their "
            "supports (targets and drafts with zeros on different tokens): positions 0-1 jointly with K=3.",
            positional_family_bank("ragged-batches", "zeros", 6, 3, 3), 3, (0, 2), "zeros",
            pattern=(3, 63, 65, 127, 129, 255, 257, 1000, 1, 17, 1023, 1025, 31)),
        TruncatedVocabularyCheck(
            "truncated-vocabulary",
            "An 8192-token vocabulary with targets cut by top-k 50 (chain 0) and top-p 0.9 (chain 1) against "
            "untruncated drafts: the first token, in cells fixed before sampling (7 most likely tokens, the rest "
            "of the support, and one cell for the tokens of probability 0, where a single sample is a certain loss).",
            truncated_bank("truncated-vocabulary", 8192, 50, 0.9), 1, (0, 1), "truncated zipf", 7),
    ]


def late_checks() -> list[Any]:
    """The late-calls check (run after the other statistical checks, when the function has lived longest)."""
    return [
        LateCallsCheck(
            "late-calls",
            f"The law of calls after the function has lived {LATE_CALLS} calls and {LATE_ROWS} rows (a stateful "
            "implementation that drifts fails here): batches of 1, 63 and 4032 rows, K=2, positions 0-1 jointly.",
            positional_family_bank("late-calls", "random", 4, 2, 2), 2, (0, 2), "random", pattern=(1, 63, 4032)),
    ]


def contract_checks() -> list[Any]:
    return [OutputsUnaliasedCheck("outputs-unaliased",
                                  "No call may overwrite a tensor that an earlier call returned (output aliasing).")]
