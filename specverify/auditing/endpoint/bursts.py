"""How servers batch and seed: sampled requests that share verification steps (SPEC §4).

A serving engine verifies the drafts of every running request in one step (continuous batching),
each row with its own sampling settings and random state.  Bugs confined to such shared steps
(rows mixed in the batched verify call, one request's temperature or seed used for every row)
and to seed handling (the choices of an ``n > 1`` request seeded alike) are invisible to requests
that run alone or that all carry the same settings.  The checks here send what an engine batches:

- ``pit-burst-mixed`` (goodness of fit): bursts of ``concurrency`` requests sent at once, each
  with a different prompt and its own settings (:data:`BURST_SETTINGS`: temperatures and top-k
  differ within a burst) and its own seed; every sampled token's randomized PIT value under the
  law of *its own* request is uniform (:mod:`~specverify.auditing.endpoint.pit`).  In every other
  burst the last request repeats the first one's seed on another prompt (the same seed on
  different prompts in one step): two requests with one seed may legitimately share their random
  numbers, so that *companion* request's tokens enter only the probability-0 cell (a token
  outside its top k is a certain loss whatever the dependence) and the test's u's stay
  independent.
- ``pit-pairs-n2`` (goodness of fit): requests with ``n = 2``, whose two choices an engine runs
  as sibling sequences in the same steps (vLLM seeds choice i with ``seed + i``); under the law
  the two choices are independent draws, so the pair (u of choice 0, u of choice 1) at each
  position is uniform on the unit square (Rosenblatt 1952 on the pair of sequences); counted in
  4 × 4 equal cells.  Identical or correlated choices concentrate the pairs on the diagonal.
- ``seed-reproducibility`` (contract): a seeded request alone, twice in one burst among other
  prompts, and alone again.  The OpenAI API promises seeded determinism only as best effort
  ("determinism is not guaranteed"), vLLM only with batch invariance (``VLLM_BATCH_INVARIANT=1``),
  and batch-shape rounding legitimately changes the tokens elsewhere; so differences are reported,
  and judged (contract violated) only where the auditor states that the server promises it
  (``EndpointBattery(seeded_determinism=True)``).

Co-batching (:func:`co_batching`): whether the requests of a burst shared steps is not visible
through the API.  The audit records what it can: the client's clock shows whether all requests of
a burst were in flight at once; where the server returns per-request timings (llama.cpp's
``timings.prompt_ms`` + ``predicted_ms``), a sum of the burst's server times above the burst's
wall time shows that the server processed them at overlapping times (one at a time, they would
fit in the wall time).  An engine that batches its running requests then ran them in shared
steps; a server that runs each request on its own thread overlaps without sharing.  Without
timings the check covers concurrent requests and says so.

The plan (prompts, settings, seeds, which requests form a burst, the PIT's own uniforms) is a
function of the plan's seed and the look only; the server's batching is timing-dependent, which
changes what the bursts exercise, never what is sent or how it is judged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
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
)
from specverify.auditing.endpoint.checks import NEUTRAL_PROCESSING, PIT_BINS, Prompt, request_seed
from specverify.auditing.endpoint.client import Completion
from specverify.auditing.endpoint.greedy import curl_command
from specverify.auditing.endpoint.pit import pit_value, processed_law, uniform_bins
from specverify.auditing.isolation.faults import Fault
from specverify.core import stats
from specverify.core.seeding import derive_seed

BURST_SETTINGS: tuple[tuple[float, int], ...] = ((1.0, 8), (0.7, 8), (1.0, 4))
"""(temperature, top-k) of the rows of a burst, rotated: neighbouring rows never share both."""

BURST_LOGPROBS = 8
"""Alternatives asked for with every sampled token (≥ every top-k above; the rest settle ties)."""

PAIR_BINS = 4
"""Equal cells per axis of the unit square the choice pairs are counted in (16 cells)."""

REPRODUCIBILITY_PROMPTS = 3


@dataclass(frozen=True)
class BurstRow:
    """One request of a burst: its prompt, settings and seed; ``counted`` is False for the
    companion that repeats the first row's seed (module docstring)."""

    prompt: Prompt
    temperature: float
    top_k: int
    seed: int
    counted: bool = True


