"""Greedy identity with explanations, and batch invariance, for a server (SPEC §4).

Lossless greedy speculative decoding returns the target's own greedy tokens.  Two servers (or one
server alone and under load) may still differ where the target's top two logits are within
rounding noise of each other: batch composition, kernel choice and the verify pass's batched
forward change the last bits of the logits.  So each first divergence is judged by the
*reference* run's own logprobs at that position:

    margin = lp(top 1) − lp(top 2)          gap = lp(reference token) − lp(other token)

and is **explained** when ``gap ≤ tolerance``, where ``tolerance = max(2 τ, TOLERANCE_FLOOR)`` and
τ, the rounding noise, is measured on the same servers: the largest |Δ logprob| of one token at
one position between (a) the baseline's repeated requests alone and under a concurrent burst
(batch composition changes numerics) and (b) the candidate's and the baseline's logprobs on the
tokens where they agree.  A divergence with ``gap > tolerance`` is UNEXPLAINED: the other server
emitted a token the reference scores clearly below its own choice, which no rounding explains.

τ is bounded: a candidate whose logprobs on agreed tokens differ from the baseline's by more than
:data:`LOGPROB_TOLERANCE` nats computes a different law, and the check fails on that alone (so a
corrupted model cannot widen τ to excuse its divergences).

Without a baseline the candidate's own logprobs stand for the target's law (SPEC §4): each greedy
token must be the top-1 of the candidate's own returned law at its position, within tolerance.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specverify.auditing.endpoint.client import Completion

TOLERANCE_FLOOR = 1e-4
"""Smallest tolerance (nats): logprobs travel as decimal text of float32 values (~1e-7 relative)."""

LOGPROB_TOLERANCE = 0.05
"""Largest |Δ logprob| (nats) between candidate and baseline on agreed tokens that still counts as
the same law; rounding noise of one model in fp16/bf16/fp32 on one engine is 1e-6…1e-2."""


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


def logprob_differences(a: Completion, b: Completion) -> list[tuple[int, float]]:
    """(position, max |Δ logprob| over the tokens both return) at every position before the first
    token difference of two completions of the same prompt."""
    stop = first_difference(a.tokens, b.tokens)
    stop = len(a.tokens) if stop is None else stop
    differences = []
    for position in range(stop):
        top_a, top_b = a.top_logprobs[position] or {}, b.top_logprobs[position] or {}
        shared = [abs(top_a[t] - top_b[t]) for t in top_a.keys() & top_b.keys()]
        own_a, own_b = a.token_logprobs[position], b.token_logprobs[position]
        if own_a is not None and own_b is not None:
            shared.append(abs(own_a - own_b))
        if shared:
            differences.append((position, max(shared)))
    return differences


def rounding_noise(pairs: Sequence[tuple[Completion, Completion]]) -> float:
    """τ: the largest |Δ logprob| on agreed tokens over pairs of completions of the same prompt."""
    return max((d for a, b in pairs for _, d in logprob_differences(a, b)), default=0.0)


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
