"""Token-level goodness of fit at fixed contexts: the first sampled tokens of fixed prompts.

The PIT checks pool every sampled token into 10 cells of u, ordered by each law's own ranks.  A
deviation whose direction changes from context to context (one token gains here, loses there)
averages out in those cells: on the endpoint toy, a server whose drafts and acceptance tests share
their random numbers (generators re-created from (seed, step)) moves the first token of each step
by TV 0.06–0.09 on average (``benchmarks/toy_seed_step_tv.py``), yet passes both PIT checks at the
``standard`` budget (TV 0.05; p = 0.14 and 0.70).  Counting tokens per context keeps every
deviation.

Design: requests of ``L = 2`` tokens on fixed prompts (position 0 is the prefill's token on
engines that start speculating after it; position 1 is the first speculative token there; on a
server that drafts from the prompt both are).  A *context* is (prompt, tokens before the
position): one per prompt at position 0, one per (prompt, first token) at position 1, at most
``P (1 + k)`` of them with top-k ``k``.  At each context the tokens are counted against the laws
returned with them (each visit's processed law, as the PIT uses them: the law the server
computed at that prefix), and the test is the Pearson statistic summed over contexts,

    X² = Σ_c Σ_groups (O − E)² / E,   E = Σ_{visits of c} p_visit(token group),

with each context's cells pooled by expected count (:func:`specverify.core.stats.pool_cells`),
against χ² with Σ_c (groups_c − 1) degrees of freedom: the test of known transition laws of a
Markov chain (Anderson & Goodman 1957, "Statistical inference about Markov chains", §3.2), here
with the laws each visit reports (visits of one context whose returned laws differ by rounding
only make X² smaller than χ²: the variance of a sum of Bernoulli draws is at most that of a
binomial with their mean).  A token of probability 0 under its own law is a certain loss.

Assumption, shared with the PIT and sharper here: the law returned with a token is the law the
server drew it from (engines sample from the logits they evaluated and return logprobs from the
same logits).  A server returning logprobs from another evaluation fails this check by that
evaluation's rounding: measured on the endpoint toy with returned logprobs perturbed by
N(0, 0.1²) nats per context but tokens drawn from the exact law, it failed at ``standard``.

Power: under an alternative where the token at a visit of c is drawn from q_c, the
noncentrality is Σ_c n_c χ²(q_c ‖ p_c) ≥ 4 Σ_c n_c TV_c² ≥ 4 M ε̄² (Cauchy–Schwarz, then
Jensen), with M = Σ_c n_c tokens and ε̄ their visit-weighted mean TV: the one-sample bound of
:func:`specverify.core.stats.power_at` with M samples and ``1 + P(1 + k)(k − 1)`` cells (the
largest number of degrees of freedom the contexts can have, plus one).  The check is sized in
tokens; each request gives L.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from scipy import stats as sps

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
from specverify.auditing.endpoint.checks import NEUTRAL_PROCESSING, Prompt, request_seed
from specverify.auditing.endpoint.client import Completion
from specverify.auditing.endpoint.pit import ProcessedLaw, processed_law
from specverify.auditing.isolation.faults import Fault
from specverify.core import stats

CONTEXT_TOKENS = 2
MIN_EXPECTED = 5.0
"""Cells of one context are pooled until each group's expected count reaches this (Cochran)."""


def context_cells(prompts: int, top_k: int) -> int:
    """Planning cells: 1 + the largest total degrees of freedom, P (1 + k) contexts of k cells."""
    return 1 + prompts * (1 + top_k) * (top_k - 1)


@dataclass(frozen=True)
class StratifiedFit:
    """Pearson statistic summed over contexts; ``pvalue`` from χ²(dof); ``impossible``: tokens of
    probability 0 (p-value 0); ``empirical_tv``: visit-weighted plug-in TV of the contexts' pooled
    cells (diagnosis); ``contexts``: contexts with at least two groups (the others add nothing)."""

    statistic: float
    dof: int
    pvalue: float
    impossible: int
    empirical_tv: float
    contexts: int
    worst: str


