"""Checks over the request space (:mod:`~specverify.auditing.endpoint.request_space`).

- :class:`CaseLawCheck` (goodness of fit): the randomized PIT of every sampled token under the
  law its request's settings give from the returned logprobs (:mod:`~specverify.auditing.endpoint.pit`),
  tested *per value* of a dimension (a sampling field's value, a prompt length, a prefix pattern,
  a burst size): Pearson goodness of fit of each value's u's in ``PIT_BINS`` equal cells plus one
  cell of probability 0, each at the check's level / (number of values) (Bonferroni), so a loss
  confined to one value is not washed out by the others.  Sized so each value detects TV ε with
  the planned power at its share.
- :class:`PenaltyCheck` (homogeneity; needs a baseline): presence / frequency / repetition
  penalties are engine-defined (which tokens count, prompt included or not, before or after
  temperature), so each penalized request's law is compared with the baseline's under the same
  fields: the number of tokens among the first L that repeat an earlier generated token (the
  statistic penalties move), candidate vs baseline, Pearson χ² homogeneity per field at level /
  (number of fields); sized for TV 2ε between the two servers' repeat-count laws.
- :class:`ChoicesJointCheck` (goodness of fit, two tests at level / 2 each): requests with
  ``n ∈ {2, 4}``, seeded and unseeded; disjoint pairs of choices ((0, 1), (2, 3)).  (a) Joint law:
  at each position the pair (u of one choice, u of the other) is uniform on the unit square when
  the choices are independent draws of the law (Rosenblatt 1952 on the pair), counted in 4 × 4
  cells plus a probability-0 cell; the plug-in dependence TV ½ Σ |P(i, j) − P(i)P(j)| is reported.
  (b) Identical first tokens: under independence the two choices' first tokens agree with
  probability s = Σ_x p(x)² (p the processed law at the prompt, from the logprobs); the count over
  pairs is Poisson-binomial with those s, and its exact upper tail is the p-value (shared random
  numbers make agreement more likely).  The power of (b) is reported from the exact binomial at
  the mean s.
- :class:`StopHandlingCheck` (exact): ``max_tokens`` is exact, ``finish_reason`` is "length" exactly
  when ``max_tokens`` tokens came back, no stop string is returned and nothing follows one, and a
  known end-of-sequence token is the last token of its choice, with ``finish_reason`` "stop".
- :class:`CoverageCheck` (contract, reporting): the coverage table of the request space.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from scipy.stats import fisher_exact

from specverify.auditing.checks import (
    COVERAGE_TABLE,
    POWER,
    Check,
    CheckKind,
    CheckResult,
    Plan,
    SequentialCheck,
    Tally,
    Verdict,
    binomial_detectable_rate,
    level_phrase,
    look_fields,
    monte_carlo_draws,
)
from specverify.auditing.endpoint.bursts import CoBatching, co_batching
from specverify.auditing.endpoint.checks import (
    NEUTRAL_PROCESSING,
    PIT_BINS,
    Prompt,
    request_seed,
)
from specverify.auditing.endpoint.client import Completion
from specverify.auditing.endpoint.pit import (
    ProcessedLaw,
    pit_value,
    processed_law,
    truncated_law,
    uniform_bins,
)
from specverify.auditing.endpoint.request_space import (
    KNOWN_END_TOKENS,
    Case,
    prompt_token_range,
)
from specverify.auditing.isolation.faults import Fault
from specverify.core import stats
from specverify.core.seeding import derive_seed

PAIR_BINS = 4
CHOICE_TOKENS = 8
PENALTY_TOKENS = 8
STOP_STRINGS = (" ", "e", ".", "\n")
STOP_MAX_TOKENS = 24
STOP_REQUESTS = 24
LENGTH_PROBES = (1, 3, 17)


def case_law(case: Case, alternatives: Mapping[str, float], tie: float) -> ProcessedLaw | None:
    """The law of ``case``'s settings at one position from its returned logprobs (None: a
    truncation too close to its threshold to say, :func:`~specverify.auditing.endpoint.pit.truncated_law`)."""
    law = processed_law(alternatives, temperature=case.temperature, top_k=case.top_k)
    if case.top_p < 1.0 or case.min_p > 0.0:
        return truncated_law(law, top_p=case.top_p, min_p=case.min_p, tie_tolerance=tie)
    return law


def pit_fit(counts: np.ndarray, level: float, seed: int) -> Any:
    """Pearson goodness of fit of PIT counts (``PIT_BINS`` equal cells, then the probability-0 cell)."""
    expected = np.append(np.full(PIT_BINS, 1.0 / PIT_BINS), 0.0)
    return stats.goodness_of_fit(counts, expected, seed=seed % (2**32), monte_carlo_draws=monte_carlo_draws(level),
                                 confirm_below=level)


# --------------------------------------------------------------------------------------------
# Per-value PIT
# --------------------------------------------------------------------------------------------


@dataclass
class CaseLawCheck(SequentialCheck):
    """PIT goodness of fit per value of a dimension (module docstring)."""

    name: str
    description: str
    cases: tuple[Case, ...]
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = PIT_BINS

    def __post_init__(self) -> None:
        if not self.cases:
            raise ValueError(f"cases: {self.name} needs at least one value to test")
        self.parameters = {"values": [c.label for c in self.cases], "bins": PIT_BINS,
                           "level per value": f"the look's level / {len(self.cases)} (Bonferroni)",
                           "settings": {c.label: {"temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p,
                                                  "min_p": c.min_p, "seeded": c.seeded, "burst": c.burst,
                                                  "max_tokens": c.max_tokens} for c in self.cases}}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        share = alpha / len(self.cases)
        return len(self.cases) * stats.sample_size_for_tv(epsilon, alpha=share, power=power, num_cells=PIT_BINS)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return stats.detectable_tv(max(1, n // len(self.cases)), alpha=alpha / len(self.cases), power=power,
                                   num_cells=PIT_BINS)

    runs_in_parts: ClassVar[bool] = False  # its evidence starts afresh with each run

    def run(self, session: Any, plan: Plan) -> CheckResult:
        self.prompt_tokens: dict[str, list[int]] = {c.label: [] for c in self.cases}
        self.evidence: dict[str, CoBatching] = {c.label: CoBatching() for c in self.cases}
        result = super().run(session, plan)
        for case in self.cases:
            session.coverage.reached(case.dimension, case.value, self._evidence(case))
            session.coverage.reached("top_k", str(case.top_k), f"PIT under the top-{case.top_k} law ({self.name})")
            if case.seeded:
                session.coverage.reached("seed", "seeded", f"seeded requests ({self.name})")
        return result

    def _evidence(self, case: Case) -> str:
        text = f"PIT of sampled tokens tested; {prompt_token_range(self.prompt_tokens[case.label])}"
        if case.burst is not None and case.burst > 1:
            text += "; " + self.evidence[case.label].describe(case.burst).split(";")[0]
            evidence = self.evidence[case.label]
            if evidence.timed:
                text += f"; server timings overlap in {evidence.overlapped}/{evidence.timed} bursts"
        return text

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        """At least ``n / values`` PIT values per value, each value's requests seeded from the
        plan, the look and the value; its own PIT uniforms."""
        tie = session.greedy_noise.tolerance
        per = math.ceil(n / len(self.cases))
        bins = np.zeros((len(self.cases), PIT_BINS + 1), dtype=np.int64)
        requests = np.zeros(len(self.cases), dtype=np.int64)
        unjudged = np.zeros(len(self.cases), dtype=np.int64)
        batch = max(1, session.candidate.concurrency) * 4
        for index, case in enumerate(self.cases):
            uniforms = np.random.default_rng(derive_seed(plan.seed, self.name, look, index) % (2**32))
            drawn = 0
            while drawn < per:
                count = case.burst or min(batch, math.ceil((per - drawn) / case.max_tokens))
                issued = int(requests[index])
                bodies = [case.body(case.prompts[(issued + i) % len(case.prompts)],
                                    request_seed(plan.seed, self.name, look, index, issued + i)) for i in range(count)]
                completions = session.candidate.complete_many(bodies)
                requests[index] += count
                if case.burst is not None and case.burst > 1:
                    self.evidence[case.label] += co_batching(completions)
                for completion in completions:
                    if completion.prompt_tokens is not None:
                        self.prompt_tokens[case.label].append(completion.prompt_tokens)
                    for token, own in list(zip(completion.tokens, completion.top_logprobs))[:case.max_tokens]:
                        if own is None or len(own) < case.top_k:
                            raise Fault("malformed", f"{self.name}: the candidate returned fewer than top_k = "
                                                     f"{case.top_k} logprobs with a sampled token ({case.label})")
                        law = case_law(case, own, tie)
                        if law is None:
                            unjudged[index] += 1
                            continue
                        u = pit_value(law, token, float(uniforms.random()), tie_tolerance=tie)
                        if u is None:
                            bins[index, PIT_BINS] += 1
                        else:
                            bins[index, :PIT_BINS] += uniform_bins(np.array([u]), PIT_BINS)
                        drawn += 1
                if requests[index] > 4 * per + 10 + (case.burst or 0):
                    raise Fault("malformed", f"{self.name}: {int(requests[index])} requests of {case.label} returned "
                                             f"too few tokens for {per} PIT values")
        return Tally(n, {"bins": bins, "requests": requests, "unjudged": unjudged})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        bins = tally.counts["bins"]
        share = level / len(self.cases)
        fits = [pit_fit(bins[i], share, derive_seed(plan.seed, self.name, "fit", i)) for i in range(len(self.cases))]
        worst = int(np.argmin([f.pvalue for f in fits]))
        adjusted = min(1.0, len(self.cases) * fits[worst].pvalue)
        failed = adjusted <= level
        parts = [f"{c.label}: p {f.pvalue:.3g}, TV {f.empirical_tv:.3f} (n={int(bins[i].sum())}"
                 + (f", {int(bins[i, -1])} of probability 0" if bins[i, -1] else "") + ")"
                 for i, (c, f) in enumerate(zip(self.cases, fits))]
        where = level_phrase(plan, level, look)
        requests = int(tally.counts["requests"].sum())
        unjudged = int(tally.counts["unjudged"].sum())
        if failed:
            case = self.cases[worst]
            message = (f"the sampled tokens of {case.label} do not follow their requests' law: p-value "
                       f"{fits[worst].pvalue:.3g} × {len(self.cases)} values ≤ {where}; estimated TV "
                       f"{fits[worst].empirical_tv:.4f} (the loss is confined to this value of {case.dimension} "
                       f"or largest there)")
        else:
            message = (f"every value consistent with its law (smallest p-value × {len(self.cases)}: "
                       f"{adjusted:.3g} > {where})")
        message += f"; per value: {'; '.join(parts)}; {requests} requests"
        if unjudged:
            message += f"; {unjudged} positions not judged (a top-p / min-p cut within rounding of its threshold)"
        return self.report(plan, Verdict.FAIL if failed else Verdict.PASS, message, n=int(bins[:, :].sum()),
                           statistic=float(fits[worst].statistic), pvalue=adjusted,
                           empirical_tv=float(fits[worst].empirical_tv),
                           observed=tuple(int(c) for c in bins[worst]), calls=requests,
                           cell_labels=tuple(f"u in [{b / PIT_BINS:.1f}, {(b + 1) / PIT_BINS:.1f})"
                                             for b in range(PIT_BINS)) + ("probability 0",),
                           **look_fields(plan, level, look))


# --------------------------------------------------------------------------------------------
# Penalties: same law as the baseline
# --------------------------------------------------------------------------------------------


def repeats(tokens: Sequence[str], length: int) -> int:
    """How many of the first ``length`` tokens repeat a token generated before them."""
    seen: set[str] = set()
    count = 0
    for token in tokens[:length]:
        count += token in seen
        seen.add(token)
    return count


@dataclass
class PenaltyCheck(SequentialCheck):
    """Each penalty field, candidate vs baseline: the law of the number of repeated tokens among
    the first ``PENALTY_TOKENS`` (module docstring)."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]
    penalties: tuple[tuple[str, float], ...]
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = PENALTY_TOKENS

    def __post_init__(self) -> None:
        if not self.penalties:
            raise ValueError(f"penalties: {self.name} needs at least one supported penalty field")
        self.parameters = {"fields": {name: value for name, value in self.penalties}, "temperature": 1.0, "top_k": 8,
                           "max_tokens": PENALTY_TOKENS, "prompts": [p.kind for p in self.prompts],
                           "statistic": "tokens repeating an earlier generated token (0…7)"}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        share = alpha / len(self.penalties)
        return len(self.penalties) * stats.homogeneity_sample_size(min(1.0, 2.0 * epsilon), alpha=share, power=power,
                                                                   num_cells=PENALTY_TOKENS)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return math.sqrt(2.0) * stats.detectable_tv(max(1, n // len(self.penalties)), alpha=alpha / len(self.penalties),
                                                    power=power, num_cells=PENALTY_TOKENS)

    runs_in_parts: ClassVar[bool] = False  # its coverage is recorded after the run

    def run(self, session: Any, plan: Plan) -> CheckResult:
        result = super().run(session, plan)
        for name, value in self.penalties:
            session.coverage.reached("penalties", f"{name}={value}", "repeat-count law compared with the baseline's")
        return result

    def body(self, prompt: Prompt, name: str, value: float, seed: int) -> dict[str, Any]:
        body = dict(NEUTRAL_PROCESSING, prompt=prompt.text, max_tokens=PENALTY_TOKENS, temperature=1.0, top_k=8,
                    top_p=1.0, min_p=0.0, seed=seed, logprobs=1)
        body[name] = value
        return body

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        per = math.ceil(n / len(self.penalties))
        counts = np.zeros((len(self.penalties), 2, PENALTY_TOKENS), dtype=np.int64)
        for index, (name, value) in enumerate(self.penalties):
            for row, (client, role) in enumerate(((session.candidate, "candidate"), (session.baseline, "baseline"))):
                bodies = [self.body(self.prompts[i % len(self.prompts)], name, value,
                                    request_seed(plan.seed, self.name, role, look, index, i)) for i in range(per)]
                for completion in client.complete_many(bodies):
                    counts[index, row, min(repeats(completion.tokens, PENALTY_TOKENS), PENALTY_TOKENS - 1)] += 1
        return Tally(n, {"counts": counts})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        counts = tally.counts["counts"]
        share = level / len(self.penalties)
        tests = [stats.two_sample_test(c[0], c[1], seed=derive_seed(plan.seed, self.name, i) % (2**32),
                                       monte_carlo_draws=monte_carlo_draws(share)) for i, c in enumerate(counts)]
        worst = int(np.argmin([t.pvalue for t in tests]))
        adjusted = min(1.0, len(tests) * tests[worst].pvalue)
        failed = adjusted <= level
        means = [(float(np.arange(PENALTY_TOKENS) @ c[0]) / max(1, c[0].sum()),
                  float(np.arange(PENALTY_TOKENS) @ c[1]) / max(1, c[1].sum())) for c in counts]
        parts = [f"{name}={value}: p {t.pvalue:.3g}, mean repeats candidate {m[0]:.2f} vs baseline {m[1]:.2f}"
                 for (name, value), t, m in zip(self.penalties, tests, means)]
        where = level_phrase(plan, level, look)
        if failed:
            name, value = self.penalties[worst]
            message = (f"with {name}={value} the candidate samples another law than the baseline: p-value "
                       f"{tests[worst].pvalue:.3g} × {len(tests)} fields ≤ {where}; estimated TV "
                       f"{tests[worst].empirical_tv:.4f} (a penalty applied on one path and not the other)")
        else:
            message = (f"candidate and baseline consistent under every penalty (smallest p × {len(tests)}: "
                       f"{adjusted:.3g} > {where})")
        requests = int(counts.sum())
        return self.report(plan, Verdict.FAIL if failed else Verdict.PASS, f"{message}; {'; '.join(parts)}",
                           n=requests, statistic=float(tests[worst].statistic), pvalue=adjusted,
                           empirical_tv=float(tests[worst].empirical_tv), calls=requests,
                           **look_fields(plan, level, look))


# --------------------------------------------------------------------------------------------
# n > 1: the choices' joint law
# --------------------------------------------------------------------------------------------


def poisson_binomial_sf(count: int, probabilities: Sequence[float]) -> float:
    """P(K ≥ count) for K a sum of independent Bernoulli(p_i) (exact convolution)."""
    law = np.zeros(len(probabilities) + 1)
    law[0] = 1.0
    for i, p in enumerate(probabilities):
        law[1:i + 2] = law[1:i + 2] * (1.0 - p) + law[:i + 1] * p
        law[0] *= 1.0 - p
    return float(min(1.0, law[count:].sum()))


def dependence_tv(cells: np.ndarray) -> float:
    """½ Σ |P(i, j) − P(i) P(j)| of a ``PAIR_BINS × PAIR_BINS`` table of counts."""
    total = cells.sum()
    if not total:
        return 0.0
    joint = cells / total
    return 0.5 * float(np.abs(joint - np.outer(joint.sum(axis=1), joint.sum(axis=0))).sum())


@dataclass
class ChoicesJointCheck(SequentialCheck):
    """Requests with ``n`` choices (each of ``choices``), seeded and unseeded in turn: the joint
    law of disjoint pairs of choices (module docstring)."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]
    choices: tuple[int, ...]
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = PAIR_BINS**2

    def __post_init__(self) -> None:
        if not self.choices or any(c < 2 for c in self.choices):
            raise ValueError(f"choices: expected values of n ≥ 2, got {self.choices!r}")
        self.parameters = {"n": list(self.choices), "seeded": [True, False], "temperature": 1.0, "top_k": 8,
                           "max_tokens": CHOICE_TOKENS, "cells": f"{PAIR_BINS}x{PAIR_BINS}",
                           "tests": "joint PIT cells and identical first tokens, each at level / 2"}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        return stats.sample_size_for_tv(epsilon, alpha=alpha / 2, power=power, num_cells=PAIR_BINS**2)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return stats.detectable_tv(n, alpha=alpha / 2, power=power, num_cells=PAIR_BINS**2)

    runs_in_parts: ClassVar[bool] = False  # its agreement starts afresh with each run

    def run(self, session: Any, plan: Plan) -> CheckResult:
        self.agreement: list[float] = []  # Σ p² of each pair's first-token law
        result = super().run(session, plan)
        for count in self.choices:
            session.coverage.reached("n", str(count), "two disjoint choices of each request tested jointly")
        session.coverage.reached("seed", "none (n > 1)", "unseeded n > 1 requests in this check")
        return result

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        uniforms = np.random.default_rng(derive_seed(plan.seed, self.name, "uniforms", look) % (2**32))
        tie = session.greedy_noise.tolerance
        cells = np.zeros(PAIR_BINS**2 + 1, dtype=np.int64)
        identical = np.zeros(2, dtype=np.int64)  # identical first tokens; identical whole choices
        drawn, requests = 0, 0
        while drawn < n:
            shapes = [(self.choices[(requests + i) % len(self.choices)], (requests + i) // len(self.choices) % 2 == 0)
                      for i in range(session.candidate.concurrency)]
            bodies = []
            for i, (count, seeded) in enumerate(shapes):
                body = dict(NEUTRAL_PROCESSING, prompt=self.prompts[(requests + i) % len(self.prompts)].text,
                            max_tokens=CHOICE_TOKENS, temperature=1.0, top_k=8, top_p=1.0, min_p=0.0, n=count,
                            logprobs=8)
                if seeded:
                    body["seed"] = request_seed(plan.seed, self.name, look, requests + i)
                bodies.append(body)
            answers = session.candidate.complete_many_choices(bodies)
            requests += len(bodies)
            for answer in answers:
                for first, second in zip(answer[0::2], answer[1::2]):
                    drawn += self._pair(first, second, uniforms, tie, cells, identical, n - drawn)
            if requests > 4 * n + 10:
                raise Fault("malformed", f"{self.name}: {requests} requests returned too few tokens for {n} pairs")
        return Tally(n, {"cells": cells, "identical": identical, "requests": np.array(requests),
                         "agreement": np.array([len(self.agreement)])})

    def _pair(self, first: Completion, second: Completion, uniforms: np.random.Generator, tie: float,
              cells: np.ndarray, identical: np.ndarray, room: int) -> int:
        """Count one pair of choices; the number of position pairs it added (at most ``room``)."""
        if not first.tokens or not second.tokens or first.top_logprobs[0] is None:
            raise Fault("malformed", f"{self.name}: a choice came back without tokens or logprobs")
        law = processed_law(first.top_logprobs[0], temperature=1.0, top_k=8)
        self.agreement.append(float(np.square(law.probs).sum()))
        identical += (first.tokens[0] == second.tokens[0], first.tokens == second.tokens)
        added = 0
        for position in range(min(len(first.tokens), len(second.tokens), CHOICE_TOKENS)):
            if added >= room:
                break
            us = []
            for choice in (first, second):
                own = choice.top_logprobs[position]
                if own is None or len(own) < 8:
                    raise Fault("malformed", f"{self.name}: fewer than top_k = 8 logprobs with a sampled token")
                us.append(pit_value(processed_law(own, temperature=1.0, top_k=8), choice.tokens[position],
                                    float(uniforms.random()), tie_tolerance=tie))
            first_u, second_u = us
            if first_u is None or second_u is None:
                cells[-1] += 1
            else:
                row, column = (min(int(u * PAIR_BINS), PAIR_BINS - 1) for u in (first_u, second_u))
                cells[row * PAIR_BINS + column] += 1
            added += 1
        return added

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        cells = tally.counts["cells"]
        expected = np.append(np.full(PAIR_BINS**2, 1.0 / PAIR_BINS**2), 0.0)
        fit = stats.goodness_of_fit(cells, expected, seed=plan.seed % (2**32),
                                    monte_carlo_draws=monte_carlo_draws(level / 2), confirm_below=level / 2)
        pairs = int(tally.counts["agreement"][0])
        agreement = self.agreement[:pairs]
        same_first, same_whole = (int(v) for v in tally.counts["identical"])
        expected_same = float(np.sum(agreement))
        identity_p = poisson_binomial_sf(same_first, agreement) if agreement else 1.0
        adjusted = min(1.0, 2.0 * min(fit.pvalue, identity_p))
        failed = adjusted <= level
        mean_s = expected_same / pairs if pairs else 0.0
        detectable = binomial_detectable_rate(pairs, min(mean_s, 0.999), level / 2, POWER) if pairs else math.inf
        where = level_phrase(plan, level, look)
        table = cells[:-1].reshape(PAIR_BINS, PAIR_BINS)
        summary = (f"{pairs} pairs of choices; identical first tokens {same_first} vs {expected_same:.1f} expected "
                   f"under independence (Σ p² from the logprobs; exact p {identity_p:.3g}; at level / 2 an excess "
                   f"of {detectable:.3f} in the agreement rate is detected with power {POWER:g}); joint PIT "
                   f"cells p {fit.pvalue:.3g}, plug-in dependence TV {dependence_tv(table):.3f}; identical whole "
                   f"choices {same_whole}; {int(tally.counts['requests'])} requests")
        if failed:
            which = ("their first tokens agree more often than independent draws do"
                     if identity_p <= fit.pvalue else "their PIT pairs are not uniform on the unit square")
            message = (f"the choices of one request are not independent draws of the law: {which} (p × 2 = "
                       f"{adjusted:.3g} ≤ {where}); {summary}")
        else:
            message = f"choices consistent with independent draws (p × 2 = {adjusted:.3g} > {where}); {summary}"
        return self.report(plan, Verdict.FAIL if failed else Verdict.PASS, message, n=int(cells.sum()),
                           statistic=float(fit.statistic), pvalue=adjusted, empirical_tv=float(fit.empirical_tv),
                           observed=tuple(int(c) for c in cells), calls=int(tally.counts["requests"]),
                           **look_fields(plan, level, look))


# --------------------------------------------------------------------------------------------
# Stop handling
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StopViolation:
    """One broken claim of :class:`StopHandlingCheck`: ``claim`` names which (``"max_tokens"``,
    ``"finish_reason"``, ``"stop string returned"`` (the text ends with its first stop string),
    ``"text after a stop string"``, ``"end token"``), ``detail`` says how."""

    claim: str
    detail: str

    def __str__(self) -> str:
        return self.detail


def stop_violations(completion: Completion, max_tokens: int, stop: Sequence[str]) -> list[StopViolation]:
    """What a choice breaks of :class:`StopHandlingCheck`'s claims."""
    found = []
    tokens = completion.tokens
    if len(tokens) > max_tokens:
        found.append(StopViolation("max_tokens", f"{len(tokens)} tokens for max_tokens={max_tokens}"))
    if completion.finish_reason == "length" and len(tokens) != max_tokens:
        found.append(StopViolation("finish_reason", f"finish_reason 'length' after {len(tokens)} of "
                                                    f"max_tokens={max_tokens} tokens"))
    if completion.finish_reason not in ("length", "stop"):
        found.append(StopViolation("finish_reason", f"finish_reason {completion.finish_reason!r}"))
    if len(tokens) < max_tokens and completion.finish_reason != "stop":
        found.append(StopViolation("finish_reason", f"{len(tokens)} of max_tokens={max_tokens} tokens with "
                                                    f"finish_reason {completion.finish_reason!r}"))
    text = completion.text
    hits = sorted((text.find(s), s) for s in stop if s and s in text)
    if hits:
        start, first = hits[0]
        claim = "stop string returned" if start + len(first) == len(text) else "text after a stop string"
        found.append(StopViolation(claim, f"stop string {first!r} returned in {text!r}"))
    ends = [i for i, t in enumerate(tokens) if t in KNOWN_END_TOKENS]
    if ends and ends[0] != len(tokens) - 1:
        found.append(StopViolation("end token", f"{len(tokens) - 1 - ends[0]} token(s) after the end token "
                                                f"{tokens[ends[0]]!r}"))
    if ends and completion.finish_reason != "stop":
        found.append(StopViolation("end token", f"end token {tokens[ends[0]]!r} with finish_reason "
                                                f"{completion.finish_reason!r}"))
    return found


SHARED_CLAIM_LEVEL = 1e-4
"""Level of the one-sided Fisher test by which a stop claim the baseline also breaks still fails
the candidate that breaks it in more of the same requests (:class:`StopHandlingCheck`)."""


def requests_breaking(per_request: Sequence[Sequence[StopViolation]]) -> Counter[str]:
    """Each claim -> the number of requests whose violations (:func:`stop_violations`, one list
    per request) include it."""
    return Counter(claim for found in per_request for claim in {v.claim for v in found})


def shared_claims(counts: Mapping[str, tuple[int, int]], requests: int) -> set[str]:
    """The claims both servers break about as often: ``counts`` maps a claim to the number of the
    same ``requests`` in which the candidate and the baseline break it; a claim is shared when the
    baseline breaks it at all and the one-sided Fisher test of "the candidate breaks it more often"
    does not reject at :data:`SHARED_CLAIM_LEVEL`."""
    return {claim for claim, (mine, theirs) in counts.items()
            if theirs and fisher_exact([[mine, requests - mine], [theirs, requests - theirs]],
                                       alternative="greater").pvalue > SHARED_CLAIM_LEVEL}


@dataclass
class StopHandlingCheck(Check):
    """``max_tokens`` exact, ``finish_reason`` right, nothing after a stop string or an end token
    (module docstring); ``stop`` is sent only where the server accepts it.

    With a baseline, a failing candidate's requests are sent to the baseline too: a claim the
    baseline breaks as well, in about as many of the same requests, is a bug of the serving layer
    both share, not a loss of speculative decoding, and is reported without failing the check.  The
    check fails on the claims only the candidate breaks, and on a shared claim the candidate breaks
    in more requests than the baseline: Fisher's exact test of the two counts out of the same
    requests, one-sided, at :data:`SHARED_CLAIM_LEVEL` (so a speculation bug cannot hide behind a
    rarer serving bug of the same kind; a correct candidate sharing the bug fails it with
    probability ≤ that level)."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]
    kind: ClassVar[CheckKind] = CheckKind.REQUEST_HANDLING
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.parameters = {"max_tokens probes": list(LENGTH_PROBES), "stop": list(STOP_STRINGS),
                           "stop requests": STOP_REQUESTS, "stop max_tokens": STOP_MAX_TOKENS,
                           "prompts": [p.kind for p in self.prompts]}

    def body(self, prompt: Prompt, max_tokens: int, seed: int, stop: bool) -> dict[str, Any]:
        body = dict(NEUTRAL_PROCESSING, prompt=prompt.text, max_tokens=max_tokens, temperature=1.0, top_k=8,
                    top_p=1.0, min_p=0.0, seed=seed, logprobs=1)
        if stop:
            body["stop"] = list(STOP_STRINGS)
        return body

    @staticmethod
    def violations(shapes: Sequence[tuple[int, bool]], completions: Sequence[Completion]) -> list[list[StopViolation]]:
        """The violations of each request's completion, request by request."""
        return [stop_violations(completion, max_tokens, STOP_STRINGS if stop else ())
                for (max_tokens, stop), completion in zip(shapes, completions)]

    def run(self, session: Any, plan: Plan) -> CheckResult:
        stop_supported = session.fields.get("stop") is None
        shapes = [(m, False) for m in LENGTH_PROBES for _ in self.prompts[:3]]
        if stop_supported:
            shapes += [(STOP_MAX_TOKENS, True)] * STOP_REQUESTS
        bodies = [self.body(self.prompts[i % len(self.prompts)], m, request_seed(plan.seed, self.name, i), stop)
                  for i, (m, stop) in enumerate(shapes)]
        completions = session.candidate.complete_many(bodies)
        reasons: dict[str, int] = {}
        stopped, ends = 0, 0
        for (_, stop), completion in zip(shapes, completions):
            reasons[completion.finish_reason] = reasons.get(completion.finish_reason, 0) + 1
            stopped += stop and completion.finish_reason == "stop"
            ends += any(t in KNOWN_END_TOKENS for t in completion.tokens)
        per_request = self.violations(shapes, completions)
        violations = [violation for found in per_request for violation in found]
        session.coverage.reached("stop", "max_tokens exact", f"max_tokens {list(LENGTH_PROBES)}: finish reasons "
                                                             f"{dict(sorted(reasons.items(), key=str))}")
        if stop_supported:
            session.coverage.reached("stop", "stop strings",
                                     f"{stopped}/{STOP_REQUESTS} requests ended by a stop string")
        if ends:
            session.coverage.reached("stop", "end token", f"{ends} choices returned a known end token")
        else:
            session.coverage.missing("stop", "end token", "no known end token was returned in this check's requests "
                                                          "(the model never ended within max_tokens)")
        covered = f"{len(bodies)} requests ({stopped} ended by a stop string, finish reasons {reasons})"
        calls = len(bodies)
        shared: list[StopViolation] = []
        if violations and session.baseline is not None:
            mine = requests_breaking(per_request)
            theirs = requests_breaking(self.violations(shapes, session.baseline.complete_many(bodies)))
            calls += len(bodies)
            counts = {claim: (mine[claim], theirs[claim]) for claim in mine}
            alike = shared_claims(counts, len(bodies))
            shared = [v for v in violations if v.claim in alike]
            violations = [v for v in violations if v.claim not in alike]
        if shared:
            claims = sorted({v.claim for v in shared})
            breaking = ", ".join(f"{claim} in {counts[claim][0]} vs {counts[claim][1]} of {len(bodies)} requests"
                                 for claim in claims)
            note = (f"the baseline server breaks the same claim(s) as often on the same request bodies ({breaking}): "
                    f"a bug of the serving layer both share, not of speculative decoding (e.g. {shared[0]})")
            session.notes.append(f"stop-handling: {note}")
            covered += f"; {note}"
        if violations:
            whose = " that the baseline does not share" if session.baseline is not None else ""
            return self.report(plan, Verdict.FAIL, f"{len(violations)} violation(s) of stop / length handling{whose}: "
                                                   f"{'; '.join(map(str, violations[:4]))}; {covered}", calls=calls)
        if shared:
            return self.report(plan, Verdict.PASS, f"no violation of the candidate's own: {covered}", calls=calls)
        return self.report(plan, Verdict.PASS, f"max_tokens exact, finish_reason right, nothing after a stop: "
                                               f"{covered}", calls=calls)


# --------------------------------------------------------------------------------------------
# The coverage table
# --------------------------------------------------------------------------------------------

@dataclass
class CoverageCheck(Check):
    """The coverage table of the request space (run last, whatever stopped the checks before it;
    passes: it reports, it does not judge)."""

    name: str
    description: str
    kind: ClassVar[CheckKind] = CheckKind.CONTRACT
    calls_nothing: ClassVar[bool] = True
    parameters: dict[str, Any] = field(default_factory=dict)

    def run(self, session: Any, plan: Plan) -> CheckResult:
        coverage = session.coverage
        rows = coverage.as_list()
        missing = sum(len(r["not covered"]) for r in rows)
        message = (f"request space: {sum(len(r['reached']) for r in rows)} values reached, {missing} not covered\n"
                   + coverage.table())
        return self.report(plan, Verdict.PASS, message, parameters={COVERAGE_TABLE: rows})


__all__ = ["CaseLawCheck", "ChoicesJointCheck", "CoverageCheck", "PenaltyCheck", "StopHandlingCheck", "StopViolation",
           "case_law", "dependence_tv", "poisson_binomial_sf", "repeats", "requests_breaking", "shared_claims",
           "stop_violations"]
