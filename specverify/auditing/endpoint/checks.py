"""The endpoint level's checks (see :mod:`specverify.auditing.endpoint.battery` for the battery).

Each check has the :class:`specverify.auditing.sampler.battery.Check` shape: ``run(session, plan)``
returns a :class:`~specverify.auditing.sampler.battery.CheckResult` or raises a
:class:`~specverify.auditing.isolation.faults.Fault` (the server failed: "could not audit").
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from specverify.auditing.checks import (
    Check,
    CheckKind,
    CheckResult,
    Plan,
    SequentialCheck,
    Tally,
    Verdict,
    goodness_of_fit_result,
    level_phrase,
    look_fields,
    monte_carlo_draws,
)
from specverify.auditing.endpoint.client import Completion, EndpointClient
from specverify.auditing.endpoint.greedy import (
    LOGPROB_TOLERANCE,
    SAME_LAW_ALPHA,
    agreed_deviations,
    curl_command,
    first_difference,
    greedy_tolerance,
    length_difference,
    position_deviations,
    same_law_test,
    scored_row,
    top_two_margin,
)
from specverify.auditing.endpoint.pit import pit_value, plug_in_tv, processed_law, uniform_bins
from specverify.auditing.isolation.faults import Fault
from specverify.core import stats
from specverify.core.greedy_identity import IdentityResult, judge
from specverify.core.seeding import derive_seed

PIT_BINS = 10
"""Equal cells of [0, 1) the PIT values are counted in."""

GREEDY_LOGPROBS = 5

@dataclass(frozen=True)
class Prompt:
    kind: str
    text: str


def request_seed(plan_seed: int, *parts: object) -> int:
    """A per-request ``seed`` field (31 bits: every engine accepts it)."""
    return derive_seed(plan_seed, *parts) % (2**31)


NEUTRAL_PROCESSING: dict[str, float] = {"repeat_penalty": 1.0, "repetition_penalty": 1.0,
                                         "presence_penalty": 0.0, "frequency_penalty": 0.0}
"""Sent wherever the law is read from raw logprobs: engine defaults such as llama.cpp's
repeat_penalty 1.1 would otherwise reshape it (``repeat_penalty``: llama.cpp; ``repetition_penalty``:
vLLM, SGLang; servers ignore the name they do not know)."""


def greedy_body(prompt: Prompt, length: int) -> dict[str, Any]:
    return dict(NEUTRAL_PROCESSING, prompt=prompt.text, max_tokens=length, temperature=0.0, logprobs=GREEDY_LOGPROBS)


# --------------------------------------------------------------------------------------------
# Greedy identity and batch invariance
# --------------------------------------------------------------------------------------------


@dataclass
class GreedyPromptsCheck(Check):
    """A check of fixed-length greedy completions of ``prompts`` (``length`` tokens each), alone
    and in bursts of ``burst`` concurrent copies."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]
    length: int
    burst: int
    kind: ClassVar[CheckKind] = CheckKind.EXACT
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.parameters = {"prompts": [p.kind for p in self.prompts], "max_tokens": self.length,
                           "burst": self.burst}


