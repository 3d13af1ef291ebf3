"""Greedy identity, its noise, and batch invariance, for a server (SPEC §4).

Lossless greedy speculative decoding returns the target's own greedy tokens.  Every token of the
candidate's completion is judged, not only up to its first divergence from the baseline
(:mod:`specverify.core.greedy_identity`): the baseline re-scores the candidate's whole completion
in one batched prefill (``echo``, :mod:`specverify.auditing.endpoint.scoring`), the endpoint
level's teacher forcing, and at every position the baseline's top logprob given the candidate's
own prefix must not exceed the candidate token's by more than the tolerance:

    gap = lp(baseline's top token) − lp(candidate's token) ≤ tolerance

(inf when the candidate's token is not among the returned alternatives); and no more positions
may differ from the baseline's argmax than differ for the baseline's *own* greedy tokens under
the same echo (the divergent-positions test, at level :data:`SAME_LAW_ALPHA`).  Without a
baseline the candidate's own returned laws score it (each greedy token must be the top-1 of the
law the server returned with it).  Where an echo does not re-tokenize to the completion's tokens,
that row is scored by the reference's logprobs over the shared prefix, through its first
divergence (:func:`scored_row`).

The tolerance is greedy identity's one rule
(:func:`specverify.core.greedy_identity.noise_tolerance`) applied to the rounding noise measured on
the same servers as *position deviations*: at one position of two evaluations of the same tokens,
the largest |Δ logprob| of the first evaluation's top two tokens (the tokens a greedy flip is
about).  Three samples of them:

- ``R``: the reference's own greedy tokens repeated alone and inside a concurrent burst (batch
  composition changes numerics);
- ``E``: the baseline's greedy tokens re-scored in one batched prefill (``echo``), against the
  logprobs it returned generating them one at a time: the numeric path of the re-scoring;
- ``C``: the candidate's logprobs against the baseline's on the tokens both emitted.

``R`` and ``E`` are the reference's own numeric paths, noise the audit trusts: they enter by their
maximum.  ``C`` is supplied by the candidate: it enters only after :func:`same_law_test` accepted
it as the baseline's law (the candidate must not exceed the baseline's own upper-decile noise, of
``R`` or ``E`` the larger, at more positions than one law explains, so a candidate computing
another law, such as a corrupted model, a wrong temperature or a verify pass with wrong logits,
fails on that alone), and then only by its upper decile, which a few outlying positions cannot
move (:func:`greedy_tolerance`):

    τ = max(max R, max E, Q₀.₉(C))          tolerance = max(2 τ, TOLERANCE_FLOOR)

Without a baseline the candidate's server is the reference: ``R`` is its repeats, and there is no
``E`` or ``C``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy.stats import binom

from specverify.auditing.endpoint.client import Completion
from specverify.core.greedy_identity import (
    UPPER_QUANTILE,
    NoiseTolerance,
    ScoredRow,
    noise_tolerance,
    score_laws,
    upper_quantile,
)

TOLERANCE_FLOOR = 1e-4
"""Smallest tolerance (nats): logprobs travel as decimal text of float32 values (~1e-7 relative)."""

LOGPROB_TOLERANCE = 0.05
"""Floor (nats) of the same-law threshold: a deterministic engine's repeats agree exactly, and its
logprobs travel as decimal text; one model's rounding noise in fp16/bf16/fp32 is 1e-6…1e-2."""


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


SAME_LAW_ALPHA = 1e-3
"""Level of :func:`same_law_test` and of the divergent-positions test (nominal: positions of one
text are not independent draws)."""


@dataclass(frozen=True)
class SameLawTest:
    """Exceedance test of the candidate's position deviations against the baseline's own noise
    (:func:`same_law_test`): ``threshold`` = the noise sample's upper-decile order statistic (at
    least :data:`LOGPROB_TOLERANCE`); ``exceeding`` of the ``n`` candidate deviations lie above it;
    ``pvalue`` = P(that many or more) under exchangeability."""

    threshold: float
    exceeding: int
    n: int
    pvalue: float
    noise_quantile: float
    cross_quantile: float

    @property
    def same_law(self) -> bool:
        return self.pvalue > SAME_LAW_ALPHA


