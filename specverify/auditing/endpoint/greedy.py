"""Greedy identity with explanations, and batch invariance, for a server (SPEC §4).

Lossless greedy speculative decoding returns the target's own greedy tokens.  Two servers (or one
server alone and under load) may still differ where the target's top two logits are within
rounding noise of each other: batch composition, kernel choice and the verify pass's batched
forward change the last bits of the logits.  So each first divergence is judged by the
*reference* run's own logprobs at that position:

    margin = lp(top 1) − lp(top 2)          gap = lp(reference token) − lp(other token)

and is **explained** when ``gap ≤ tolerance``, where ``tolerance = max(2 τ, TOLERANCE_FLOOR)``.

τ, the rounding noise, is measured on the same servers as a *position deviation*: at one position
of two evaluations of the same tokens, the largest |Δ logprob| of the first evaluation's top two
tokens (the tokens a greedy flip is about).  The baseline's own noise ``N`` is its deviations
between evaluations of its greedy tokens along different numeric paths: repeated alone, repeated
inside a concurrent burst (batch composition), and re-scored in one batched prefill (``echo``; a
verify pass evaluates its drafts as a batch too).  The candidate's deviations ``C`` are its
logprobs against the baseline's on the tokens both emitted.  τ is the larger of the two upper
deciles, ``max(Q₀.₉(N), Q₀.₉(C))``: a quantile, because the maximum of a numeric-noise sample is
set by its rarest outlier (on llama-cpp-python one re-scored position in ~100 moved by 6 nats).

τ is bounded by :func:`same_law_test`: the candidate must not deviate from the baseline more
often than the baseline deviates from itself, so a candidate computing another law (a corrupted
model, a wrong temperature, a verify pass with wrong logits) fails on that alone and cannot widen
τ to excuse its divergences.

Without a baseline the candidate's own logprobs stand for the target's law (SPEC §4): each greedy
token must be the top-1 of the candidate's own returned law at its position, within tolerance.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

from specverify.auditing.endpoint.client import Completion

TOLERANCE_FLOOR = 1e-4
"""Smallest tolerance (nats): logprobs travel as decimal text of float32 values (~1e-7 relative)."""

LOGPROB_TOLERANCE = 0.05
"""Floor (nats) of the same-law threshold: a deterministic engine's repeats agree exactly, and its
logprobs travel as decimal text; one model's rounding noise in fp16/bf16/fp32 is 1e-6…1e-2."""


@dataclass(frozen=True)
class Divergence:
    """The first position where ``other`` left ``reference`` (token strings), judged by the
    reference's logprobs there: ``gap = lp(reference token) − lp(other token)`` (``inf`` when the
    other token is not among the reference's returned alternatives, i.e. below its n-th)."""

    prompt: str
    position: int
    reference_token: str
    other_token: str
    margin: float
    gap: float
    explained: bool

    def describe(self) -> str:
        gap = "beyond the returned top-n" if math.isinf(self.gap) else f"{self.gap:.3g}"
        return (f"{self.prompt}: token {self.position}: {self.reference_token!r} vs {self.other_token!r}, "
                f"top-2 margin {self.margin:.3g}, gap {gap}")


def top_two_margin(alternatives: Mapping[str, float] | None) -> float:
    """lp(top 1) − lp(top 2) of one position's returned alternatives (inf with fewer than two)."""
    if not alternatives or len(alternatives) < 2:
        return math.inf
    first, second = sorted(alternatives.values(), reverse=True)[:2]
    return first - second