@dataclass
class GreedyIdentityCheck(GreedyPromptsCheck):
    """Temperature 0: every token of the candidate's completions is the baseline's argmax given the
    candidate's own prefix (the baseline's ``echo`` re-scoring), except at near-ties within the
    tolerance, and no more of them differ than the baseline's own tokens under its echo
    (:mod:`specverify.auditing.endpoint.greedy`).  Without a baseline: every greedy token is the
    top-1 of the candidate's own returned law."""

    def run(self, session: Any, plan: Plan) -> CheckResult:
        bodies = [greedy_body(p, self.length) for p in self.prompts]
        candidate = [session.candidate.complete(b) for b in bodies]  # alone, one after another
        session.greedy_alone = candidate
        reference_client = session.baseline or session.candidate
        reference = [reference_client.complete(b) for b in bodies] if session.baseline else candidate
        # Repeats in reverse order, and under load in a rotated order: each request follows a different one
        # than before, so prefix caches and batch composition change as they do in service.
        repeat = [reference_client.complete(b) for b in bodies[::-1]][::-1]
        rotated = bodies[1:] + bodies[:1]
        loaded_rotated = reference_client.complete_many(rotated * self.burst)[: len(bodies)]
        loaded = loaded_rotated[-1:] + loaded_rotated[:-1]
        noise = [d for a, b in list(zip(reference, repeat)) + list(zip(reference, loaded))
                 for d in agreed_deviations(a, b)]
        echoed = session.baseline_laws(bodies * 2, reference + candidate)  # one batch: reference, candidate
        reference_laws, candidate_laws = echoed[: len(bodies)], echoed[len(bodies):]
        echo_noise = [d for ref, laws in zip(reference, reference_laws) if laws is not None
                      for d in position_deviations(ref.top_logprobs, laws, len(ref.tokens))]
        noise_gaps = [g for p, ref, laws in zip(self.prompts, reference, reference_laws) if laws is not None
                      for g in scored_row(p.kind, ref, laws, ref).gaps]
        cross = [d for a, b in zip(reference, candidate) for d in agreed_deviations(a, b)] if session.baseline else []
        law = same_law_test(cross, [noise, echo_noise])
        calibration = greedy_tolerance(noise, echo_noise, cross, law)
        session.greedy_noise, session.noise_gaps = calibration, noise_gaps
        session.coverage.reached("temperature", "0", f"greedy tokens scored ({self.name})")
        tol = calibration.tolerance
        parameters = dict(self.parameters, **{
            "server notes": list(session.notes),
            "noise positions (repeat/load, echo)": [len(noise), len(echo_noise)],
            "max noise repeat/load": _short(max(noise, default=0.0)),
            "max noise echo": _short(max(echo_noise, default=0.0)),
            "Q0.9 candidate-vs-baseline": _short(law.cross_quantile),
            "max candidate-vs-baseline": _short(max(cross, default=0.0)),
            "same-law threshold": _short(law.threshold),
            "same-law exceedances": [law.exceeding, law.n], "same-law p-value": _short(law.pvalue),
            "τ": _short(calibration.tau), "tolerance": _short(tol), "tolerance set by": calibration.set_by})
        if session.baseline and not law.same_law:
            return self.report(plan, Verdict.FAIL,
                               f"on tokens where both servers agree, {law.exceeding} of {law.n} positions of the "
                               "candidate's logprobs differ from the baseline's by more "
                               f"than {law.threshold:.3g} nats, "
                               f"the baseline's own upper-decile noise between its evaluations of the same tokens "
                               f"(repeat/under load or echo re-scoring, the larger; floor {LOGPROB_TOLERANCE}); one in "
                               f"ten is expected of one law (p = {law.pvalue:.3g} ≤ "
                               f"{SAME_LAW_ALPHA:g}; candidate's upper "
                               f"decile {law.cross_quantile:.3g}, max {max(cross):.3g}): the candidate computes a "
                               f"different law", parameters=parameters)
        laws = candidate_laws if session.baseline else [c.top_logprobs for c in candidate]
        rows = [scored_row(p.kind, c, row_laws, r) for p, c, row_laws,
                r in zip(self.prompts, candidate, laws, reference)]
        result = judge(rows, tolerance=tol, noise_gaps=noise_gaps, alpha=SAME_LAW_ALPHA,
                       reference="the baseline's echo" if session.baseline else "the candidate's own logprobs")
        lengths = [d for d in (length_difference(p.kind, c, r) for p, c,
                               r in zip(self.prompts, candidate, reference)) if d]
        parameters.update({"positions scored": result.positions, "exceedances": len(result.exceedances),
                           "divergent positions": [result.divergent, result.positions],
                           "divergent positions of the noise": [result.noise_divergent, result.noise_positions],
                           "divergent-positions p-value": _short(result.pvalue),
                           "explainable fraction": _short(result.explainable_fraction)})
        identical = sum(c.tokens == r.tokens for c, r in zip(candidate, reference))
        changed = [_reference_change(p.kind, r, o) for p, r, o in zip(self.prompts * 2, reference * 2, repeat + loaded)]
        summary = ("".join(note + "; " for note in session.notes)
                   + (f"{identical}/{len(self.prompts)} prompts identical to the baseline over {self.length} tokens; "
                      if session.baseline else "") + _identity_summary(result, tol)
                   + f" (τ = {calibration.tau:.3g} nats, set by the {calibration.set_by}; largest of the "
                   f"{'baseline' if session.baseline else 'candidate'}'s own noise: repeat/load "
                   f"{max(noise, default=0.0):.3g}, echo re-scoring {max(echo_noise, default=0.0):.3g}; "
                   f"candidate vs baseline upper decile {law.cross_quantile:.3g}, {law.exceeding}/{law.n} positions "
                   f"above the same-law threshold {law.threshold:.3g}, p = {law.pvalue:.3g})"
                   + "".join(f"; EXPLAINED {d.describe()}" for d in result.first_divergences if d.explained))
        if any(changed):
            summary += "; the reference itself changed at " + "; ".join(c for c in changed if c)
        if result.exceedances or lengths:
            where = result.exceedances[0].row if result.exceedances else lengths[0].split(":")[0]
            body = bodies[[p.kind for p in self.prompts].index(where)]
            replay = curl_command(session.candidate.base_url, session.candidate_body(body))
            message = (f"{len(result.exceedances)} UNEXPLAINED position(s): "
                       + "; ".join(d.describe() for d in result.exceedances[:5])
                       + (f" (and {len(result.exceedances) - 5} more)" if len(result.exceedances) > 5 else "")
                       + "".join(f"; {d}" for d in lengths)
                       + f" (gap > {result.threshold:.3g}, the tolerance or the largest gap of the baseline's own "
                         f"tokens: the target, given the candidate's own prefix, scores the candidate's token "
                         f"clearly below its own); {summary}; replay: {replay}")
            return self.report(plan, Verdict.FAIL, message, parameters=parameters,
                               statistic=float(result.exceedances[0].position) if result.exceedances else None)
        if not result.passed:
            return self.report(plan, Verdict.FAIL, f"every gap is within the tolerance, but more positions differ from "
                                                   f"the target's argmax than rounding explains: {summary}",
                               parameters=parameters, pvalue=result.pvalue)
        return self.report(plan, Verdict.PASS, summary, parameters=parameters)


