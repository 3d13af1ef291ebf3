"""Sequential randomized probability integral transform (PIT) of sampled tokens.

For a token x sampled from a law p over an ordered set of tokens, with F(x−) = Σ_{y before x} p(y),

    u = F(x−) + U · p(x),        U ~ Uniform(0, 1) independent of everything else,

is Uniform(0, 1) exactly when x ~ p (the randomized PIT; Brockwell 2007, "Universal residuals",
Lemma 1).  Applied to every token of a sampled sequence, each with the law p(· | prompt, x_<i)
at its own prefix, the u's are i.i.d. Uniform(0, 1) (Rosenblatt 1952): u_i is uniform given
everything before it, whatever the earlier tokens were.  If the server samples position i from
q instead, u_i has density q(x)/p(x) on x's interval, so its law is at TV exactly TV(q, p) from
the uniform one; binning u into B equal cells can only lower that TV.

The law p comes from returned logprobs: the audit asks for top-k sampling with k ≤ n (n =
returned alternatives), where the processed law is computable at any temperature T:

    p(x) = exp(lp(x) / T) / Σ_{y in top-k} exp(lp(y) / T)   for x in the top k, 0 elsewhere

(temperature and top-k commute, so the engines' different orders of applying them agree).  A
token outside the top k has probability 0 under that law: certain loss.  Ties at the k-th rank
within rounding noise are settled in the sample's favour (:func:`pit_value`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ProcessedLaw:
    """Ordered (token, probability) pairs of the top-k law at temperature T; ``boundary`` is the
    logprob of the k-th token (for rank ties) and ``tail`` the returned alternatives below it."""

    tokens: tuple[str, ...]
    probs: tuple[float, ...]
    boundary: float
    tail: Mapping[str, float]


def processed_law(alternatives: Mapping[str, float], *, temperature: float, top_k: int) -> ProcessedLaw:
    """The law after temperature ``temperature`` and top-``top_k`` from one position's returned
    logprobs (raw log-softmax values, at least ``top_k`` of them)."""
    if temperature <= 0:
        raise ValueError(f"temperature: the PIT needs a positive temperature, got {temperature!r}")
    if len(alternatives) < top_k:
        raise ValueError(f"alternatives: need at least top_k = {top_k} returned logprobs, got {len(alternatives)}")
    ranked = sorted(alternatives.items(), key=lambda kv: (-kv[1], kv[0]))
    kept, tail = ranked[:top_k], dict(ranked[top_k:])
    scaled = np.array([lp for _, lp in kept], dtype=np.float64) / temperature
    weights = np.exp(scaled - scaled.max())
    probs = weights / weights.sum()
    return ProcessedLaw(tuple(t for t, _ in kept), tuple(float(p) for p in probs), kept[-1][1], tail)


def truncated_law(law: ProcessedLaw, *, top_p: float = 1.0, min_p: float = 0.0,
                  tie_tolerance: float = 0.0) -> ProcessedLaw | None:
    """``law`` (ranked, after temperature and top-k) further truncated by nucleus ``top_p`` (the
    shortest run of ranks whose probability reaches ``top_p``) or ``min_p`` (the tokens of
    probability ≥ ``min_p`` × the largest), renormalized; a token cut has probability 0.  Computed
    on the top-k law, the order vLLM, SGLang and llama.cpp apply them in (at temperature 1 the order
    relative to temperature does not matter).  None when the cut is ambiguous: a cumulative
    probability (``top_p``) or a probability (``min_p``) within a factor e^``tie_tolerance`` (and
    1e-9) of its threshold, where rounding on the server may keep a token this law cuts.  Whether a
    position is judged then depends on its law only, never on the token drawn there."""
    probs = np.asarray(law.probs, dtype=np.float64)
    slack = math.expm1(tie_tolerance) + 1e-9
    keep = len(probs)
    if top_p < 1.0:
        cumulative = np.cumsum(probs)
        keep = min(keep, int(np.searchsorted(cumulative, top_p)) + 1)
        if np.any(np.abs(cumulative[:-1] - top_p) <= slack * top_p):
            return None
    if min_p > 0.0:
        threshold = min_p * probs[0]
        keep = min(keep, int(np.count_nonzero(probs >= threshold)))
        if np.any(np.abs(probs - threshold) <= slack * threshold):
            return None
    if keep == len(probs):
        return law
    kept = probs[:keep] / probs[:keep].sum()
    return ProcessedLaw(law.tokens[:keep], tuple(float(p) for p in kept), law.boundary, {})


def pit_value(law: ProcessedLaw, token: str, uniform: float, *, tie_tolerance: float) -> float | None:
    """u = F(token−) + U · p(token) under ``law``; None when the token has probability 0 there
    (outside the top k by more than ``tie_tolerance`` nats, or not among the returned logprobs).

    A token just outside the top k, within ``tie_tolerance`` of the k-th logprob, took the k-th
    rank on the sampling server (a rounding-level tie): it is scored as the k-th token."""
    cumulative = 0.0
    for candidate, probability in zip(law.tokens, law.probs):
        if candidate == token:
            return cumulative + uniform * probability
        cumulative += probability
    lp = law.tail.get(token)
    if lp is not None and law.boundary - lp <= tie_tolerance:
        last = law.probs[-1]
        return 1.0 - last + uniform * last
    return None


def uniform_bins(values: np.ndarray, bins: int) -> np.ndarray:
    """Counts of ``values`` in the ``bins`` equal cells of [0, 1)."""
    index = np.minimum((np.asarray(values, dtype=np.float64) * bins).astype(np.int64), bins - 1)
    return np.bincount(index, minlength=bins)


def plug_in_tv(counts: np.ndarray) -> float:
    """½ Σ |count/n − 1/B| of binned u's (diagnosis)."""
    n = counts.sum()
    return 0.5 * float(np.abs(counts / n - 1.0 / counts.size).sum()) if n else math.nan


def token_pit_values(laws: np.ndarray, tokens: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """The randomized PIT of token ids: u = F(x−) + U · p(x) for every ``tokens[...]`` under its own
    law ``laws[..., :]`` (float64, tokens ordered by id, F(x−) = Σ_{y < x} p(y)) with
    ``uniforms[...]`` as U; NaN where p(x) = 0 (a token the law cannot produce)."""
    index = np.asarray(tokens, dtype=np.int64)[..., None]
    probability = np.take_along_axis(laws, index, -1)[..., 0]
    below = np.take_along_axis(np.cumsum(laws, -1) - laws, index, -1)[..., 0]
    return np.where(probability > 0, below + uniforms * probability, np.nan)