def exceedance_pvalue(exceeding: int, n: int, rank: int, m: int) -> float:
    """P(X ≥ ``exceeding``), X = how many of n values exceed the ``rank``-th largest of m others,
    all n + m exchangeable (Gumbel & von Schelling 1950, the exceedance distribution):

        P(X = x) = C(x + r − 1, x) · C(n − x + m − r, n − x) / C(n + m, n)."""
    total = math.comb(n + m, n)
    tail = sum(math.comb(x + rank - 1, x) * math.comb(n - x + m - rank, n - x) for x in range(exceeding, n + 1))
    return tail / total


def same_law_test(cross: Sequence[float], noise_samples: Sequence[Sequence[float]]) -> SameLawTest:
    """Does the candidate deviate from the baseline more often than the baseline from itself?

    ``noise_samples``: the baseline's own position deviations, one sample per pair of numeric
    paths (repeat/load, echo re-scoring).  The threshold is the upper-decile order statistic
    (the r-th largest, r = ⌈m/10⌉) of the sample where that is largest, floored at
    :data:`LOGPROB_TOLERANCE` (a deterministic engine's decimal-text rounding is not a law
    change).  Under H0 "the candidate's logprobs are the baseline's law along another numeric
    path, as noisy as the baseline's noisiest", candidate and noise deviations are exchangeable
    and the number above the threshold follows :func:`exceedance_pvalue` (≈ Binomial(n, r/m));
    a higher threshold (the floor, the larger of the samples) only lowers it.  Another law moves
    most positions, not one in ten.  Positions of one text are not independent draws, so the
    level :data:`SAME_LAW_ALPHA` is nominal."""
    samples = [list(sample) for sample in noise_samples if len(sample)]
    noise = max(samples, key=upper_quantile, default=[])
    m = len(noise)
    rank = max(1, math.ceil((1.0 - UPPER_QUANTILE) * m)) if m else 0
    order = sorted(noise, reverse=True)[rank - 1] if m else 0.0
    threshold = max(LOGPROB_TOLERANCE, order)
    exceeding = sum(1 for d in cross if d > threshold)
    if not cross:
        pvalue = 1.0
    elif m:
        pvalue = exceedance_pvalue(exceeding, len(cross), rank, m)
    else:  # no noise sample at all: one in ten above the floor, at most
        pvalue = float(binom.sf(exceeding - 1, len(cross), 1.0 - UPPER_QUANTILE))
    return SameLawTest(threshold, exceeding, len(cross), pvalue, upper_quantile(noise), upper_quantile(cross))


def greedy_tolerance(repeat: Sequence[float] = (), echo: Sequence[float] = (), cross: Sequence[float] = (),
                     law: SameLawTest | None = None) -> NoiseTolerance:
    """The greedy tolerance from the position deviations ``repeat`` (R), ``echo`` (E) and ``cross``
    (C), C only where ``law`` (:func:`same_law_test` of C) accepted it (module docstring); with no
    samples, the floor :data:`TOLERANCE_FLOOR`."""
    accepted = cross if law is not None and law.same_law else ()
    return noise_tolerance([*repeat, *echo], accepted, floor=TOLERANCE_FLOOR)


def scored_row(prompt: str, completion: Completion, laws: Sequence[Mapping[str, float] | None] | None,
               reference: Completion) -> ScoredRow:
    """``completion``'s tokens scored by ``laws``, the target's law at each of them given the tokens
    before it (the baseline's echo, or the server's own returned laws); where there are none (the
    echo did not re-tokenize to these tokens) by ``reference``'s returned laws over the prefix the
    two share, through the first position where they differ (the same prefix up to there)."""
    if laws is not None:
        return score_laws(prompt, completion.tokens, laws)
    stop = first_difference(reference.tokens, completion.tokens)
    shared = min(len(completion.tokens), len(reference.tokens)) if stop is None else min(stop + 1,
                                                                                         len(completion.tokens))
    return score_laws(prompt, completion.tokens[:shared], reference.top_logprobs[:shared])


def length_difference(prompt: str, completion: Completion, reference: Completion) -> str | None:
    """Where the two stopped after different numbers of tokens (end of sequence is no token the
    logprobs score): a description, else None."""
    if len(completion.tokens) == len(reference.tokens):
        return None
    return (f"{prompt}: the candidate stopped after {len(completion.tokens)} tokens ({completion.finish_reason}), "
            f"the reference after {len(reference.tokens)} ({reference.finish_reason})")


def curl_command(base_url: str, body: Mapping[str, object]) -> str:
    """A shell command that replays one request."""
    payload = json.dumps(dict(body)).replace("'", "'\\''")
    return f"curl -s {base_url}/completions -H 'Content-Type: application/json' -d '{payload}'"
