"""Load thresholds: the law of sampled tokens on each side of a batch-size threshold.

An engine may change its path with the number of requests it verifies together: vLLM switches
speculation off above ``--speculative-disable-by-batch-size``, a kernel may take another branch
for wide batches, and a bug may live only in verification steps shared by several requests (rows
of the batched call mixed).  A loss confined to those steps is diluted twice by a pooled PIT:
over the positions of a request, of which only some fall in shared steps, and over contexts,
where a deviation whose direction changes from context to context averages out in the PIT's
cells (:mod:`~specverify.auditing.endpoint.context_law`).

The check (``space-load``) sends, for each *side* — bursts of exactly s concurrent requests for
s = 1, 2, 4, …, ``concurrency``, then 1 again (:func:`~specverify.auditing.endpoint.request_space.load_cases`)
— requests of 8 sampled tokens (T = 1, top-k 4) on fixed prompts, each row of a burst with its
own prompt in turn and its own seed.  Requests sent together are admitted together, so their
first tokens come from the steps they share (the first verification step, or the prefill and the
first step).  Each side is judged by two tests, each at the look's level / (2 × number of sides)
(Bonferroni over sides and tests):

- *context*: the first ``CONTEXT_TOKENS = 2`` tokens counted per context (prompt, earlier token)
  against the laws returned with them, the Pearson statistic summed over contexts
  (:func:`~specverify.auditing.endpoint.context_law.stratified_fit`): a deviation in the first
  shared step is kept whatever its direction in each context;
- *PIT*: the randomized PIT of all 8 tokens in ``PIT_BINS`` cells plus one of probability 0
  (:mod:`~specverify.auditing.endpoint.pit`): a loss at later positions (a bonus token drawn after
  K accepted drafts sits at position K or later, out of the first two).

The side is sized for the context test (a visit-weighted mean TV ε per token with power 0.99 at
its share, the bound of the context-law check with its cells); its requests give the PIT test
four times the u's, which detects TV ε on its cells at that share with room to spare.

Comparing the sides: the report gives each side's p-value, X² and plug-in TV, the co-batching
the audit saw (:func:`~specverify.auditing.endpoint.bursts.co_batching`) and, where the server
returns llama.cpp-style ``timings``, the drafted tokens per request: a side where the counters
show no drafts ran without speculation, and is judged all the same (the non-speculative path
must be lossless too).  A failure names the sides that fail and those that pass, which places
the threshold.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from specverify.auditing.checks import (
    CheckKind,
    CheckResult,
    Plan,
    SequentialCheck,
    Tally,
    Verdict,
    level_phrase,
    look_fields,
)
from specverify.auditing.endpoint.bursts import CoBatching, co_batching
from specverify.auditing.endpoint.checks import PIT_BINS, request_seed
from specverify.auditing.endpoint.client import Completion
from specverify.auditing.endpoint.context_law import CONTEXT_TOKENS, ContextCounts, context_cells, sampled_contexts
from specverify.auditing.endpoint.pit import pit_value, uniform_bins
from specverify.auditing.endpoint.request_space import Case
from specverify.auditing.endpoint.space_checks import pit_fit
from specverify.auditing.isolation.faults import Fault
from specverify.core import stats
from specverify.core.seeding import derive_seed

TESTS_PER_SIDE = 2


def drafted_tokens(completion: Completion) -> int | None:
    """The drafted tokens of a request by the server's own counters (llama.cpp ``timings.draft_n``), or None."""
    value = (completion.timings or {}).get("draft_n")
    return int(value) if isinstance(value, (int, float)) else None