def first_difference(a: Sequence[str], b: Sequence[str]) -> int | None:
    """Index of the first differing token, the shorter length if one is a prefix, None if equal."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def position_deviations(a: Sequence[Mapping[str, float] | None], b: Sequence[Mapping[str, float] | None],
                        count: int) -> list[float]:
    """Per position ``i < count``: the largest |Δ logprob| between the returned laws ``a[i]`` and
    ``b[i]`` over ``a[i]``'s top two tokens that ``b[i]`` lists too (positions sharing none are
    skipped)."""
    deviations = []
    for position in range(min(count, len(a), len(b))):
        first, second = a[position] or {}, b[position] or {}
        top_two = sorted(first.items(), key=lambda kv: (-kv[1], kv[0]))[:2]
        shared = [abs(lp - second[token]) for token, lp in top_two if token in second]
        if shared:
            deviations.append(max(shared))
    return deviations


def agreed_deviations(a: Completion, b: Completion) -> list[float]:
    """:func:`position_deviations` of two completions of one prompt before their first token difference."""
    stop = first_difference(a.tokens, b.tokens)
    return position_deviations(a.top_logprobs, b.top_logprobs, len(a.tokens) if stop is None else stop)


UPPER_QUANTILE = 0.9
"""τ and the same-law threshold are upper deciles of position deviations (module docstring)."""

SAME_LAW_ALPHA = 1e-3
"""Level of :func:`same_law_test` (nominal: positions of one text are not independent draws)."""


@dataclass(frozen=True)
class SameLawTest:
    """Exceedance test of the candidate's position deviations against the baseline's own noise:
    ``threshold = max(LOGPROB_TOLERANCE, Q₀.₉(noise))``; ``exceeding`` of the ``n`` candidate
    deviations lie above it; ``pvalue = P(Binomial(n, 0.1) ≥ exceeding)``."""

    threshold: float
    exceeding: int
    n: int
    pvalue: float
    noise_quantile: float
    cross_quantile: float

    @property
    def same_law(self) -> bool:
        return self.pvalue > SAME_LAW_ALPHA


def upper_quantile(values: Sequence[float]) -> float:
    return float(np.quantile(np.asarray(values, dtype=np.float64), UPPER_QUANTILE)) if len(values) else 0.0


def same_law_test(cross: Sequence[float], noise: Sequence[float]) -> SameLawTest:
    """Does the candidate deviate from the baseline more often than the baseline from itself?

    Under H0 "the candidate's logprobs are the baseline's law, evaluated along another numeric
    path whose noise is no larger than the baseline's own between its paths", a candidate
    deviation exceeds the baseline's upper decile with probability at most 0.1, so the number of
    exceedances among n positions is at most Binomial(n, 0.1) (positions taken as exchangeable;
    hence the nominal level).  Another law shifts the logprobs at most positions, not one in ten.
    The threshold never drops below :data:`LOGPROB_TOLERANCE` (the decimal-text rounding of a
    deterministic engine would otherwise count as a law change)."""
    threshold = max(LOGPROB_TOLERANCE, upper_quantile(noise))
    exceeding = sum(1 for d in cross if d > threshold)
    pvalue = float(binom.sf(exceeding - 1, len(cross), 1.0 - UPPER_QUANTILE)) if cross else 1.0
    return SameLawTest(threshold, exceeding, len(cross), pvalue, upper_quantile(noise), upper_quantile(cross))


def tolerance(tau: float) -> float:
    return max(2.0 * tau, TOLERANCE_FLOOR)


def judge_divergence(prompt: str, reference: Completion, other: Completion, tol: float) -> Divergence | None:
    """The first divergence of ``other`` from ``reference``, explained or not (None if identical).

    A shorter ``other`` (it stopped early, e.g. at EOS) diverges at its end: the reference's token
    there against end-of-sequence, which the reference's alternatives may list as a token string.
    """
    position = first_difference(reference.tokens, other.tokens)
    if position is None:
        return None
    if position >= len(reference.tokens):
        return Divergence(prompt, position, "<end>", other.tokens[position], math.inf, math.inf, False)
    alternatives = reference.top_logprobs[position] or {}
    own = reference.token_logprobs[position]
    own = alternatives.get(reference.tokens[position]) if own is None else own
    other_token = other.tokens[position] if position < len(other.tokens) else "<end>"
    other_lp = alternatives.get(other_token)
    gap = math.inf if own is None or other_lp is None else own - other_lp
    margin = top_two_margin(alternatives)
    return Divergence(prompt, position, reference.tokens[position], other_token, margin, gap, gap <= tol)


def self_inconsistency(prompt: str, completion: Completion, tol: float) -> Divergence | None:
    """Without a baseline: the first position whose greedy token is not the top-1 of the server's
    own returned law there (within ``tol``)."""
    for position, (token, alternatives) in enumerate(zip(completion.tokens, completion.top_logprobs)):
        if not alternatives:
            continue
        best_token, best = max(alternatives.items(), key=lambda kv: kv[1])
        own = completion.token_logprobs[position]
        own = alternatives.get(token) if own is None else own
        gap = math.inf if own is None else best - own
        if gap > 0:
            return Divergence(prompt, position, best_token, token, top_two_margin(alternatives), gap, gap <= tol)
    return None


def curl_command(base_url: str, body: Mapping[str, object]) -> str:
    """A shell command that replays one request."""
    payload = json.dumps(dict(body)).replace("'", "'\\''")
    return f"curl -s {base_url}/completions -H 'Content-Type: application/json' -d '{payload}'"
