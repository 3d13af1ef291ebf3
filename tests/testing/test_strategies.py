"""Tests of specverify.testing.strategies: every strategy generates what its docstring promises.

Property tests with modest ``max_examples`` (the whole file runs in seconds); the root conftest's
Hypothesis profile derandomises them.  No test here samples anything, so no seeds are involved.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st

from specverify.core.chains import MarkovChain, PositionalChain
from specverify.core.processing import SamplingParams
from specverify.core.rules import rejection_sample, row_sum_tolerance, validate_verify_inputs
from specverify.testing.strategies import (
    KINDS,
    VerifyInputs,
    draft_target_pairs,
    large_vocab_probability_vectors,
    markov_chains,
    positional_chains,
    probability_vectors,
    sampling_params,
    verify_inputs,
)

FAST = settings(max_examples=40)
LOW_PRECISION = [torch.float16, torch.bfloat16, torch.float32]
SMALL_VOCAB = st.integers(1, 12)
SHRINK = settings(database=None, max_examples=200)


def assert_distribution(vector: np.ndarray, size: int | None = None) -> None:
    assert vector.dtype == np.float64 and vector.ndim == 1
    if size is not None:
        assert vector.shape == (size,)
    assert np.all(np.isfinite(vector)) and np.all(vector >= 0)
    assert abs(math.fsum(vector) - 1.0) <= 1e-12


def representable(vector: np.ndarray, dtype: torch.dtype) -> bool:
    return bool(np.array_equal(torch.from_numpy(vector).to(dtype).to(torch.float64).numpy(), vector))


def dtype_sum_bound(dtype: torch.dtype, size: int) -> float:
    """The documented bound: eps/2 (rounding every entry to nearest) + V * smallest_subnormal / 2."""
    info = torch.finfo(dtype)
    return info.eps / 2 + size * info.tiny * info.eps / 2


# ------------------------------------------------------------------------------------------------
# probability_vectors
# ------------------------------------------------------------------------------------------------


@FAST
@given(data=st.data())
def test_every_kind_is_a_distribution_with_its_shape(data):
    size = data.draw(SMALL_VOCAB)
    kind = data.draw(st.sampled_from(KINDS))
    vector = data.draw(probability_vectors(size, kind=kind))
    assert_distribution(vector, size)
    if kind == "dense":
        assert np.all(vector > 0)
    if kind == "sparse" and size >= 2:
        assert np.any(vector == 0) and np.any(vector > 0)
    if kind == "peaked":
        assert vector.max() >= 0.9 - 1e-12
    if kind == "near_uniform":
        assert vector.max() / vector.min() <= 1.01 / 0.99 + 1e-9
    if kind == "tiny_mass" and size >= 2:
        assert np.any((vector >= 0.9e-9) & (vector <= 1.1e-7))


@FAST
@given(probability_vectors(st.integers(1, 6)))
def test_vocab_size_strategy_and_any_kind(vector):
    assert_distribution(vector)
    assert 1 <= vector.size <= 6


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
def test_dtype_vectors_are_representable_and_sum_to_one_within_the_bound(dtype):
    exact_sums = []

    @settings(max_examples=80)
    @given(probability_vectors(st.integers(1, 300), dtype=dtype))
    def check(vector):
        assert representable(vector, dtype)
        assert np.all(vector >= 0) and np.any(vector > 0)
        error = abs(math.fsum(vector) - 1.0)
        assert error <= dtype_sum_bound(dtype, vector.size) + 1e-15
        assert error <= row_sum_tolerance(dtype, vector.size)
        exact_sums.append(error == 0.0)

    check()
    assert np.mean(exact_sums) > 0.5  # the repair usually reaches exactly 1 (measured ~95%)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_dtype_rounding_keeps_zeros_and_large_entries(dtype):
    @settings(max_examples=40)
    @given(probability_vectors(st.integers(2, 40), kind="sparse", dtype=dtype))
    def check(vector):
        # sparse vectors have zeros and entries >= 1e-3 / V, all of which survive rounding
        assert np.any(vector == 0) and representable(vector, dtype)

    check()


def test_dtype_rounding_example_that_cannot_reach_one_stays_within_the_bound():
    from specverify.testing.strategies import _round_to_dtype

    vector = np.array([1.0 - 4e-8] + [1e-9] * 40)
    rounded = _round_to_dtype(vector / vector.sum(), torch.bfloat16)
    assert representable(rounded, torch.bfloat16) and np.all(rounded > 0)
    assert abs(math.fsum(rounded) - 1.0) <= dtype_sum_bound(torch.bfloat16, rounded.size)


@settings(max_examples=8)
@given(large_vocab_probability_vectors(dtype=torch.bfloat16))
def test_large_vocab_vectors_are_cheap_valid_and_representable(vector):
    assert 32768 <= vector.size <= 131072
    assert np.all(vector >= 0) and representable(vector, torch.bfloat16)
    assert abs(math.fsum(vector) - 1.0) <= dtype_sum_bound(torch.bfloat16, vector.size)


@settings(max_examples=8)
@given(large_vocab_probability_vectors(st.integers(32768, 40000)))
def test_large_vocab_float64_vectors_sum_to_one(vector):
    assert_distribution(vector)


# ------------------------------------------------------------------------------------------------
# draft_target_pairs
# ------------------------------------------------------------------------------------------------


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    return math.fsum(np.maximum(p - q, 0.0))


@FAST
@given(draft_target_pairs(SMALL_VOCAB, relation="identical"))
def test_identical_pairs(pair):
    p, q = pair
    assert_distribution(p)
    assert np.array_equal(p, q)


@FAST
@given(draft_target_pairs(SMALL_VOCAB, relation="disjoint"))
def test_disjoint_pairs(pair):
    p, q = pair
    assert_distribution(p)
    assert_distribution(q)
    assert np.all(p * q == 0) and p.size >= 2


@FAST
@given(draft_target_pairs(SMALL_VOCAB, relation="draft_zero_where_target_positive"))
def test_draft_zero_where_target_positive(pair):
    p, q = pair
    assert_distribution(p)
    assert_distribution(q)
    assert np.any((q == 0) & (p > 0))


@FAST
@given(draft_target_pairs(SMALL_VOCAB, relation="target_zero_where_draft_positive"))
def test_target_zero_where_draft_positive(pair):
    p, q = pair
    assert_distribution(p)
    assert_distribution(q)
    assert np.any((p == 0) & (q > 0))


@pytest.mark.parametrize("tv", [0.0, 1e-6, 0.25, 0.5, 0.999, 1.0])
def test_pairs_at_a_chosen_total_variation(tv):
    @FAST
    @given(draft_target_pairs(SMALL_VOCAB, relation="tv", tv=tv))
    def check(pair):
        p, q = pair
        assert_distribution(p)
        assert_distribution(q)
        assert abs(total_variation(p, q) - tv) <= 1e-9

    check()


@FAST
@given(draft_target_pairs(SMALL_VOCAB))
def test_any_relation_gives_two_distributions(pair):
    p, q = pair
    assert_distribution(p)
    assert_distribution(q)


# ------------------------------------------------------------------------------------------------
# verify_inputs
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_verify_inputs_are_valid_step_inputs(dtype):
    @settings(max_examples=25)
    @given(verify_inputs(batch_size=st.integers(1, 3), num_draft=st.integers(1, 3), vocab_size=SMALL_VOCAB,
                         dtype=dtype))
    def check(inputs):
        assert isinstance(inputs, VerifyInputs)
        batch, positions, size = inputs.target_probs.shape
        assert inputs.target_probs.dtype == dtype and inputs.draft_probs.dtype == dtype
        assert inputs.draft_probs.shape == (batch, positions - 1, size)
        assert inputs.draft_tokens.dtype == torch.int64 and inputs.draft_tokens.shape == (batch, positions - 1)
        assert inputs.num_draft is None
        q_at_tokens = inputs.draft_probs.gather(-1, inputs.draft_tokens.unsqueeze(-1))
        assert torch.all(q_at_tokens > 0)
        validate_verify_inputs(
            inputs.target_probs, inputs.draft_probs, inputs.draft_tokens, torch.Generator().manual_seed(0)
        )

    check()


@settings(max_examples=25)
@given(verify_inputs(batch_size=st.integers(1, 4), num_draft=st.integers(1, 3), vocab_size=4, ragged=True))
def test_ragged_verify_inputs_run_through_the_reference_rule(inputs):
    batch, positions, _ = inputs.target_probs.shape
    assert inputs.num_draft.dtype == torch.int64 and inputs.num_draft.shape == (batch,)
    assert torch.all((inputs.num_draft >= 0) & (inputs.num_draft <= positions - 1))
    uniforms = torch.full((batch, positions), 0.5, dtype=torch.float64)
    result = rejection_sample(
        inputs.target_probs, inputs.draft_probs, inputs.draft_tokens, uniforms=uniforms, num_draft=inputs.num_draft
    )
    assert result.emitted.shape == (batch, positions)


@settings(max_examples=15)
@given(verify_inputs(batch_size=3, num_draft=2, vocab_size=5, relation="disjoint", dtype=torch.float64))
def test_verify_inputs_relation_holds_at_every_draft_position(inputs):
    assert torch.all(inputs.target_probs[:, :-1] * inputs.draft_probs == 0)


def test_rows_of_verify_inputs_are_drawn_independently():
    differing = []

    @settings(max_examples=20)
    @given(verify_inputs(batch_size=2, num_draft=1, vocab_size=3, relation="tv", dtype=torch.float64))
    def record(inputs):
        differing.append(not torch.equal(inputs.target_probs[0], inputs.target_probs[1]))

    record()
    assert any(differing)


# ------------------------------------------------------------------------------------------------
# Chains and sampling parameters
# ------------------------------------------------------------------------------------------------


@settings(max_examples=15)
@given(markov_chains(st.integers(2, 3), st.integers(0, 2), relation="target_zero_where_draft_positive"))
def test_markov_chains(chain):
    assert isinstance(chain, MarkovChain)
    contexts = chain.vocab_size**chain.order
    assert chain.target_table.shape == chain.draft_table.shape == (contexts, chain.vocab_size)
    assert len(chain.prompt) == chain.order
    assert np.all(np.any((chain.target_table == 0) & (chain.draft_table > 0), axis=1))


@settings(max_examples=15)
@given(positional_chains(st.integers(2, 4), st.integers(1, 3), relation="tv"))
def test_positional_chains(chain):
    assert isinstance(chain, PositionalChain)
    assert chain.p.shape == (chain.num_draft + 1, chain.vocab_size)
    assert chain.q.shape == (chain.num_draft, chain.vocab_size)


@settings(max_examples=40)
@given(sampling_params(vocab_size=8), st.data())
def test_sampling_params_are_valid_and_usable(params, data):
    assert isinstance(params, SamplingParams)
    assert params.temperature == 0 or 0 < params.temperature <= 2
    assert params.top_k is None or 1 <= params.top_k <= 8
    logits = torch.tensor(data.draw(st.lists(st.floats(-5, 5), min_size=8, max_size=8)), dtype=torch.float64)
    probs = params.apply(logits)
    assert abs(float(probs.sum()) - 1.0) < 1e-5


def test_sampling_params_include_greedy_and_sampled_temperatures():
    temperatures = []

    @settings(max_examples=60)
    @given(sampling_params())
    def record(params):
        temperatures.append(params.temperature)

    record()
    assert 0.0 in temperatures and any(0 < t <= 2 for t in temperatures)


# ------------------------------------------------------------------------------------------------
# Documented shrinking behaviour
# ------------------------------------------------------------------------------------------------


def minimal(strategy):
    return find(strategy, lambda _: True, settings=SHRINK)


def test_dense_vectors_shrink_to_uniform():
    assert np.allclose(minimal(probability_vectors(4, kind="dense")), 0.25)


@pytest.mark.slow
def test_more_shrinking_targets():
    """More documented shrink targets (each ``find`` shrinks fully, which costs seconds)."""
    assert np.array_equal(minimal(probability_vectors(4, kind="peaked")), [1.0, 0.0, 0.0, 0.0])
    assert np.array_equal(minimal(probability_vectors(4, kind="sparse")), [1.0, 0.0, 0.0, 0.0])
    assert minimal(probability_vectors(st.integers(1, 10))).size == 1
    p, q = minimal(draft_target_pairs(3))
    assert np.array_equal(p, q)
    p, q = minimal(draft_target_pairs(3, relation="tv"))
    assert total_variation(p, q) == 0.0
    assert minimal(sampling_params()) == SamplingParams(temperature=0.0)


# ------------------------------------------------------------------------------------------------
# Argument errors
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: probability_vectors(0), "vocab_size"),
        (lambda: probability_vectors(3, kind="spiky"), "kind"),
        (lambda: probability_vectors(3, dtype=torch.int32), "dtype"),
        (lambda: probability_vectors(2.5), "vocab_size"),
        (lambda: draft_target_pairs(1, relation="disjoint"), "vocab_size"),
        (lambda: draft_target_pairs(3, relation="close"), "relation"),
        (lambda: draft_target_pairs(3, relation="tv", tv=1.5), "tv"),
        (lambda: draft_target_pairs(3, relation="identical", tv=0.1), "tv"),
        (lambda: verify_inputs(batch_size=0, num_draft=1, vocab_size=3), "batch_size"),
        (lambda: verify_inputs(batch_size=1, num_draft=0, vocab_size=3), "num_draft"),
        (lambda: verify_inputs(batch_size=1, num_draft=1, vocab_size=3, dtype=torch.int64), "dtype"),
        (lambda: markov_chains(8, 4), "vocab_size/order"),
        (lambda: markov_chains(3, -1), "order"),
        (lambda: sampling_params(vocab_size=0), "vocab_size"),
    ],
)
def test_invalid_arguments_raise_value_errors_naming_the_argument(build, argument):
    with pytest.raises(ValueError, match=f"^{argument}:"):
        build()