def _identity_summary(result: IdentityResult, tol: float) -> str:
    noise = (f" vs {result.noise_divergent}/{result.noise_positions} of the baseline's own tokens under its echo "
             f"(p = {result.pvalue:.3g})" if result.noise_positions else "")
    return (f"whole sequence scored by {result.reference}: {result.positions} positions, {len(result.exceedances)} "
            f"above the tolerance {tol:.3g} nats{result.threshold_note()} (which explains "
            f"{result.explainable_fraction:.0%} of them as near-ties), "
            f"{result.divergent} not the target's argmax{noise}")


def _reference_change(prompt: str, reference: Completion, other: Completion) -> str | None:
    """Where a repeat of the reference left it (noise, reported): position, tokens, the top-2 margin there."""
    position = first_difference(reference.tokens, other.tokens)
    if position is None or position >= min(len(reference.tokens), len(other.tokens)):
        return None
    margin = top_two_margin(reference.top_logprobs[position])
    return (f"{prompt}: token {position}: {reference.tokens[position]!r} vs {other.tokens[position]!r}, "
            f"top-2 margin {margin:.3g}")


def _short(value: float) -> float:
    return float(f"{value:.3g}")


@dataclass
class BatchInvarianceCheck(GreedyPromptsCheck):
    """The candidate's greedy tokens for a prompt inside a burst of concurrent requests are the
    target's greedy tokens as alone: every copy that differs from the alone run is scored whole,
    like ``greedy-identity`` (the baseline's echo, or the copy's own returned laws), at the
    tolerance ``greedy-identity`` measured."""

    def run(self, session: Any, plan: Plan) -> CheckResult:
        bodies = [greedy_body(p, self.length) for p in self.prompts]
        alone = session.greedy_alone or [session.candidate.complete(b) for b in bodies]
        tol = session.greedy_noise.tolerance
        burst = session.candidate.complete_many([b for b in bodies for _ in range(self.burst)])  # all at once
        differing = [(index, copy) for index in range(len(self.prompts))
                     for copy in burst[index * self.burst:(index + 1) * self.burst]
                     if copy.tokens != alone[index].tokens]
        laws = (session.baseline_laws([bodies[i] for i, _ in differing], [c for _, c in differing]) if session.baseline
                else [c.top_logprobs for _, c in differing])
        rows = [scored_row(self.prompts[i].kind, copy, row_laws, alone[i]) for (i, copy),
                row_laws in zip(differing, laws)]
        result = judge(rows, tolerance=tol, noise_gaps=session.noise_gaps or [], alpha=SAME_LAW_ALPHA,
                       reference="the baseline's echo" if session.baseline else "the copies' own logprobs")
        lengths = [d for d in (length_difference(self.prompts[i].kind, c, alone[i]) for i, c in differing) if d]
        varied = len({i for i, _ in differing})
        summary = (f"{len(self.prompts) - varied}/{len(self.prompts)} prompts identical alone and in bursts of "
                   f"{self.burst * len(self.prompts)} concurrent requests; {len(differing)} differing copies, "
                   + _identity_summary(result, tol)
                   + "".join(f"; EXPLAINED {d.describe()}" for d in result.first_divergences if d.explained))
        if not result.passed or lengths:
            found = [d.describe() for d in result.exceedances[:5]] + lengths
            return self.report(plan, Verdict.FAIL, f"{len(result.exceedances) + len(lengths)} UNEXPLAINED position(s) "
                                                   f"under concurrent load: " + "; ".join(found)
                                                   + ": the output depends on the other "
                                                   f"requests in the batch; {summary}")
        return self.report(plan, Verdict.PASS, summary)