def burst_rows(prompts: Sequence[Prompt], seed: int, look: int, burst: int, size: int,
               *, companion: bool = True) -> tuple[BurstRow, ...]:
    """The ``burst``-th burst of a look: row r has prompt ``(burst + r) mod P``, settings
    ``(burst + r) mod S`` of :data:`BURST_SETTINGS`, a seed of its own; with ``companion``, in odd
    bursts of ≥ 2 rows the last row repeats row 0's seed and is not counted."""
    rows = []
    for r in range(size):
        temperature, top_k = BURST_SETTINGS[(burst + r) % len(BURST_SETTINGS)]
        rows.append(BurstRow(prompts[(burst + r) % len(prompts)], temperature, top_k,
                             request_seed(seed, "burst", look, burst, r)))
    if companion and size >= 2 and burst % 2 == 1:
        rows[-1] = dataclasses.replace(rows[-1], seed=rows[0].seed, counted=False)
    return tuple(rows)


def sampled_body(row: BurstRow, length: int, **extra: Any) -> dict[str, Any]:
    return dict(NEUTRAL_PROCESSING, prompt=row.prompt.text, max_tokens=length, temperature=row.temperature,
                top_k=row.top_k, top_p=1.0, min_p=0.0, seed=row.seed, logprobs=BURST_LOGPROBS, **extra)


def pit_values(check: str, completion: Completion, row: BurstRow, uniforms: np.random.Generator, tie: float,
               length: int) -> list[float | None]:
    """The randomized PIT value of each of the first ``length`` tokens under the processed law of
    ``row``'s settings at its prefix, as the server returned it (None: a token of probability 0)."""
    values: list[float | None] = []
    for token, own in list(zip(completion.tokens, completion.top_logprobs))[:length]:
        if own is None or len(own) < row.top_k:
            raise Fault("malformed", f"{check}: the candidate returned fewer than top_k = {row.top_k} logprobs with "
                                     f"a sampled token (asked logprobs={BURST_LOGPROBS})")
        law = processed_law(own, temperature=row.temperature, top_k=row.top_k)
        values.append(pit_value(law, token, float(uniforms.random()), tie_tolerance=tie))
    return values