def stratified_fit(observed: Mapping, expected: Mapping, impossible: int) -> StratifiedFit:
    """The test of the module docstring on ``observed[context][token]`` counts and ``expected[context][token]``
    sums of the visits' probabilities."""
    statistic, dof, contexts, weighted_tv, visits = 0.0, 0, 0, 0.0, 0
    worst, worst_gap = "", 0.0
    for context in sorted(expected, key=repr):
        tokens = sorted(expected[context])
        e = np.array([expected[context][t] for t in tokens])
        o = np.array([observed[context].get(t, 0) for t in tokens], dtype=np.float64)
        n = o.sum()
        groups = stats.pool_cells(e, MIN_EXPECTED)
        pooled_o = np.array([o[g].sum() for g in groups])
        pooled_e = np.array([e[g].sum() for g in groups])
        visits += int(n)
        weighted_tv += 0.5 * float(np.abs(pooled_o - pooled_e).sum())
        if len(groups) < 2:
            continue
        contexts += 1
        statistic += float(((pooled_o - pooled_e) ** 2 / pooled_e).sum())
        dof += len(groups) - 1
        at = int(np.argmax(np.abs(o - e)))
        if abs(o[at] - e[at]) / max(n, 1.0) > worst_gap:
            worst_gap = abs(o[at] - e[at]) / max(n, 1.0)
            worst = f"{context_label(context)} → {tokens[at]!r}: {int(o[at])} observed, {e[at]:.1f} expected"
    if impossible:
        pvalue = 0.0
    else:
        pvalue = float(sps.chi2.sf(statistic, dof)) if dof else 1.0
    return StratifiedFit(statistic, dof, pvalue, impossible, weighted_tv / visits if visits else 0.0, contexts, worst)


def context_label(context: tuple[str, ...]) -> str:
    prompt, *before = context
    return f"{prompt} + {''.join(before)!r}" if before else f"{prompt}"


