"""Hypothesis strategies for speculative-decoding tests (public: other projects import these).

Every strategy here is a small composable piece in the style of ``hypothesis.strategies``:

- :func:`probability_vectors` / :func:`large_vocab_probability_vectors`: one distribution ``[V]``;
- :func:`draft_target_pairs`: a target ``p`` and a draft ``q`` in a chosen relation (identical,
  disjoint supports, one-sided zeros, or an exact total variation distance);
- :func:`verify_inputs`: the three tensors of one verification step (SPEC §1), optionally ragged;
- :func:`markov_chains` / :func:`positional_chains`: toy language models from ``specverify.core.chains``;
- :func:`sampling_params`: a ``specverify.core.processing.SamplingParams``.

Conventions.  Distributions are numpy float64 arrays (tensors only where a step's inputs are
built), renormalised in float64, so ``|sum - 1|`` is a few float64 ulps.  Sizes may be given as an
``int`` or as a strategy of ints.  Every strategy shrinks towards the simplest example of its
kind (stated in each docstring): small vocabularies, uniform or one-hot vectors, token 0, TV 0.

Seeds.  :func:`large_vocab_probability_vectors` draws an integer seed, but only to *construct* a
distribution.  No strategy here hands a drawn seed to anything that samples: a statistical test
must derive its sampling seed from its own parameters (``specverify.core.seeding.derive_seed``), never
from Hypothesis, or shrinking would hunt for a lucky seed.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

__all__ = [
    "KINDS",
    "RELATIONS",
    "VerifyInputs",
    "draft_target_pairs",
    "large_vocab_probability_vectors",
    "markov_chains",
    "positional_chains",
    "probability_vectors",
    "sampling_params",
    "verify_inputs",
]

KINDS = ("dense", "sparse", "peaked", "near_uniform", "tiny_mass")
RELATIONS = (
    "identical",
    "disjoint",
    "draft_zero_where_target_positive",
    "target_zero_where_draft_positive",
    "tv",
)
_RELATIONS_NEEDING_TWO_TOKENS = frozenset(RELATIONS) - {"identical"}
_SUPPORTED_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_MAX_MARKOV_CONTEXTS = 1024  # rows of a Markov table (V ** order) a strategy will draw one by one
_MIN_WEIGHT = 1e-3  # smallest relative weight of a positive entry in the small-vocabulary kinds
_SUM_REPAIR_STEPS = 2048  # bound on the entries that absorb the rounding deficit (a few in practice)

# ------------------------------------------------------------------------------------------------
# Argument handling
# ------------------------------------------------------------------------------------------------


def _int_strategy(value: int | st.SearchStrategy[int], name: str, minimum: int) -> st.SearchStrategy[int]:
    """``value`` as a strategy; ints are checked eagerly, drawn ints are filtered to ``>= minimum``."""
    if isinstance(value, st.SearchStrategy):
        return value.filter(lambda drawn: drawn >= minimum)
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name}: expected an int or a strategy of ints, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected at least {minimum}, got {value}")
    return st.just(int(value))


def _check_dtype(dtype: torch.dtype | None) -> None:
    if dtype is not None and dtype not in _SUPPORTED_DTYPES:
        raise ValueError(f"dtype: expected None or one of {_SUPPORTED_DTYPES}, got {dtype!r}")


def _check_relation(relation: str) -> None:
    if relation != "any" and relation not in RELATIONS:
        raise ValueError(f"relation: expected 'any' or one of {RELATIONS}, got {relation!r}")


# ------------------------------------------------------------------------------------------------
# Rounding to a low-precision dtype
# ------------------------------------------------------------------------------------------------


def _cast(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Round float64 ``values`` to the nearest ``dtype`` value and return them as float64."""
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).to(dtype).to(torch.float64).numpy()