# --------------------------------------------------------------------------------------------
# Co-batching evidence
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoBatching:
    """What the audit saw of its bursts landing together (module docstring): of ``bursts``,
    ``in_flight`` had all their requests in flight at once by the client's clock; ``timed`` came
    back with server timings on every response, and of those ``overlapped`` show overlapping
    processing on the server (Σ server time > the burst's wall time)."""

    bursts: int = 0
    in_flight: int = 0
    timed: int = 0
    overlapped: int = 0

    def __add__(self, other: CoBatching) -> CoBatching:
        return CoBatching(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def describe(self, size: int) -> str:
        text = (f"co-batching: {self.in_flight}/{self.bursts} bursts of {size} requests were all in flight at once "
                f"(client clock)")
        if self.timed:
            return text + (f"; the server's own timings show overlapping processing in {self.overlapped}/{self.timed} "
                           f"(the sum of its per-request times exceeded the burst's wall time, impossible one at a "
                           f"time): an engine that batches its running requests ran those in shared verification "
                           f"steps")
        return text + ("; the server returns no per-request timings, so whether it put them in one verification "
                       "step cannot be confirmed from outside: this check then covers concurrent requests, which an "
                       "engine with continuous batching verifies in shared steps")


def server_seconds(completion: Completion) -> float | None:
    """The server's own time for a request, from llama.cpp-style ``timings`` (``prompt_ms`` +
    ``predicted_ms``), or None."""
    timings = completion.timings or {}
    parts = [timings.get(key) for key in ("prompt_ms", "predicted_ms")]
    if parts[1] is None or not all(p is None or isinstance(p, (int, float)) for p in parts):
        return None
    return sum(float(p) for p in parts if p is not None) / 1000.0


def co_batching(burst: Sequence[Completion]) -> CoBatching:
    """:class:`CoBatching` of one burst (the completions of its requests)."""
    sent = [c.sent for c in burst if c.sent is not None]
    received = [c.received for c in burst if c.received is not None]
    if len(burst) < 2 or len(sent) < len(burst) or len(received) < len(burst):  # a request without its stamps
        return CoBatching(bursts=1)
    together = max(sent) < min(received)
    times = [server_seconds(c) for c in burst]
    timed = all(t is not None for t in times)
    wall = max(received) - min(sent)
    overlapped = timed and sum(t for t in times if t is not None) > wall
    return CoBatching(1, int(together), int(timed), int(overlapped))


def _evidence_array(evidence: CoBatching) -> np.ndarray:
    return np.array(dataclasses.astuple(evidence), dtype=np.int64)


def _evidence(tally: Tally) -> CoBatching:
    return CoBatching(*(int(v) for v in tally.counts["co-batching"]))


# --------------------------------------------------------------------------------------------
# Bursts of different prompts and settings
# --------------------------------------------------------------------------------------------


@dataclass
class BurstPitCheck(SequentialCheck):
    """Bursts of ``size`` concurrent requests with different prompts, settings and seeds: the
    PIT values of every counted token under its own request's law are i.i.d. uniform (Pearson
    goodness of fit in PIT_BINS equal cells plus one cell of probability 0, as ``pit-*``)."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]
    size: int
    length: int
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = PIT_BINS

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError(f"size: a burst needs at least 2 concurrent requests, got {self.size!r} "
                             "(raise --concurrency)")
        self.parameters = {"burst": self.size, "settings (temperature, top_k)": [list(s) for s in BURST_SETTINGS],
                           "max_tokens": self.length, "prompts": [p.kind for p in self.prompts], "bins": PIT_BINS}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        return stats.sample_size_for_tv(epsilon, alpha=alpha, power=power, num_cells=PIT_BINS)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return stats.detectable_tv(n, alpha=alpha, power=power, num_cells=PIT_BINS)

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        """Bursts until ``n`` more counted PIT values; each look has its own seeds and uniforms."""
        uniforms = np.random.default_rng(derive_seed(plan.seed, "burst-uniforms", look) % (2**32))
        tie = session.greedy_noise.tolerance
        bins = np.zeros(PIT_BINS + 1, dtype=np.int64)
        evidence = CoBatching()
        drawn, burst = 0, 0
        while drawn < n:
            rows = burst_rows(self.prompts, plan.seed, look, burst, self.size)
            completions = [c[0] for c in session.candidate.complete_many_choices(
                [sampled_body(row, self.length) for row in rows])]
            evidence += co_batching(completions)
            for row, completion in zip(rows, completions):
                for u in pit_values(self.name, completion, row, uniforms, tie, self.length):
                    if u is None:
                        bins[PIT_BINS] += 1  # probability 0 under its own law: certain loss, counted or not
                        drawn += row.counted
                    elif row.counted and drawn < n:
                        bins[:PIT_BINS] += uniform_bins(np.array([u]), PIT_BINS)
                        drawn += 1
            burst += 1
            if burst * self.size > 4 * n + 10:
                raise Fault("malformed", f"{self.name}: {burst * self.size} requests returned too few tokens for {n} "
                                         "PIT values")
        return Tally(n, {"bins": bins, "requests": np.array(burst * self.size),
                         "co-batching": _evidence_array(evidence)})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        counts = tally.counts["bins"]
        expected = np.append(np.full(PIT_BINS, 1.0 / PIT_BINS), 0.0)
        labels = tuple(f"u in [{b / PIT_BINS:.1f}, {(b + 1) / PIT_BINS:.1f})" for b in range(PIT_BINS)) + (
            "token outside its request's top k",)
        result = goodness_of_fit_result(self, plan, counts, expected, labels, None, level=level, look=look)
        requests = int(tally.counts["requests"])
        evidence = _evidence(tally)
        note = f"; {requests} requests in {evidence.bursts} bursts; {evidence.describe(self.size)}"
        if result.verdict is Verdict.FAIL:
            note += ("; each request alone is judged under its own settings, so the burst's requests changed each "
                     "other's law (rows mixed, or one request's settings or seed applied to the whole step)")
        return dataclasses.replace(result, message=result.message + note, calls=requests)


# --------------------------------------------------------------------------------------------
# n = 2: the two choices of one request
# --------------------------------------------------------------------------------------------


@dataclass
class ChoicePairsCheck(SequentialCheck):
    """Requests with ``n = 2`` (sent in bursts of ``size``): at each position the pair (u₀, u₁)
    of the two choices' PIT values is uniform on the unit square; Pearson goodness of fit in
    PAIR_BINS² equal cells plus one cell of probability 0 (either token outside its top k)."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]
    size: int
    length: int
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = PAIR_BINS**2

    def __post_init__(self) -> None:
        self.parameters = {"n": 2, "burst": self.size,
                           "settings (temperature, top_k)": [list(s) for s in BURST_SETTINGS],
                           "max_tokens": self.length, "prompts": [p.kind for p in self.prompts],
                           "cells": f"{PAIR_BINS}x{PAIR_BINS}"}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        return stats.sample_size_for_tv(epsilon, alpha=alpha, power=power, num_cells=PAIR_BINS**2)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return stats.detectable_tv(n, alpha=alpha, power=power, num_cells=PAIR_BINS**2)

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        """``n`` more pairs, from bursts of ``n = 2`` requests with seeds of their own."""
        uniforms = np.random.default_rng(derive_seed(plan.seed, "pair-uniforms", look) % (2**32))
        tie = session.greedy_noise.tolerance
        cells = np.zeros(PAIR_BINS**2 + 1, dtype=np.int64)
        drawn, burst, identical, requests = 0, 0, 0, 0
        while drawn < n:
            rows = burst_rows(self.prompts, plan.seed, look, burst, self.size, companion=False)
            answers = session.candidate.complete_many_choices([sampled_body(row, self.length, n=2) for row in rows])
            for row, choices in zip(rows, answers):
                requests += 1
                identical += choices[0].tokens == choices[1].tokens
                first = pit_values(self.name, choices[0], row, uniforms, tie, self.length)
                second = pit_values(self.name, choices[1], row, uniforms, tie, self.length)
                for u0, u1 in zip(first, second):
                    if drawn >= n:
                        break
                    if u0 is None or u1 is None:
                        cells[-1] += 1
                    else:
                        cells[min(int(u0 * PAIR_BINS), PAIR_BINS - 1) * PAIR_BINS
                              + min(int(u1 * PAIR_BINS), PAIR_BINS - 1)] += 1
                    drawn += 1
            burst += 1
            if requests > 4 * n + 10:
                raise Fault("malformed", f"{self.name}: {requests} requests returned too few tokens for {n} pairs")
        return Tally(n, {"cells": cells, "requests": np.array(requests), "identical": np.array(identical)})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        counts = tally.counts["cells"]
        expected = np.append(np.full(PAIR_BINS**2, 1.0 / PAIR_BINS**2), 0.0)
        step = 1.0 / PAIR_BINS
        labels = tuple(f"u0 in [{i * step:.2f}, {(i + 1) * step:.2f}), u1 in [{j * step:.2f}, {(j + 1) * step:.2f})"
                       for i in range(PAIR_BINS) for j in range(PAIR_BINS)) + ("a token outside its top k",)
        result = goodness_of_fit_result(self, plan, counts, expected, labels, None, level=level, look=look)
        requests, identical = int(tally.counts["requests"]), int(tally.counts["identical"])
        diagonal = sum(int(counts[i * PAIR_BINS + i]) for i in range(PAIR_BINS))
        note = (f"; {requests} requests of n = 2; {identical} with identical choices; pairs on the diagonal cells "
                f"{diagonal}/{int(counts[:-1].sum())} (expected 1/{PAIR_BINS})")
        if result.verdict is Verdict.FAIL:
            note += ("; the choices of one request are not independent draws of the law (or not drawn from it): "
                     "n = 2 asks for two samples, so with a seed each choice still needs a random stream of its own "
                     "(vLLM seeds choice i with seed + i)")
        return dataclasses.replace(result, message=result.message + note, calls=requests)


# --------------------------------------------------------------------------------------------
# Seeded reproducibility
# --------------------------------------------------------------------------------------------


@dataclass
class SeedReproducibilityCheck(Check):
    """A seeded sampled request alone, twice inside a burst of other prompts, and alone again:
    the same tokens every time, where the server promises seeded determinism (module docstring);
    elsewhere the observation is reported and not judged."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]
    size: int
    length: int
    promised: bool
    kind: ClassVar[CheckKind] = CheckKind.CONTRACT
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.parameters = {"prompts": [p.kind for p in self.prompts[:REPRODUCIBILITY_PROMPTS]], "burst": self.size,
                           "max_tokens": self.length, "seeded determinism promised": self.promised}

    def run(self, session: Any, plan: Plan) -> CheckResult:
        client = session.candidate
        targets = [BurstRow(self.prompts[r % len(self.prompts)], 1.0, 8, request_seed(plan.seed, "reproduce", r))
                   for r in range(REPRODUCIBILITY_PROMPTS)]
        bodies = [sampled_body(row, self.length) for row in targets]
        first = [client.complete(body) for body in bodies]  # alone, one after another
        differences: list[str] = []
        for index, (row, body) in enumerate(zip(targets, bodies)):
            others = [sampled_body(o, self.length) for o in burst_rows(self.prompts, plan.seed, index, 0, self.size)
                      if o.prompt != row.prompt][: max(0, self.size - 2)]
            burst = [body] + others + [body]  # the same prompt and seed twice, other prompts between
            answers = client.complete_many(burst)
            copies = {"first in its burst": answers[0], "last in its burst": answers[-1]}
            for where, copy in copies.items():
                if copy.tokens != first[index].tokens:
                    differences.append(f"{row.prompt.kind} (seed {row.seed}): alone {first[index].text!r}, "
                                       f"{where} {copy.text!r}")
        again = [client.complete(body) for body in bodies]
        for row, a, b in zip(targets, first, again):
            if a.tokens != b.tokens:
                differences.append(f"{row.prompt.kind} (seed {row.seed}): alone {a.text!r}, alone again {b.text!r}")
        calls = len(bodies) * 2 + sum(2 + max(0, self.size - 2) for _ in bodies)
        covered = (f"{len(bodies)} seeded requests (T=1, top-k 8, {self.length} tokens) alone, twice in a burst of "
                   f"{max(2, self.size)} concurrent requests, and alone again")
        if not differences:
            return self.report(plan, Verdict.PASS, f"{covered}: the same tokens every time", calls=calls)
        found = f"{len(differences)} difference(s): " + "; ".join(differences[:4])
        if self.promised:
            replay = curl_command(client.base_url, session.candidate_body(bodies[0]))
            return self.report(plan, Verdict.FAIL, f"the server promises seeded determinism, but of {covered}: "
                                                   f"{found}; replay: {replay}", calls=calls)
        return self.report(plan, Verdict.SKIPPED,
                           f"not judged: {covered} gave {found}.  The OpenAI API promises seeded determinism only "
                           "as best effort, vLLM only with VLLM_BATCH_INVARIANT=1, and batch-shape rounding changes "
                           "tokens legitimately; where the server promises it, audit with seeded_determinism=True "
                           "(--seeded-determinism) to judge it", calls=calls)


__all__ = ["BURST_SETTINGS", "BurstPitCheck", "BurstRow", "ChoicePairsCheck", "CoBatching", "SeedReproducibilityCheck",
           "burst_rows", "co_batching", "server_seconds"]