@dataclass
class ContextCounts:
    """Running per-context counts of sampled tokens and the sums of their visits' laws (module
    docstring): ``observed[context][token]``, ``expected[context][token]``, and the tokens of
    probability 0 under their own law (``impossible``, each as "context → token")."""

    observed: defaultdict[tuple[str, ...], Counter] = field(default_factory=lambda: defaultdict(Counter))
    expected: defaultdict[tuple[str, ...], defaultdict[str, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    impossible: list[str] = field(default_factory=list)

    def add(self, context: tuple[str, ...], token: str, law: ProcessedLaw, tie: float) -> None:
        """Count ``token`` sampled at ``context`` under ``law`` (the processed law returned with it);
        a token just below the k-th rank within ``tie`` nats counts as the k-th (:func:`pit_value`'s rule)."""
        counted = token if token in law.tokens else None
        if counted is None and token in law.tail and law.boundary - law.tail[token] <= tie:
            counted = law.tokens[-1]
        if counted is None:
            self.impossible.append(f"{context_label(context)} → {token!r}")
            return
        self.observed[context][counted] += 1
        for candidate, probability in zip(law.tokens, law.probs):
            self.expected[context][candidate] += probability

    def fit(self) -> StratifiedFit:
        return stratified_fit(self.observed, self.expected, len(self.impossible))


def sampled_contexts(check: str, prompt: Prompt, completion: Completion, temperature: float, top_k: int,
                     length: int) -> list[tuple[tuple[str, ...], str, ProcessedLaw]]:
    """(context, token, processed law returned with it) of the first ``length`` tokens of
    ``completion`` on ``prompt``: the context is (prompt kind, tokens before the position)."""
    found = []
    context: tuple[str, ...] = (prompt.kind,)
    for token, own in list(zip(completion.tokens, completion.top_logprobs))[:length]:
        if own is None or len(own) < top_k:
            raise Fault("malformed", f"{check}: the candidate returned fewer than top_k = {top_k} logprobs with a "
                                     "sampled token")
        found.append((context, token, processed_law(own, temperature=temperature, top_k=top_k)))
        context = context + (token,)
    return found


@dataclass
class ContextLawCheck(SequentialCheck):
    """Temperature T, top-k k, the first ``CONTEXT_TOKENS`` tokens of fixed prompts, counted per
    context against the laws returned with them (module docstring)."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]
    temperature: float
    top_k: int
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = 0

    def __post_init__(self) -> None:
        self.num_cells = context_cells(len(self.prompts), self.top_k)
        self.parameters = {"temperature": self.temperature, "top_k": self.top_k, "top_p": 1.0, "min_p": 0.0,
                           "max_tokens": CONTEXT_TOKENS, "prompts": [p.kind for p in self.prompts],
                           "planning cells": self.num_cells}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        return stats.sample_size_for_tv(epsilon, alpha=alpha, power=power, num_cells=self.num_cells)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return stats.detectable_tv(n, alpha=alpha, power=power, num_cells=self.num_cells)

    def body(self, prompt: Prompt, seed: int) -> dict[str, Any]:
        return dict(NEUTRAL_PROCESSING, prompt=prompt.text, max_tokens=CONTEXT_TOKENS, temperature=self.temperature,
                    top_k=self.top_k, top_p=1.0, min_p=0.0, seed=seed, logprobs=max(self.top_k, 8))

    runs_in_parts: ClassVar[bool] = False  # its counts start afresh with each run

    def run(self, session: Any, plan: Plan) -> CheckResult:
        self.counts = ContextCounts()
        return super().run(session, plan)

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        """``n`` more tokens (``n / L`` requests, prompts in turn, seeds of their own), added to
        the check's running per-context counts (a look's tally says how many)."""
        tie = session.greedy_noise.tolerance
        drawn, issued = 0, 0
        batch = max(1, session.candidate.concurrency) * 4
        while drawn < n:
            count = min(batch, max(1, math.ceil((n - drawn) / CONTEXT_TOKENS)))
            prompts = [self.prompts[(issued + i) % len(self.prompts)] for i in range(count)]
            bodies = [self.body(p, request_seed(plan.seed, "context", look, issued + i)) for i, p in enumerate(prompts)]
            completions = session.candidate.complete_many(bodies)
            issued += count
            for prompt, completion in zip(prompts, completions):
                for context, token, law in sampled_contexts(self.name, prompt, completion, self.temperature,
                                                            self.top_k, max(0, min(CONTEXT_TOKENS, n - drawn))):
                    self.counts.add(context, token, law, tie)
                    drawn += 1
            if issued > 4 * n + 10:
                raise Fault("malformed", f"{self.name}: {issued} requests returned too few tokens for {n} samples")
        return Tally(n, {"requests": np.array(issued)})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        fit = self.counts.fit()
        failed = fit.pvalue <= level
        where = level_phrase(plan, level, look)
        if fit.impossible:
            message = (f"emitted {fit.impossible} token(s) of probability 0 under their own request's law "
                       f"({'; '.join(self.counts.impossible[:3])}): certain loss")
        elif failed:
            message = (f"the sampled tokens do not follow the laws returned with them at fixed contexts: p-value "
                       f"{fit.pvalue:.3g} ≤ {where} (X² {fit.statistic:.1f} on {fit.dof} dof over {fit.contexts} "
                       f"contexts); visit-weighted TV {fit.empirical_tv:.4f}; largest deviation: {fit.worst} (the "
                       f"check takes the law returned with each token as the law it was drawn from, as the PIT "
                       f"does: a server that returns logprobs from another evaluation than the one it samples "
                       f"from would fail it by that evaluation's rounding)")
        else:
            message = (f"consistent with the laws returned at each context (p-value {fit.pvalue:.3g} > {where}; "
                       f"X² {fit.statistic:.1f} on {fit.dof} dof over {fit.contexts} contexts)")
        requests = int(tally.counts["requests"])
        message += f"; {requests} requests of {CONTEXT_TOKENS} tokens"
        return self.report(plan, Verdict.FAIL if failed else Verdict.PASS, message, n=tally.n,
                           statistic=float(fit.statistic), pvalue=float(fit.pvalue),
                           empirical_tv=float(fit.empirical_tv), calls=requests, **look_fields(plan, level, look))


__all__ = ["CONTEXT_TOKENS", "ContextCounts", "ContextLawCheck", "StratifiedFit", "context_cells", "sampled_contexts",
           "stratified_fit"]