def _spacing(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The gap from each ``dtype`` value to the next larger one (``ulp``), as float64."""
    info = torch.finfo(dtype)
    _, exponent = np.frexp(values)  # values = m * 2**exponent with m in [0.5, 1)
    return np.maximum(np.ldexp(info.eps, exponent - 1), info.tiny * info.eps)


def _round_to_dtype(vector: np.ndarray, dtype: torch.dtype | None) -> np.ndarray:
    """Round a float64 distribution to ``dtype`` so that it still sums to 1 as well as it can.

    Each entry is rounded to the nearest ``dtype`` value.  Then the deficit ``d = 1 - Σ v`` is
    absorbed step by step: an entry ``v`` may take the step ``s = d`` (or, when ``d < 0``, at most
    half of itself: ``s = max(d, -v/2)``, so positive entries stay positive); the largest entry
    whose spacing (ulp) is at most ``|s|`` becomes ``round(v + s)``, until ``d = 0`` or no entry
    can move.  Zeros stay zero.

    Each step leaves ``|d|`` smaller (by at least half the step), so the result is never worse
    than plain rounding.  Guarantee (checked by tests/testing/test_strategies.py): every entry is exactly
    representable in ``dtype``; positive entries stay positive (except that float16 flushes an
    entry below ``2**-25`` to zero, as float16 itself would); and
    ``|fsum(v) - 1| <= eps(dtype) / 2 + V * smallest_subnormal(dtype) / 2``, the worst case of
    rounding each entry to nearest, well inside ``specverify.core.rules.row_sum_tolerance``.  In
    practice the sum is exactly 1 for most vectors (about 95% of those drawn in the tests) and
    otherwise below ``eps(dtype) * min(positive entries)``, unless, as in
    ``[1 - 4e-8, 1e-9 x 40]`` in bfloat16, the only way to reach 1 would zero positive entries.
    """
    if dtype is None or dtype == torch.float64:
        return vector
    rounded = _cast(vector, dtype)
    deficit = 1.0 - math.fsum(rounded)
    for _ in range(_SUM_REPAIR_STEPS):
        if deficit == 0.0:
            break
        steps = np.maximum(deficit, -rounded / 2) if deficit < 0 else np.full_like(rounded, deficit)
        movable = (rounded > 0) & (_spacing(rounded, dtype) <= np.abs(steps))
        if not movable.any():
            break
        index = int(np.argmax(np.where(movable, rounded, -1.0)))
        before = rounded[index]
        rounded[index] = _cast(np.array([before + steps[index]]), dtype)[0]
        deficit -= rounded[index] - before
    return rounded


def _normalise(weights: np.ndarray) -> np.ndarray:
    return weights / weights.sum()


# ------------------------------------------------------------------------------------------------
# Probability vectors
# ------------------------------------------------------------------------------------------------


def _positive_weights(size: int) -> st.SearchStrategy[np.ndarray]:
    """Float64 weights in ``[1e-3, 1]``; they shrink towards equal weights (a uniform vector)."""
    return hnp.arrays(np.float64, size, elements=st.floats(_MIN_WEIGHT, 1.0))


@st.composite
def _two_sided_mask(draw: st.DrawFn, size: int) -> np.ndarray:
    """A bool mask with at least one True and (for ``size >= 2``) at least one False entry."""
    mask = draw(hnp.arrays(np.bool_, size))
    kept = draw(st.integers(0, size - 1))
    mask[kept] = True
    if size >= 2:
        dropped = draw(st.integers(0, size - 2))
        mask[dropped + (dropped >= kept)] = False
    return mask


@st.composite
def _dense(draw: st.DrawFn, size: int) -> np.ndarray:
    return _normalise(draw(_positive_weights(size)))


@st.composite
def _sparse(draw: st.DrawFn, size: int) -> np.ndarray:
    support = draw(_two_sided_mask(size))
    return _normalise(draw(_positive_weights(size)) * support)


@st.composite
def _peaked(draw: st.DrawFn, size: int) -> np.ndarray:
    peak = draw(st.integers(0, size - 1))
    spread = draw(st.floats(0.0, 0.1)) if size > 1 else 0.0
    rest = draw(_positive_weights(size))
    rest[peak] = 0.0
    vector = spread * rest / rest.sum() if size > 1 else np.zeros(1)
    vector[peak] = 1.0 - spread
    return _normalise(vector)


@st.composite
def _near_uniform(draw: st.DrawFn, size: int) -> np.ndarray:
    jitter = draw(hnp.arrays(np.float64, size, elements=st.floats(-0.01, 0.01)))
    return _normalise(1.0 + jitter)


@st.composite
def _tiny_mass(draw: st.DrawFn, size: int) -> np.ndarray:
    tiny = ~draw(_two_sided_mask(size))  # at least one tiny entry when size >= 2, never all tiny
    exponents = draw(hnp.arrays(np.float64, size, elements=st.floats(-9.0, -7.0)))
    tiny_masses = np.where(tiny, 10.0**exponents, 0.0)
    bulk = draw(_positive_weights(size)) * ~tiny
    return _normalise(bulk / bulk.sum() * (1.0 - tiny_masses.sum()) + tiny_masses)


_KIND_BUILDERS = {
    "dense": _dense,
    "sparse": _sparse,
    "peaked": _peaked,
    "near_uniform": _near_uniform,
    "tiny_mass": _tiny_mass,
}


@st.composite
def _vector_of_kind(
    draw: st.DrawFn, sizes: st.SearchStrategy[int], kind: str, dtype: torch.dtype | None
) -> np.ndarray:
    return _round_to_dtype(draw(_KIND_BUILDERS[kind](draw(sizes))), dtype)


def probability_vectors(
    vocab_size: int | st.SearchStrategy[int],
    *,
    kind: str = "any",
    dtype: torch.dtype | None = None,
) -> st.SearchStrategy[np.ndarray]:
    """Probability vectors: float64 numpy arrays ``[V]``, non-negative, summing to 1.

    ``kind``:
    - ``"dense"``: every entry positive, relative weights in ``[1e-3, 1]``;
    - ``"sparse"``: at least one positive entry and, for ``V >= 2``, at least one exact zero;
    - ``"peaked"``: one token holds ``1 - s`` with ``s`` in ``[0, 0.1]`` (``s = 0``: one-hot);
    - ``"near_uniform"``: ``(1 + δ_v) / Σ`` with ``|δ_v| <= 0.01``;
    - ``"tiny_mass"``: for ``V >= 2`` at least one entry of mass in ``[1e-9, 1e-7]`` next to a
      bulk of ordinary entries (the 1e-8 tails that a float32 inverse CDF would lose);
    - ``"any"``: one of the above.

    ``dtype`` (``torch.float16``, ``torch.bfloat16``, ``torch.float32``): the entries are exactly
    representable in that dtype (``torch.from_numpy(v).to(dtype)`` is lossless), still
    non-negative, zeros stay zero, and ``|fsum(v) - 1| <= eps(dtype) / 2 + V * subnormal / 2``
    (the worst case of plain rounding; most vectors sum to exactly 1, see
    :func:`_round_to_dtype`).  In float16 a tiny mass below ``2**-25`` is flushed to zero, so
    ``"tiny_mass"`` may lose its tiny entries there.

    Shrinking: towards the smallest vocabulary, the first kind (``"dense"``), and within a kind
    towards the uniform vector (``"dense"``, ``"near_uniform"``), a one-hot at token 0
    (``"sparse"``, ``"peaked"``), or token 0 holding the bulk next to ``1e-7`` masses
    (``"tiny_mass"``).
    """
    if kind != "any" and kind not in KINDS:
        raise ValueError(f"kind: expected 'any' or one of {KINDS}, got {kind!r}")
    _check_dtype(dtype)
    sizes = _int_strategy(vocab_size, "vocab_size", 1)
    kinds = KINDS if kind == "any" else (kind,)
    return st.one_of([_vector_of_kind(sizes, each, dtype) for each in kinds])


@st.composite
def _large_vocab_vector(draw: st.DrawFn, sizes: st.SearchStrategy[int], dtype: torch.dtype | None) -> np.ndarray:
    size = draw(sizes)
    seed = draw(st.integers(0, 2**32 - 1))
    zipf_exponent = draw(st.floats(0.5, 1.5))
    top_k = draw(st.none() | st.integers(1, 4096))
    peak_mass = draw(st.floats(0.0, 0.99))
    num_tiny = draw(st.integers(0, 16))

    rng = np.random.default_rng(seed)
    ranks = rng.permutation(size)
    weights = (ranks + 1.0) ** -zipf_exponent * rng.gamma(2.0, size=size)
    if top_k is not None and top_k < size:
        weights[np.argpartition(weights, size - top_k)[: size - top_k]] = 0.0
    vector = _normalise(weights) * (1.0 - peak_mass)
    vector[int(np.argmax(weights))] += peak_mass
    zeros = np.flatnonzero(vector == 0.0)
    if num_tiny and zeros.size:
        tiny = rng.choice(zeros, size=min(num_tiny, zeros.size), replace=False)
        vector[tiny] = 10.0 ** rng.uniform(-9.0, -7.0, size=tiny.size)
    return _round_to_dtype(_normalise(vector), dtype)


def large_vocab_probability_vectors(
    vocab_size: int | st.SearchStrategy[int] = st.integers(32768, 131072),
    *,
    dtype: torch.dtype | None = None,
) -> st.SearchStrategy[np.ndarray]:
    """Large-vocabulary distributions (default ``V`` in ``32768..131072``), cheap to generate.

    Hypothesis draws only a handful of structural features; the ``V`` floats come from numpy
    seeded by a drawn seed (construction only, see the module docstring):
    a Zipf law ``w_v ∝ (rank_v + 1) ** -s`` (``s`` in ``[0.5, 1.5]``, ranks a random permutation)
    times Gamma(2) noise; optionally truncated to its ``top_k`` largest entries (``top_k`` in
    ``1..4096``, like a top-k-processed target); a ``peak_mass`` in ``[0, 0.99]`` added to the
    largest entry; and up to 16 tiny masses in ``[1e-9, 1e-7]`` put on truncated tokens.  Output:
    float64 ``[V]`` summing to 1, with the same ``dtype`` guarantee as :func:`probability_vectors`.

    Shrinking: towards the smallest ``V``, seed 0, a simple exponent, no truncation, no peak, no
    tiny masses.
    """
    _check_dtype(dtype)
    return _large_vocab_vector(_int_strategy(vocab_size, "vocab_size", 1), dtype)


# ------------------------------------------------------------------------------------------------
# Draft/target pairs
# ------------------------------------------------------------------------------------------------


@st.composite
def _identical(draw: st.DrawFn, size: int) -> tuple[np.ndarray, np.ndarray]:
    target = draw(probability_vectors(size))
    return target, target.copy()


@st.composite
def _disjoint(draw: st.DrawFn, size: int) -> tuple[np.ndarray, np.ndarray]:
    target_side = draw(_two_sided_mask(size))
    target = _normalise(draw(_positive_weights(size)) * target_side)
    draft = _normalise(draw(_positive_weights(size)) * ~target_side)
    return target, draft


@st.composite
def _zero_where_other_positive(draw: st.DrawFn, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` with ``b(x) = 0 < a(x)`` for some drawn ``x`` in the support of ``a``."""
    a = draw(probability_vectors(size))
    support = np.flatnonzero(a > 0)
    hole = int(support[draw(st.integers(0, support.size - 1))])
    b = draw(probability_vectors(size))
    b[hole] = 0.0
    if b.sum() == 0.0:
        b[(hole + 1) % size] = 1.0
    return a, _normalise(b)


@st.composite
def _target_zero_where_draft_positive(draw: st.DrawFn, size: int) -> tuple[np.ndarray, np.ndarray]:
    draft, target = draw(_zero_where_other_positive(size))
    return target, draft


@st.composite
def _at_total_variation(draw: st.DrawFn, size: int, tv: float | None) -> tuple[np.ndarray, np.ndarray]:
    """``q = p - ε p·1_S / p(S) + ε w_T``: mass ``ε`` moved from the tokens ``S`` to the tokens ``T``.

    ``S`` and ``T`` partition the vocabulary (both non-empty), ``p(S) = m`` is drawn in
    ``[max(ε, 0.01), 1]`` and ``w_T`` is a distribution on ``T``.  Then ``p - q = ε p/m >= 0`` on
    ``S`` and ``p - q = -ε w_T <= 0`` on ``T``, so ``TV(p, q) = Σ_S (p - q) = ε`` exactly (in real
    arithmetic; float64 gives it to ~1e-16).
    """
    epsilon = draw(st.floats(0.0, 1.0)) if tv is None else tv
    source = draw(_two_sided_mask(size))
    source_mass = draw(st.floats(max(epsilon, 0.01), 1.0))  # p(S) >= ε, and > 0 so that ε / p(S) is defined
    source_weights = draw(_positive_weights(size)) * source
    sink_weights = draw(_positive_weights(size)) * ~source
    target = source_mass * source_weights / source_weights.sum()
    target += (1.0 - source_mass) * sink_weights / sink_weights.sum()
    receivers = draw(_positive_weights(size)) * ~source
    draft = np.where(source, target * (1.0 - epsilon / source_mass), target + epsilon * receivers / receivers.sum())
    return target, np.maximum(draft, 0.0)


def draft_target_pairs(
    vocab_size: int | st.SearchStrategy[int],
    *,
    relation: str = "any",
    tv: float | None = None,
) -> st.SearchStrategy[tuple[np.ndarray, np.ndarray]]:
    """``(p, q)``: a target and a draft distribution (float64 ``[V]`` each) in a chosen relation.

    ``relation``:
    - ``"identical"``: ``q == p`` (every draft is accepted);
    - ``"disjoint"``: supports are disjoint (every draft is rejected, the residual is ``p``);
    - ``"draft_zero_where_target_positive"``: some ``x`` has ``q(x) = 0 < p(x)`` (the residual
      must supply that token);
    - ``"target_zero_where_draft_positive"``: some ``x`` has ``p(x) = 0 < q(x)`` (that draft
      must never be accepted: the zero-uniform bug);
    - ``"tv"``: ``TV(p, q) = Σ_x max(0, p(x) - q(x))`` equals ``tv`` (drawn in ``[0, 1]`` when
      ``tv`` is None) to float64 accuracy, by moving mass ``tv`` of ``p`` from a set of tokens
      to the rest (see :func:`_at_total_variation`);
    - ``"any"``: one of the above.
    All relations except ``"identical"`` need ``V >= 2`` (drawn sizes are filtered).

    Shrinking: towards the first relation (``"identical"``), small ``V``, uniform vectors, and
    ``tv = 0``.
    """
    _check_relation(relation)
    if tv is not None:
        if relation != "tv":
            raise ValueError(f"tv: only meaningful with relation='tv', got relation={relation!r}")
        if not (isinstance(tv, float | int) and 0.0 <= tv <= 1.0):
            raise ValueError(f"tv: expected a number in [0, 1], got {tv!r}")
        tv = float(tv)
    relations = RELATIONS if relation == "any" else (relation,)
    minimum = 2 if relation in _RELATIONS_NEEDING_TWO_TOKENS else 1
    sizes = _int_strategy(vocab_size, "vocab_size", minimum)

    @st.composite
    def pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
        size = draw(sizes)
        possible = [each for each in relations if size >= 2 or each not in _RELATIONS_NEEDING_TWO_TOKENS]
        chosen = draw(st.sampled_from(possible))
        if chosen == "tv":
            return draw(_at_total_variation(size, tv))
        return draw(_PAIR_BUILDERS[chosen](size))

    return pairs()


_PAIR_BUILDERS = {
    "identical": _identical,
    "disjoint": _disjoint,
    "draft_zero_where_target_positive": _zero_where_other_positive,
    "target_zero_where_draft_positive": _target_zero_where_draft_positive,
}


# ------------------------------------------------------------------------------------------------
# Verification inputs
# ------------------------------------------------------------------------------------------------


class VerifyInputs(NamedTuple):
    """The inputs of one verification step (SPEC §1 shapes; docs/ARCHITECTURE.md).

    target_probs: ``[B, K+1, V]``; draft_probs: ``[B, K, V]`` (both of the requested dtype);
    draft_tokens: int64 ``[B, K]``; num_draft: int64 ``[B]`` with entries in ``0..K``, or None.
    """

    target_probs: torch.Tensor
    draft_probs: torch.Tensor
    draft_tokens: torch.Tensor
    num_draft: torch.Tensor | None


def verify_inputs(
    *,
    batch_size: int | st.SearchStrategy[int],
    num_draft: int | st.SearchStrategy[int],
    vocab_size: int | st.SearchStrategy[int],
    relation: str = "any",
    dtype: torch.dtype = torch.float32,
    ragged: bool = False,
) -> st.SearchStrategy[VerifyInputs]:
    """Inputs of one verification step: a :class:`VerifyInputs` of tensors of ``dtype``.

    Every row is drawn independently (rows differ completely, as SPEC §1 allows): for each draft
    position ``i < K`` a pair ``(p_i, q_i)`` from :func:`draft_target_pairs` with ``relation``,
    and an independent bonus distribution ``p_K``.  Each distribution is rounded to ``dtype`` as in
    :func:`probability_vectors`; relations are built in float64 first, and rounding keeps zeros
    zero, so ``"identical"`` and ``"disjoint"`` survive it, the one-sided-zero relations too unless
    float16 flushes the only witness (a mass below ``2**-25``), and an exact TV holds for float64 only.
    Draft token ``x_i`` is a drawn index into the support of the *rounded* ``q_i``, so
    ``q_i(x_i) > 0`` always; it is an arbitrary support point, not a sample from ``q_i`` (a
    statistical test must sample drafts itself, with a derived seed).  With ``ragged=True``,
    ``num_draft`` holds a drawn ``n_b`` in ``0..K`` per row; positions beyond ``n_b`` still hold
    valid distributions and tokens.

    Shrinking: towards small ``B``, ``K``, ``V``; identical pairs; the first token of each
    support; ``n_b = 0``.
    """
    _check_relation(relation)
    if dtype not in _SUPPORTED_DTYPES:
        raise ValueError(f"dtype: expected one of {_SUPPORTED_DTYPES}, got {dtype!r}")
    batch_sizes = _int_strategy(batch_size, "batch_size", 1)
    draft_lengths = _int_strategy(num_draft, "num_draft", 1)
    minimum = 2 if relation in _RELATIONS_NEEDING_TWO_TOKENS else 1
    sizes = _int_strategy(vocab_size, "vocab_size", minimum)

    @st.composite
    def inputs(draw: st.DrawFn) -> VerifyInputs:
        batch, length, size = draw(batch_sizes), draw(draft_lengths), draw(sizes)
        pairs, bonuses = draft_target_pairs(size, relation=relation), probability_vectors(size)
        target = np.zeros((batch, length + 1, size))
        draft = np.zeros((batch, length, size))
        tokens = np.zeros((batch, length), dtype=np.int64)
        for row in range(batch):
            for position in range(length):
                p, q = draw(pairs)
                target[row, position] = _round_to_dtype(p, dtype)
                draft[row, position] = _round_to_dtype(q, dtype)
                support = np.flatnonzero(draft[row, position] > 0)
                tokens[row, position] = support[draw(st.integers(0, support.size - 1))]
            target[row, length] = _round_to_dtype(draw(bonuses), dtype)
        counts = None
        if ragged:
            counts = torch.tensor(draw(st.lists(st.integers(0, length), min_size=batch, max_size=batch)))
        return VerifyInputs(
            torch.from_numpy(target).to(dtype), torch.from_numpy(draft).to(dtype), torch.from_numpy(tokens), counts
        )

    return inputs()


# ------------------------------------------------------------------------------------------------
# Chains
# ------------------------------------------------------------------------------------------------


def markov_chains(
    vocab_size: int | st.SearchStrategy[int],
    order: int | st.SearchStrategy[int],
    *,
    relation: str = "any",
) -> st.SearchStrategy:
    """``specverify.core.chains.MarkovChain`` with drawn tables and prompt.

    For each of the ``V ** order`` contexts the pair (target row, draft row) is drawn from
    :func:`draft_target_pairs` with ``relation`` (float64); the prompt is ``order`` drawn tokens
    (``order = 0``: a context-free chain with an empty prompt).
    ``V ** order`` is limited to 1024 contexts (drawn sizes beyond that are filtered out; fixed ints
    raise ``ValueError``).

    Shrinking: towards small ``V`` and ``order``, identical rows, uniform rows, prompt of zeros.
    """
    _check_relation(relation)
    minimum = 2 if relation in _RELATIONS_NEEDING_TWO_TOKENS else 1
    sizes = _int_strategy(vocab_size, "vocab_size", minimum)
    orders = _int_strategy(order, "order", 0)
    if not isinstance(vocab_size, st.SearchStrategy) and not isinstance(order, st.SearchStrategy):
        if vocab_size**order > _MAX_MARKOV_CONTEXTS:
            raise ValueError(
                f"vocab_size/order: V ** order = {vocab_size ** order} contexts exceeds "
                f"{_MAX_MARKOV_CONTEXTS}; use a smaller vocabulary or order"
            )
    shapes = st.tuples(sizes, orders).filter(lambda shape: shape[0] ** shape[1] <= _MAX_MARKOV_CONTEXTS)

    @st.composite
    def chains(draw: st.DrawFn):
        from specverify.core.chains import MarkovChain

        size, chain_order = draw(shapes)
        pairs = draft_target_pairs(size, relation=relation)
        rows = [draw(pairs) for _ in range(size**chain_order)]
        prompt = tuple(draw(st.lists(st.integers(0, size - 1), min_size=chain_order, max_size=chain_order)))
        target_table = np.stack([target for target, _ in rows])
        draft_table = np.stack([draft for _, draft in rows])
        return MarkovChain(target_table, draft_table, chain_order, prompt)

    return chains()


def positional_chains(
    vocab_size: int | st.SearchStrategy[int],
    num_draft: int | st.SearchStrategy[int],
    *,
    relation: str = "any",
) -> st.SearchStrategy:
    """``specverify.core.chains.PositionalChain(p [K+1, V], q [K, V])``: a context-free step.

    Row ``i < K`` of ``(p, q)`` is a pair from :func:`draft_target_pairs` with ``relation``;
    ``p[K]`` (the bonus position) is an independent :func:`probability_vectors`.

    Shrinking: towards small ``V`` and ``K``, identical and uniform rows.
    """
    _check_relation(relation)
    minimum = 2 if relation in _RELATIONS_NEEDING_TWO_TOKENS else 1
    sizes = _int_strategy(vocab_size, "vocab_size", minimum)
    draft_lengths = _int_strategy(num_draft, "num_draft", 1)

    @st.composite
    def chains(draw: st.DrawFn):
        from specverify.core.chains import PositionalChain

        size, length = draw(sizes), draw(draft_lengths)
        pairs = [draw(draft_target_pairs(size, relation=relation)) for _ in range(length)]
        bonus = draw(probability_vectors(size))
        target = np.stack([p for p, _ in pairs] + [bonus])
        draft = np.stack([q for _, q in pairs])
        return PositionalChain(target, draft)

    return chains()


# ------------------------------------------------------------------------------------------------
# Sampling parameters
# ------------------------------------------------------------------------------------------------


def sampling_params(*, vocab_size: int | None = None) -> st.SearchStrategy:
    """``specverify.core.processing.SamplingParams(temperature, top_k, top_p, min_p)``.

    ``temperature``: exactly 0 (greedy) or a float in ``(0, 2]``; ``top_k``: None or
    ``1..vocab_size`` (``1..64`` when ``vocab_size`` is None); ``top_p``: None or ``(0, 1]``;
    ``min_p``: None or ``[0, 1]``.

    Shrinking: towards greedy (temperature 0) with no filters.
    """
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1):
        raise ValueError(f"vocab_size: expected None or an int >= 1, got {vocab_size!r}")
    from specverify.core.processing import SamplingParams

    return st.builds(
        SamplingParams,
        temperature=st.just(0.0) | st.floats(0.0, 2.0, exclude_min=True),
        top_k=st.none() | st.integers(1, vocab_size or 64),
        top_p=st.none() | st.floats(0.0, 1.0, exclude_min=True),
        min_p=st.none() | st.floats(0.0, 1.0),
    )