# --------------------------------------------------------------------------------------------
# Sampled distribution: PIT against returned logprobs
# --------------------------------------------------------------------------------------------


@dataclass
class PitCheck(SequentialCheck):
    """Top-k sampling at temperature T: the sequential randomized PIT values of every sampled
    token (:mod:`specverify.auditing.endpoint.pit`) under the target's law at its prefix are
    i.i.d. uniform; Pearson goodness of fit of the first n of them in PIT_BINS equal cells, plus
    one cell of probability 0 for tokens outside the top k (one there is a certain loss).

    The law at each sampled token is the one the candidate returned with it: the target's logits
    as the candidate computed them at that prefix, which its verification must sample from exactly
    (a wrong acceptance rule, residual or bonus shows here).  With a baseline, every sampled prefix
    is also re-scored on it (``echo``) and the TV between the two servers' processed laws there is
    reported: two engines' numerics differ (on llama-cpp-python by up to 0.5 nats per logprob, see
    ``greedy-identity``), so testing the candidate's tokens against the baseline's law would
    measure rounding, not speculation, at the sample sizes used; ``greedy-identity`` bounds that
    difference (:func:`~specverify.auditing.endpoint.greedy.same_law_test`: it fails when the
    candidate exceeds the baseline's own upper-decile noise at more positions than one law explains)."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]
    temperature: float
    top_k: int
    length: int
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = PIT_BINS

    def __post_init__(self) -> None:
        self.parameters = {"temperature": self.temperature, "top_k": self.top_k, "top_p": 1.0, "min_p": 0.0,
                           "max_tokens": self.length, "prompts": [p.kind for p in self.prompts], "bins": PIT_BINS}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        return stats.sample_size_for_tv(epsilon, alpha=alpha, power=power, num_cells=PIT_BINS)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return stats.detectable_tv(n, alpha=alpha, power=power, num_cells=PIT_BINS)

    def body(self, prompt: Prompt, seed: int) -> dict[str, Any]:
        return dict(NEUTRAL_PROCESSING, prompt=prompt.text, max_tokens=self.length, temperature=self.temperature,
                    top_k=self.top_k, top_p=1.0, min_p=0.0, seed=seed, logprobs=self.top_k)

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        """``n`` more PIT values (or tokens outside the top k), from as many candidate requests as
        they need; each look has its own request seeds and PIT uniforms."""
        session.coverage.reached("temperature", f"{self.temperature:g}", f"PIT tested ({self.name})")
        session.coverage.reached("top_k", str(self.top_k), f"PIT under the top-{self.top_k} law ({self.name})")
        uniforms = np.random.default_rng(derive_seed(plan.seed, "pit-uniforms", look) % (2**32))
        tie = session.greedy_noise.tolerance
        bins = np.zeros((self.length, PIT_BINS + 1), dtype=np.int64)  # per position; the last column: outside the top k
        between = np.zeros(2)  # sum and count of the TVs between the servers' laws at the sampled prefixes
        drawn, issued = 0, 0
        batch = max(1, session.candidate.concurrency) * 4
        while drawn < n:
            count = min(batch, max(1, math.ceil((n - drawn) / self.length)))
            bodies = [self.body(self.prompts[(issued + i) % len(self.prompts)],
                                request_seed(plan.seed, "request", look, issued + i)) for i in range(count)]
            completions = session.candidate.complete_many(bodies)
            rescored = session.baseline_laws(bodies, completions)
            issued += count
            for completion, baseline_laws in zip(completions, rescored):
                for position, (token, own) in enumerate(zip(completion.tokens, completion.top_logprobs)):
                    if drawn >= n or position >= self.length:
                        break
                    if own is None or len(own) < self.top_k:
                        raise Fault("malformed", f"{self.name}: the candidate returned fewer than top_k = {self.top_k} "
                                                 f"logprobs with a sampled token (asked logprobs={self.top_k})")
                    law = processed_law(own, temperature=self.temperature, top_k=self.top_k)
                    u = pit_value(law, token, float(uniforms.random()), tie_tolerance=tie)
                    if u is None:
                        bins[position, PIT_BINS] += 1
                    else:
                        bins[position, :PIT_BINS] += uniform_bins(np.array([u]), PIT_BINS)
                    drawn += 1
                    if baseline_laws is not None and len(baseline_laws[position]) >= self.top_k:
                        other = processed_law(baseline_laws[position], temperature=self.temperature, top_k=self.top_k)
                        between += (law_tv(law, other), 1.0)
            if issued > 4 * n + 10:
                raise Fault("malformed", f"{self.name}: {issued} requests returned too few tokens for {n} PIT values")
        return Tally(n, {"bins": bins, "between": between, "requests": np.array(issued)})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        bins = tally.counts["bins"]
        counts = bins.sum(axis=0)
        expected = np.append(np.full(PIT_BINS, 1.0 / PIT_BINS), 0.0)
        labels = tuple(f"u in [{b / PIT_BINS:.1f}, {(b + 1) / PIT_BINS:.1f})" for b in range(PIT_BINS)) + (
            f"token outside the top {self.top_k}",)
        result = goodness_of_fit_result(self, plan, counts, expected, labels, None, level=level, look=look)
        requests = int(tally.counts["requests"])
        note = (f"; {requests} requests; plug-in TV of the binned u's by position (diagnosis, not tested): "
                f"{_per_position_tv(bins)}")
        total, count = tally.counts["between"]
        if count:
            note += (f"; candidate vs baseline law at the sampled prefixes (echo re-scoring, {int(count)} "
                     f"positions): mean TV {total / count:.3g}")
        if counts[-1]:
            note += f"; {int(counts[-1])} token(s) outside the top k"
        return dataclasses.replace(result, message=result.message + note, calls=requests)


def law_tv(a: Any, b: Any) -> float:
    """Total variation between two processed laws (token -> probability)."""
    pa, pb = dict(zip(a.tokens, a.probs)), dict(zip(b.tokens, b.probs))
    return 0.5 * sum(abs(pa.get(t, 0.0) - pb.get(t, 0.0)) for t in pa.keys() | pb.keys())


def _per_position_tv(bins: np.ndarray) -> str:
    """Plug-in TV of each position's binned u's (``bins``: ``[positions, PIT_BINS + 1]`` counts)."""
    parts = []
    for position, row in enumerate(bins[:8]):
        counts = row[:PIT_BINS]
        if counts.sum():
            parts.append(f"{position}: {plug_in_tv(counts):.3f} (n={int(counts.sum())})")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------
# Sampled distribution: two-sample homogeneity (settings logprobs cannot express)
# --------------------------------------------------------------------------------------------


def homogeneity_detectable_tv(n: int, *, alpha: float, power: float, num_cells: int) -> float:
    """TV detectable by the two-sample test with n samples per server: its noncentrality bound is
    2nε² against the one-sample 4nε² (:func:`specverify.core.stats.homogeneity_sample_size`), so
    the detectable ε is √2 times :func:`specverify.core.stats.detectable_tv`."""
    return math.sqrt(2.0) * stats.detectable_tv(n, alpha=alpha, power=power, num_cells=num_cells)


@dataclass
class TwoSampleCheck(SequentialCheck):
    """Sampling with settings whose processed law the logprobs cannot give (``top_p`` after
    temperature, engine defaults such as min-p or penalties): the first L tokens' joint law on
    candidate and baseline, same parameters, independent seeds, is the same (Pearson χ² test of
    homogeneity, :func:`specverify.core.stats.two_sample_test`).  Cells are fixed from a pilot run
    of both servers before the test's samples are drawn: per prompt, its most frequent pilot
    continuations, and one cell for all others; the test pools them further by expected count.
    Sized for TV ``2ε`` of the budget's ε (two samples cost twice one, and each request is one
    draw of the joint law)."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]
    settings: Mapping[str, float]
    length: int
    max_cells: int = 16
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.num_cells = self.max_cells
        self.parameters = dict(self.settings, max_tokens=self.length, prompts=[p.kind for p in self.prompts],
                               cells=self.max_cells)

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        return stats.homogeneity_sample_size(min(1.0, 2.0 * epsilon), alpha=alpha, power=power,
                                             num_cells=self.max_cells)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return homogeneity_detectable_tv(n, alpha=alpha, power=power, num_cells=self.max_cells)

    def _sample(self, client: EndpointClient, count: int, seed: int, *roles: object) -> list[tuple[int, str]]:
        bodies = [dict(self.settings, prompt=self.prompts[i % len(self.prompts)].text, max_tokens=self.length,
                       seed=request_seed(seed, *roles, i)) for i in range(count)]
        return [(i % len(self.prompts), c.text) for i, c in enumerate(client.complete_many(bodies))]

    runs_in_parts: ClassVar[bool] = False  # its cells come from a pilot run first

    def run(self, session: Any, plan: Plan) -> CheckResult:
        """Fix the cells from a pilot of both servers, then test at each look (:class:`SequentialCheck`)."""
        self.pilot_n = max(4 * self.max_cells, plan.n // 10)
        pilot = Counter(self._sample(session.candidate, self.pilot_n, plan.seed, "pilot-candidate")
                        + self._sample(session.baseline, self.pilot_n, plan.seed, "pilot-baseline"))
        per_prompt = self.max_cells // len(self.prompts) - 1
        self.cells: dict[tuple[int, str], int] = {}
        labels: list[str] = []
        for index, prompt in enumerate(self.prompts):
            frequent = sorted(((count, text) for (p, text), count in pilot.items() if p == index and count >= 2),
                              key=lambda t: (-t[0], t[1]))[:per_prompt]
            for _, text in frequent:
                self.cells[(index, text)] = len(labels)
                labels.append(f"{prompt.kind}: {text!r}")
            labels.append(f"{prompt.kind}: any other continuation")
        self.labels = tuple(labels)
        self.other = {index: labels.index(f"{p.kind}: any other continuation") for index, p in enumerate(self.prompts)}
        return super().run(session, plan)

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        """``n`` more requests to each server, counted in the pilot's cells."""
        session.coverage.reached("top_p", f"{self.settings.get('top_p', 1.0):g}",
                                 f"two-sample vs baseline ({self.name})")
        counts = np.zeros((2, len(self.labels)), dtype=np.int64)
        for row, (client, role) in enumerate(((session.candidate, "candidate"), (session.baseline, "baseline"))):
            for key in self._sample(client, n, plan.seed, role, look):
                counts[row, self.cells.get(key, self.other[key[0]])] += 1
        return Tally(n, {"counts": counts})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        counts = tally.counts["counts"]
        test = stats.two_sample_test(counts[0], counts[1], seed=plan.seed % (2**32),
                                     monte_carlo_draws=monte_carlo_draws(level))
        failed = test.pvalue <= level
        where = level_phrase(plan, level, look)
        if failed:
            frequency = counts / counts.sum(axis=1, keepdims=True)
            worst = np.argsort(-np.abs(frequency[0] - frequency[1]), kind="stable")[:3]
            detail = "; ".join(f"{self.labels[i]}: candidate {frequency[0, i]:.3f} vs baseline {frequency[1, i]:.3f}"
                               for i in worst)
            message = (f"candidate and baseline sample different laws: p-value {test.pvalue:.3g} ≤ {where}; "
                       f"estimated TV {test.empirical_tv:.4f}; largest differences: {detail}")
        else:
            message = (f"candidate and baseline consistent (p-value {test.pvalue:.3g} > {where}; "
                       f"{len(self.labels)} cells from a pilot of {self.pilot_n} requests per server)")
        return self.report(plan, Verdict.FAIL if failed else Verdict.PASS,
                           message, n=2 * tally.n, num_cells=len(self.labels),
                           statistic=float(test.statistic), pvalue=float(test.pvalue),
                           empirical_tv=float(test.empirical_tv),
                           observed=tuple(int(c) for c in counts[0]), expected=None, cell_labels=self.labels,
                           calls=2 * (tally.n + self.pilot_n), **look_fields(plan, level, look))


# --------------------------------------------------------------------------------------------
# Acceptance counters
# --------------------------------------------------------------------------------------------

_PROMETHEUS = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(?P<value>[-+0-9.eEinfINFaN]+)\s*$")
VLLM_COUNTERS = {"accepted": "vllm:spec_decode_num_accepted_tokens_total",
                 "drafted": "vllm:spec_decode_num_draft_tokens_total",
                 "drafts": "vllm:spec_decode_num_drafts_total"}


def prometheus_totals(text: str | None) -> dict[str, float]:
    """Sum of each metric's samples over its labels, from Prometheus text exposition format."""
    totals: dict[str, float] = {}
    for line in (text or "").splitlines():
        match = _PROMETHEUS.match(line.strip())
        if match and not line.startswith("#"):
            totals[match["name"]] = totals.get(match["name"], 0.0) + float(match["value"])
    return totals


@dataclass
class AcceptanceCheck(Check):
    """The candidate's speculation counters, where it exposes them (llama.cpp's per-response
    ``timings``: ``draft_n``, ``draft_n_accepted``, ``predicted_n``; vLLM's Prometheus counters),
    reported per prompt kind (acceptance rate, tokens per pass) and checked for consistency
    (a contract: a failure means the counters misreport speculation, not that tokens are lossy):

    - per response: 0 ≤ accepted ≤ drafted; accepted < predicted_n (every verify pass emits one
      token of its own, the correction or bonus, besides its accepted drafts; the check's
      responses are ≥ 24 tokens, longer than any one pass); predicted_n equals the tokens returned
      when the response stopped at ``max_tokens``;
    - Prometheus: at every scrape accepted ≤ drafted, and no counter decreases between scrapes.

    Skipped when the server exposes neither."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]
    length: int
    kind: ClassVar[CheckKind] = CheckKind.CONTRACT
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.parameters = {"prompts": [p.kind for p in self.prompts], "max_tokens": self.length}

    def run(self, session: Any, plan: Plan) -> CheckResult:
        parts: list[str] = []
        violations: list[str] = []
        if session.candidate.metrics() is None:  # only per-response timings: the greedy runs carry them
            completions = session.greedy_alone or [session.candidate.complete(greedy_body(p, self.length))
                                                   for p in self.prompts]
            for prompt, completion in zip(self.prompts, completions):
                figures = _acceptance_figures(completion, {}, {})
                if figures:
                    parts.append(f"{prompt.kind}: {figures}")
                    violations += [f"{prompt.kind}: {v}" for v in timing_violations(completion)]
        else:
            for prompt in self.prompts:
                before = prometheus_totals(session.candidate.metrics())
                completion = session.candidate.complete(greedy_body(prompt, self.length))
                after = prometheus_totals(session.candidate.metrics())
                figures = _acceptance_figures(completion, before, after)
                if figures:
                    parts.append(f"{prompt.kind}: {figures}")
                    violations += [f"{prompt.kind}: {v}" for v in metric_violations(before, after)]
        if not parts:
            return self.skipped(plan, "the candidate exposes no speculation counters (no `timings` in its "
                                      "responses, no vLLM spec_decode metrics at /metrics)")
        figures = "acceptance per prompt kind (greedy): " + "; ".join(parts)
        if violations:
            return self.report(plan, Verdict.FAIL, f"the speculation counters are inconsistent: "
                                                   f"{'; '.join(violations)}; {figures}")
        return self.report(plan, Verdict.PASS, f"counters consistent; {figures}")


def timing_violations(completion: Completion) -> list[str]:
    """The claims of :class:`AcceptanceCheck` a response's ``timings`` break."""
    timings = completion.timings or {}
    drafted, accepted = float(timings["draft_n"]), float(timings["draft_n_accepted"])
    found = []
    if drafted < 0 or accepted < 0:
        found.append(f"negative counter (draft_n {drafted:g}, draft_n_accepted {accepted:g})")
    if accepted > drafted:
        found.append(f"{accepted:g} drafts accepted of {drafted:g} drafted")
    produced = timings.get("predicted_n")
    if produced is not None:
        if len(completion.tokens) and accepted >= float(produced):
            found.append(f"{accepted:g} accepted drafts in {float(produced):g} emitted tokens (each pass emits one "
                         f"token of its own)")
        if completion.finish_reason == "length" and completion.tokens and float(produced) != len(completion.tokens):
            found.append(f"predicted_n {float(produced):g} but {len(completion.tokens)} tokens returned")
    return found


def metric_violations(before: Mapping[str, float], after: Mapping[str, float]) -> list[str]:
    """The claims of :class:`AcceptanceCheck` two Prometheus scrapes break."""
    found = []
    for when, totals in (("before", before), ("after", after)):
        accepted, drafted = totals.get(VLLM_COUNTERS["accepted"], 0.0), totals.get(VLLM_COUNTERS["drafted"], 0.0)
        if accepted > drafted:
            found.append(f"{VLLM_COUNTERS['accepted']} {accepted:g} > {VLLM_COUNTERS['drafted']} {drafted:g} ({when})")
    for metric in VLLM_COUNTERS.values():
        if after.get(metric, 0.0) < before.get(metric, 0.0):
            found.append(f"{metric} decreased from {before[metric]:g} to {after.get(metric, 0.0):g}")
    return found


def _acceptance_figures(completion: Completion, before: Mapping[str, float], after: Mapping[str, float]) -> str | None:
    timings = completion.timings or {}
    if "draft_n" in timings and "draft_n_accepted" in timings:
        drafted, accepted = float(timings["draft_n"]), float(timings["draft_n_accepted"])
        produced = float(timings.get("predicted_n", len(completion.tokens)))
        passes = max(1.0, produced - accepted)
        rate = accepted / drafted if drafted else float("nan")
        return f"{accepted:.0f}/{drafted:.0f} drafts accepted ({rate:.2f}), {produced / passes:.2f} tokens per pass"
    delta = {k: after.get(v, 0.0) - before.get(v, 0.0) for k, v in VLLM_COUNTERS.items()}
    if delta["drafted"] > 0:
        per_pass = 1.0 + delta["accepted"] / delta["drafts"] if delta["drafts"] > 0 else float("nan")
        return (f"{delta['accepted']:.0f}/{delta['drafted']:.0f} drafts accepted "
                f"({delta['accepted'] / delta['drafted']:.2f}), {per_pass:.2f} tokens per pass")
    return None



__all__ = ["AcceptanceCheck", "BatchInvarianceCheck", "GreedyIdentityCheck", "PitCheck", "Prompt", "TwoSampleCheck"]
