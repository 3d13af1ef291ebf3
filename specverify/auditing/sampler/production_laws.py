"""Test laws at the shapes engines serve: real tokenizers' vocabularies, exact in every input dtype.

Vocabularies (:data:`VOCABULARIES`): GPT-2's 50,257 (not a multiple of 64 or 128), Llama-3's
128,256 (above 65,536), Qwen2.5's 151,936 and Gemma's 256,000 (150k-256k).

Exact in every dtype.  Every law here is a vector of integers ``m_t`` over :data:`UNIT` = 2⁻²⁴
(``p(t) = m_t · 2⁻²⁴``, ``Σ m_t = 2²⁴``) with at most 8 significant bits each.  Such a value is
exactly a bfloat16 (8 significant bits), a float16 (11 bits; below 2⁻¹⁴ the subnormals are the
multiples of 2⁻²⁴) and a float32, and the row sums to exactly 1 in each of them.  So the law a
function receives is the same in fp32, bf16 and fp16, the expected law of every test is that one
law, and a correct rule on such inputs has no rounding to excuse: its accept ratios, residuals
``(p − q)_+`` (differences of multiples of 2⁻²⁴) and cumulative sums (in float64) are exact.

Where the mass sits.  Bugs of vocabulary tiling live at tile boundaries, so every production law
puts a fixed share of its mass (:data:`BOUNDARY_MASS`) on the *boundary ids* of its vocabulary
(:func:`boundary_ids`): the first and the last ids, the first id of the last partial tile of every
power-of-two tile size from 64 to 4,096, and ``2^k − 1``, ``2^k`` below V; the rest follows a
Zipf-like law (rank^−1.1, the shape of language-model next-token laws) over a random order of
all ids, so that heavy tokens sit anywhere in the vocabulary (half of them above 65,535 at
V = 131,072) and every token has positive mass unless a family cuts it.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from specverify.core.seeding import derive_seed

UNIT_BITS = 24
"""Masses are integers over 2**UNIT_BITS (2⁻²⁴ is float16's smallest subnormal)."""

TOTAL = 1 << UNIT_BITS
SIGNIFICANT_BITS = 8
"""Significant bits of every integer mass (bfloat16's precision)."""

BOUNDARY_MASS = 1.0 / 3.0
"""Share of a production law on the boundary ids of its vocabulary."""

ZIPF_EXPONENT = 1.1

VOCABULARIES: dict[str, int] = {"gpt2": 50_257, "llama3": 128_256, "qwen2.5": 151_936, "gemma": 256_000}
"""Vocabulary sizes of real tokenizers (GPT-2's is not a multiple of 64 or 128)."""


# --------------------------------------------------------------------------------------------
# Integer masses with 8 significant bits, summing to 2^24
# --------------------------------------------------------------------------------------------


def _granularity(m: np.ndarray) -> np.ndarray:
    """The step between neighbouring integers with 8 significant bits around ``m`` (1 below 256)."""
    bits = np.floor(np.log2(np.maximum(m, 1))).astype(np.int64) + 1
    return np.left_shift(1, np.maximum(bits - SIGNIFICANT_BITS, 0)).astype(np.int64)


def _step_of(m: int) -> int:
    """:func:`_granularity` of one integer, in Python's integers: ``2^(bits(m) − 8)``, 1 below 256."""
    return 1 << max(max(m, 1).bit_length() - SIGNIFICANT_BITS, 0)


def _round_significant(m: np.ndarray) -> np.ndarray:
    step = _granularity(np.maximum(m, 1))
    return (np.rint(m / step) * step).astype(np.int64)


def representable(m: np.ndarray) -> bool:
    """Whether every integer of ``m`` has at most 8 significant bits."""
    m = np.asarray(m, dtype=np.int64)
    return bool(np.all(m % _granularity(m) == 0))


def dyadic_law(weights: np.ndarray, *, name: str = "weights") -> np.ndarray:
    """float64 ``[V]``: the law ``∝ weights`` as integers over 2⁻²⁴ with 8 significant bits each,
    summing to exactly 1 (module docstring).  Tokens of positive weight keep a positive mass (at
    least 2⁻²⁴); zeros stay zero.  The rounding residue goes to the entries that can take it
    exactly: the largest ones first in multiples of their granularity, then ±1 on entries below
    256 units."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 1 or not np.all(weights >= 0) or not weights.sum() > 0:
        raise ValueError(f"{name}: expected non-negative weights [V] with a positive sum")
    positive = weights > 0
    if positive.sum() > TOTAL:
        raise ValueError(f"{name}: {int(positive.sum())} tokens of positive weight do not fit in 2^{UNIT_BITS} units")
    m = np.where(positive, np.maximum(1, _round_significant(weights / weights.sum() * TOTAL)), 0)
    residue = TOTAL - int(m.sum())
    # Each entry is visited once, largest first, so its step is the one it has now.  An entry whose
    # step exceeds |residue| takes no change; steps do not increase along that order, so the
    # entries left to skip are a prefix of the rest, passed over at once.
    order = np.argsort(-m, kind="stable")
    steps = _granularity(m[order])
    negated_steps = -steps  # non-decreasing: searchable
    position = 0
    while residue and position < len(order):
        position = max(position, int(np.searchsorted(negated_steps, -abs(residue), side="left")))
        if position == len(order):
            break
        t, step = order[position], int(steps[position])
        position += 1
        change = int(np.sign(residue)) * (abs(residue) // step) * step
        change = max(change, step - int(m[t]))  # never below one step (stays positive)
        candidate = int(m[t]) + change
        if change and candidate % step == 0 and _step_of(candidate) == step:
            m[t] += change
            residue -= change
    if residue < 0 and np.count_nonzero((m >= 2) & (m < 255)) < -residue:
        top = int(np.argmax(m))  # take one step off the largest entry; the excess goes back below
        step = _step_of(int(m[top]))
        m[top] -= step
        residue += step
    if residue:
        small = np.flatnonzero((m >= 2) & (m < 255)) if residue < 0 else np.flatnonzero((m >= 1) & (m < 255))
        if len(small) < abs(residue):
            raise ValueError(f"{name}: could not make the masses sum to 2^{UNIT_BITS} exactly (residue {residue})")
        m[small[: abs(residue)]] += int(np.sign(residue))
    assert int(m.sum()) == TOTAL and representable(m)
    return m.astype(np.float64) / TOTAL


def exact_in_dtypes(law: np.ndarray) -> bool:
    """Whether ``law`` survives float32, bfloat16 and float16 unchanged and sums to 1 in float64."""
    tensor = torch.from_numpy(np.asarray(law, dtype=np.float64))
    return all(torch.equal(tensor.to(dtype).to(torch.float64), tensor)
               for dtype in (torch.float32, torch.bfloat16, torch.float16)) and float(tensor.sum()) == 1.0


# --------------------------------------------------------------------------------------------
# Production laws
# --------------------------------------------------------------------------------------------


@functools.cache
def boundary_ids(vocab_size: int) -> np.ndarray:
    """Ids where tiling bugs show: 0, 1, the last 16 ids, the first id of the last partial tile of
    every tile size 2^6 … 2^12 that does not divide V, and 2^k − 1, 2^k for 2^7 ≤ 2^k < V
    (sorted, read-only: one array per vocabulary)."""
    v = vocab_size
    ids = [0, 1, *range(max(0, v - 16), v)]
    for bits in range(6, 13):
        tile = 1 << bits
        if v % tile and v > tile:
            ids.append(v - v % tile)
    k = 7
    while (1 << k) < v:
        ids += [(1 << k) - 1, 1 << k]
        k += 1
    edges = np.unique(np.array([i for i in ids if 0 <= i < v], dtype=np.int64))
    edges.setflags(write=False)
    return edges


@functools.cache
def inner_ids(vocab_size: int) -> np.ndarray:
    """The ids of the vocabulary that are not :func:`boundary_ids` (sorted, read-only)."""
    inner = np.ones(vocab_size, dtype=bool)
    inner[boundary_ids(vocab_size)] = False
    ids = np.flatnonzero(inner)
    ids.setflags(write=False)
    return ids


def zipf_weights(rng: np.random.Generator, vocab_size: int, exponent: float = ZIPF_EXPONENT) -> np.ndarray:
    """rank^−exponent over a random order of all ids (every id positive)."""
    ranks = rng.permutation(vocab_size) + 1
    return ranks.astype(np.float64) ** -exponent


def production_weights(rng: np.random.Generator, vocab_size: int, *, boundary_mass: float = BOUNDARY_MASS,
                       exponent: float = ZIPF_EXPONENT) -> np.ndarray:
    """Unnormalised production law: ``boundary_mass`` spread over :func:`boundary_ids` (Zipf
    weights among them, in a random order), the rest Zipf over all ids."""
    base = zipf_weights(rng, vocab_size, exponent)
    base /= base.sum()
    edges = boundary_ids(vocab_size)
    on_edges = np.arange(1, len(edges) + 1, dtype=np.float64)[rng.permutation(len(edges))] ** -0.5
    weights = (1.0 - boundary_mass) * base
    weights[edges] += boundary_mass * on_edges / on_edges.sum()
    return weights


def production_law(rng: np.random.Generator, vocab_size: int, **options: float) -> np.ndarray:
    """:func:`production_weights` as an exact law (:func:`dyadic_law`)."""
    return dyadic_law(production_weights(rng, vocab_size, **options))


def near_law(rng: np.random.Generator, law: np.ndarray, closeness: float) -> np.ndarray:
    """A draft close to ``law``: ``closeness · law + (1 − closeness) · other`` with ``other`` a
    production law of another order (acceptance Σ min ≥ closeness), exact."""
    other = production_weights(rng, len(law))
    return dyadic_law(closeness * law + (1.0 - closeness) * other / other.sum())


def top_p_cut(law: np.ndarray, top_p: float) -> np.ndarray:
    """``law`` cut to its smallest set of most likely tokens with mass ≥ ``top_p`` (ties by id), exact."""
    order = np.argsort(-law, kind="stable")
    keep = int(np.searchsorted(np.cumsum(law[order]), top_p) + 1)
    cut = np.zeros_like(law)
    cut[order[:keep]] = law[order[:keep]]
    return dyadic_law(cut)


def permuted(rng: np.random.Generator, law: np.ndarray) -> np.ndarray:
    """``law`` with its masses moved to other ids, boundary ids among boundary ids and the others
    among the others: a different law with the same multiset of masses (so the identity test's
    sample size, which depends on the masses only, is the same) and the same mass on the boundary."""
    edges, inner = boundary_ids(len(law)), inner_ids(len(law))
    moved = law.copy()
    moved[edges] = law[rng.permutation(edges)]
    moved[inner] = law[rng.permutation(inner)]
    return moved


CLOSENESS: dict[str, float] = {"bonus": 0.95, "deep": 0.92, "deeper": 0.96, "correction": 0.5}
"""The closeness (:func:`near_law`) of each family whose drafts are near the target."""


@functools.cache
def step_family(name: str, family: str, vocab_size: int, num_draft: int,
                num_chains: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``p [R, K+1, V]`` and ``q [R, K, V]`` of ``num_chains`` production chains, exact in every dtype.

    Every target law of the family is :func:`permuted` from one base law (the positions and
    chains differ in where the mass sits, not in its multiset), so one sample-size computation
    covers every (chain, position) test.

    bonus: ``q_i`` within 5 % of ``p_i`` (acceptance ≥ 0.95 per position: the bonus is reached);
    deep: ``q_i`` within 8 % of ``p_i`` (acceptance ≥ 0.92, 0.95 on the laws drawn: 0.43 of the rows
    would reach position 16, 0.18 position 32, too few for the deepest positions);
    deeper: ``q_i`` within 4 % of ``p_i`` (acceptance ≥ 0.96, 0.975 on the laws drawn: at K = 32,
    0.44 of the rows reach the bonus at position 32 and 0.21 are corrected at a position 17-31);
    correction: ``q_i = ½ p_i + ½ other`` (partly overlapping: acceptance ≈ 0.65, corrections at
    every position);
    zeros: the base law cut to its top-p 0.9 nucleus (most ids exactly 0); ``q_i`` half another law
    cut to its top-p 0.95 (drafts the target forbids), half ``p_i`` without a random third of its
    support (zeros on tokens the target allows).
    """
    rng = np.random.default_rng(derive_seed("production-laws", name, family, vocab_size, num_draft, num_chains))
    base = production_law(rng, vocab_size)
    if family == "zeros":
        base = top_p_cut(base, 0.9)
    p = np.stack([np.stack([permuted(rng, base) for _ in range(num_draft + 1)]) for _ in range(num_chains)])
    q = np.empty((num_chains, num_draft, vocab_size))
    for r in range(num_chains):
        for i in range(num_draft):
            if family in CLOSENESS:
                q[r, i] = near_law(rng, p[r, i], CLOSENESS[family])
            elif family == "zeros":
                support = np.flatnonzero(p[r, i])
                kept = p[r, i].copy()
                kept[rng.choice(support, size=len(support) // 3, replace=False)] = 0.0
                q[r, i] = dyadic_law(0.5 * top_p_cut(production_law(rng, vocab_size), 0.95) + 0.5 * kept / kept.sum())
            else:
                raise ValueError(f"family: unknown production family {family!r} "
                                 f"({', '.join(CLOSENESS)}, zeros)")
    return p, q


__all__ = ["BOUNDARY_MASS", "CLOSENESS", "SIGNIFICANT_BITS", "TOTAL", "UNIT_BITS", "VOCABULARIES", "boundary_ids",
           "dyadic_law", "exact_in_dtypes", "inner_ids", "near_law", "permuted", "production_law",
           "production_weights", "representable", "step_family", "top_p_cut", "zipf_weights"]