@dataclass
class LoadThresholdCheck(SequentialCheck):
    """Per side of the load dimension (a burst size), the first sampled tokens counted per context
    against the laws returned with them (module docstring)."""

    name: str
    description: str
    sides: tuple[Case, ...]
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = 0

    def __post_init__(self) -> None:
        if not self.sides or any(side.burst is None for side in self.sides):
            raise ValueError(f"sides: {self.name} needs cases with a burst size each (load_cases), got "
                             f"{[side.label for side in self.sides]!r}")
        first = self.sides[0]
        if any(dataclasses.replace(side, value=first.value, burst=first.burst) != first for side in self.sides):
            raise ValueError(f"sides: {self.name} compares sides that differ only in their burst size")
        self.num_cells = context_cells(len(first.prompts), first.top_k)
        self.parameters = {"sides": [side.value for side in self.sides], "temperature": first.temperature,
                           "top_k": first.top_k, "max_tokens": first.max_tokens, "context tokens": CONTEXT_TOKENS,
                           "prompts": [p.kind for p in first.prompts], "planning cells per side": self.num_cells,
                           "level per test": f"the look's level / {TESTS_PER_SIDE * len(self.sides)} (context and "
                                             "PIT test per side, Bonferroni)"}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        """Context tokens (the first two of each request) over all sides."""
        share = alpha / (TESTS_PER_SIDE * len(self.sides))
        return len(self.sides) * stats.sample_size_for_tv(epsilon, alpha=share, power=power, num_cells=self.num_cells)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        """The context test's TV (the PIT test's u's are ``max_tokens / 2`` times as many on fewer cells)."""
        return stats.detectable_tv(max(1, n // len(self.sides)), alpha=alpha / (TESTS_PER_SIDE * len(self.sides)),
                                   power=power, num_cells=self.num_cells)

    runs_in_parts: ClassVar[bool] = False  # its counts start afresh with each run

    def run(self, session: Any, plan: Plan) -> CheckResult:
        self.counts = [ContextCounts() for _ in self.sides]
        self.evidence = [CoBatching() for _ in self.sides]
        self.requests, self.drafted, self.timed = (np.zeros(len(self.sides), dtype=np.int64) for _ in range(3))
        result = super().run(session, plan)
        for index, side in enumerate(self.sides):
            session.coverage.reached(side.dimension, side.value, self._evidence(index, result))
        return result

    def _evidence(self, index: int, result: CheckResult) -> str:
        side = self.sides[index]
        text = f"first {CONTEXT_TOKENS} tokens per context and the PIT of {side.max_tokens} tested"
        if side.burst and side.burst > 1:
            text += "; " + self.evidence[index].describe(side.burst).split(";")[0]
            if self.evidence[index].timed:
                text += (f"; server timings overlap in {self.evidence[index].overlapped}/"
                         f"{self.evidence[index].timed} bursts")
        drafted = self.drafted_text(index)
        return text + (f"; {drafted}" if drafted else "")

    def drafted_text(self, index: int) -> str:
        """The speculation counters of a side's requests, where every response carried them."""
        requests, drafted = int(self.requests[index]), int(self.drafted[index])
        if self.timed[index] < requests or not requests:
            return ""
        if not drafted:
            return "the server's counters show no drafted token: speculation off at this size"
        return f"{drafted / requests:.2f} drafted tokens per request (the server's counters)"

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        """At least ``n / sides`` more context tokens per side, the sides in order; each side's
        bursts of exactly its size, rows with prompts in turn and seeds of their own (plan, look,
        side, request); the PIT values of every token with uniforms of their own (plan, look, side)."""
        tie = session.greedy_noise.tolerance
        per = math.ceil(n / len(self.sides))
        requests = np.zeros(len(self.sides), dtype=np.int64)
        bins = np.zeros((len(self.sides), PIT_BINS + 1), dtype=np.int64)
        for index, side in enumerate(self.sides):
            size = int(side.burst or 1)
            uniforms = np.random.default_rng(derive_seed(plan.seed, self.name, "pit", look, index) % (2**32))
            drawn = 0
            while drawn < per:
                issued = int(self.requests[index])
                prompts = [side.prompts[(issued + r) % len(side.prompts)] for r in range(size)]
                bodies = [side.body(prompt, request_seed(plan.seed, self.name, look, index, issued + r))
                          for r, prompt in enumerate(prompts)]
                completions = session.candidate.complete_many(bodies)
                requests[index] += size
                self.requests[index] += size
                if size > 1:
                    self.evidence[index] += co_batching(completions)
                for prompt, completion in zip(prompts, completions):
                    count = drafted_tokens(completion)
                    if count is not None:
                        self.drafted[index] += count
                        self.timed[index] += 1
                    sampled = sampled_contexts(self.name, prompt, completion, side.temperature, side.top_k,
                                               side.max_tokens)
                    for context, token, law in sampled[:CONTEXT_TOKENS]:
                        self.counts[index].add(context, token, law, tie)
                        drawn += 1
                    for _, token, law in sampled:
                        u = pit_value(law, token, float(uniforms.random()), tie_tolerance=tie)
                        if u is None:
                            bins[index, PIT_BINS] += 1
                        else:
                            bins[index, :PIT_BINS] += uniform_bins(np.array([u]), PIT_BINS)
                if requests[index] > 4 * per + 10 + size:
                    raise Fault("malformed", f"{self.name}: {int(requests[index])} requests of {side.label} returned "
                                             f"too few tokens for {per} samples")
        return Tally(n, {"requests": requests, "bins": bins})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        contexts = [counts.fit() for counts in self.counts]
        bins = tally.counts["bins"]
        tests = TESTS_PER_SIDE * len(self.sides)
        pits = [pit_fit(bins[i], level / tests, derive_seed(plan.seed, self.name, "fit", i))
                for i in range(len(self.sides))]
        side_p = [min(c.pvalue, p.pvalue) for c, p in zip(contexts, pits)]
        worst = int(np.argmin(side_p))
        adjusted = min(1.0, tests * side_p[worst])
        failed = adjusted <= level
        parts = []
        for index, (side, fit, pit) in enumerate(zip(self.sides, contexts, pits)):
            part = (f"{side.value}: context p {fit.pvalue:.3g} (X² {fit.statistic:.1f} on {fit.dof} dof, TV "
                    f"{fit.empirical_tv:.3f}), PIT p {pit.pvalue:.3g} (TV {pit.empirical_tv:.3f}, n "
                    f"{int(bins[index].sum())})")
            if fit.impossible or bins[index, PIT_BINS]:
                part += (f", {int(bins[index, PIT_BINS])} token(s) of probability 0 "
                         f"({'; '.join(self.counts[index].impossible[:2])})")
            drafted = self.drafted_text(index)
            parts.append(part + (f", {drafted}" if drafted else ""))
        where = level_phrase(plan, level, look)
        if failed:
            failing = [s.value for s, p in zip(self.sides, side_p) if p <= level / tests]
            passing = [s.value for s, p in zip(self.sides, side_p) if p > level / tests]
            context, pit = contexts[worst], pits[worst]
            which = (f"per context (visit-weighted TV {context.empirical_tv:.4f}; largest deviation: {context.worst})"
                     if context.pvalue <= pit.pvalue else f"in the PIT of all its tokens (TV {pit.empirical_tv:.4f})")
            message = (f"the sampled tokens do not follow the laws returned with them at {', '.join(failing)}: "
                       f"p-value {side_p[worst]:.3g} × {tests} tests ≤ {where}, {which}")
            if passing:
                message += (f"; the other sides pass their own tests ({', '.join(passing)}): the loss is on one side "
                            f"of a batch-size threshold (a path switched by the number of requests verified together)")
        else:
            message = (f"every side consistent with the laws returned with its tokens (smallest p-value × {tests}: "
                       f"{adjusted:.3g} > {where})")
        requests = int(tally.counts["requests"].sum())
        message += f"; per side: {'; '.join(parts)}; {requests} requests of {self.sides[0].max_tokens} tokens"
        statistic = contexts[worst].statistic if contexts[worst].pvalue <= pits[worst].pvalue else pits[worst].statistic
        return self.report(plan, Verdict.FAIL if failed else Verdict.PASS, message, n=tally.n,
                           statistic=float(statistic), pvalue=adjusted,
                           empirical_tv=float(max(contexts[worst].empirical_tv, pits[worst].empirical_tv)),
                           calls=requests, **look_fields(plan, level, look))


__all__ = ["LoadThresholdCheck", "drafted_tokens"]
