"""Unit tests of specverify.core.processing: hand-computed filters, order, ties, invariances, errors."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from specverify.core.processing import SamplingParams, process_logits
from specverify.core.seeding import derive_seed

# softmax(LOGITS) = [0.1, 0.2, 0.3, 0.4]
PROBS = [0.1, 0.2, 0.3, 0.4]
LOGITS = torch.log(torch.tensor(PROBS))


def close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=1e-6, rtol=0)


def test_temperature_one_is_softmax():
    close(process_logits(LOGITS, temperature=1.0), PROBS)


def test_temperature_scales_logits():
    # log([1, 4]) / 2 = log([1, 2])
    close(process_logits(torch.log(torch.tensor([1.0, 4.0])), temperature=2.0), [1 / 3, 2 / 3])
    # T = 0.5 squares the probabilities: [1, 4, 9, 16] / 30
    close(process_logits(LOGITS, temperature=0.5), [1 / 30, 4 / 30, 9 / 30, 16 / 30])


def test_greedy_is_one_hot_at_the_first_maximum():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, -1.0, 5.0, -math.inf]])
    probs = process_logits(logits, temperature=0)
    assert probs.dtype == torch.float32
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]
    # filters cannot change a greedy choice
    assert torch.equal(process_logits(logits, temperature=0, top_k=1, top_p=0.1, min_p=0.9), probs)


@pytest.mark.parametrize(
    "top_k, expected",
    [(1, [0, 0, 0, 1]), (2, [0, 0, 3 / 7, 4 / 7]), (3, [0, 2 / 9, 3 / 9, 4 / 9]), (4, PROBS), (100, PROBS)],
)
def test_top_k(top_k, expected):
    close(process_logits(LOGITS, temperature=1.0, top_k=top_k), expected)


@pytest.mark.parametrize(
    "top_p, expected",
    [
        (1e-9, [0, 0, 0, 1]),  # always at least one token
        (0.35, [0, 0, 0, 1]),  # 0.4 >= 0.35
        (0.5, [0, 0, 3 / 7, 4 / 7]),  # 0.4 < 0.5 <= 0.7
        (0.8, [0, 2 / 9, 3 / 9, 4 / 9]),  # 0.7 < 0.8 <= 0.9
        (0.95, PROBS),
        (1.0, PROBS),
    ],
)
def test_top_p(top_p, expected):
    close(process_logits(LOGITS, temperature=1.0, top_p=top_p), expected)


@pytest.mark.parametrize(
    "min_p, expected",
    [(0.0, PROBS), (0.2, PROBS), (0.3, [0, 2 / 9, 3 / 9, 4 / 9]), (0.6, [0, 0, 3 / 7, 4 / 7]), (1.0, [0, 0, 0, 1])],
)
def test_min_p(min_p, expected):
    # thresholds 0.3 * 0.4 = 0.12, 0.6 * 0.4 = 0.24
    close(process_logits(LOGITS, temperature=1.0, min_p=min_p), expected)


def test_order_top_k_before_top_p():
    """top_p = 0.75 alone keeps 3 tokens (0.4 + 0.3 < 0.75); after top_k = 3 the law is
    [0, 2/9, 3/9, 4/9] and 4/9 + 3/9 >= 0.75 keeps 2.  An implementation applying top-p first
    (a real ordering bug) would return [0, 2/9, 3/9, 4/9]."""
    close(process_logits(LOGITS, temperature=1.0, top_p=0.75), [0, 2 / 9, 3 / 9, 4 / 9])
    close(process_logits(LOGITS, temperature=1.0, top_k=3, top_p=0.75), [0, 0, 3 / 7, 4 / 7])


def test_order_temperature_before_top_p():
    """T = 0.5 gives [1, 4, 9, 16]/30; top_p = 0.8 then keeps 16/30 + 9/30 >= 0.8.  Filtering
    before the temperature would keep three tokens (0.4 + 0.3 < 0.8)."""
    close(process_logits(LOGITS, temperature=0.5, top_p=0.8), [0, 0, 9 / 25, 16 / 25])


def test_all_filters_together():
    # T=1, top_k=3 -> [0, 2/9, 3/9, 4/9]; top_p=0.9 keeps all three; min_p=0.6: 0.6 * 4/9 = 0.267 drops 2/9
    close(process_logits(LOGITS, temperature=1.0, top_k=3, top_p=0.9, min_p=0.6), [0, 0, 3 / 7, 4 / 7])


def test_ties_at_a_cut_off_are_all_kept():
    tied = torch.tensor([1.0, 3.0, 3.0, 2.0])
    close(process_logits(tied, temperature=1.0, top_k=1), [0, 0.5, 0.5, 0])
    uniform = torch.zeros(4)
    close(process_logits(uniform, temperature=1.0, top_p=0.3), [0.25] * 4)
    close(process_logits(uniform, temperature=1.0, min_p=1.0), [0.25] * 4)


def test_banned_tokens_keep_zero_probability():
    logits = torch.tensor([0.0, -math.inf, 1.0, -math.inf])
    probs = process_logits(logits, temperature=0.7, top_k=3, top_p=0.99)
    assert probs[1] == 0 and probs[3] == 0
    assert probs[0] > 0 and probs[2] > 0


def test_top_p_boundary_mass_equal_to_top_p_is_enough():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125]))
    assert process_logits(logits, temperature=1.0).tolist() == [0.5, 0.25, 0.125, 0.125]  # exact dyadic softmax
    close(process_logits(logits, temperature=1.0, top_p=0.75), [2 / 3, 1 / 3, 0, 0])  # 0.5 + 0.25 >= 0.75


def test_tiny_temperature_does_not_overflow():
    logits = torch.tensor([0.0, 100.0, 100.0 - 1e-3, -5.0])  # 100 / 1e-37 overflows float32
    probs = process_logits(logits, temperature=1e-37)
    assert torch.isfinite(probs).all()
    close(probs, [0, 1, 0, 0])


def _random_logits(shape, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator) * 3


SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.9, min_p=0.05),
    dict(temperature=0.6, top_k=20, top_p=0.9, min_p=0.02),
    dict(temperature=0),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_output_is_a_float32_distribution_of_the_input_shape(settings):
    logits = _random_logits((2, 3, 50), derive_seed("shape", str(settings)))
    probs = process_logits(logits, **settings)
    assert probs.shape == logits.shape and probs.dtype == torch.float32
    assert (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3), atol=1e-6, rtol=0)


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_invariances(settings):
    logits = _random_logits((4, 50), derive_seed("invariance", str(settings)))
    probs = process_logits(logits, **settings)
    # adding a constant to every logit changes nothing
    torch.testing.assert_close(process_logits(logits + 7.25, **settings), probs, atol=1e-6, rtol=0)
    # permuting the vocabulary permutes the output
    permutation = torch.randperm(50, generator=torch.Generator().manual_seed(derive_seed("permutation", str(settings))))
    torch.testing.assert_close(process_logits(logits[:, permutation], **settings), probs[:, permutation], atol=1e-6,
                               rtol=0)
    # rows are processed independently
    for row in range(4):
        torch.testing.assert_close(process_logits(logits[row], **settings), probs[row], atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_logit_dtypes(dtype):
    logits = _random_logits((3, 30), derive_seed("dtype", str(dtype))).to(dtype)
    probs = process_logits(logits, temperature=0.8, top_k=10, top_p=0.9)
    assert probs.dtype == torch.float32
    expected = process_logits(logits.to(torch.float32), temperature=0.8, top_k=10, top_p=0.9)
    torch.testing.assert_close(probs, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(temperature="1"), "temperature"),
        (dict(temperature=1.0, top_k=0), "top_k"),
        (dict(temperature=1.0, top_k=2.5), "top_k"),
        (dict(temperature=1.0, top_k=True), "top_k"),
        (dict(temperature=1.0, top_p=0.0), "top_p"),
        (dict(temperature=1.0, top_p=1.5), "top_p"),
        (dict(temperature=1.0, top_p=math.nan), "top_p"),
        (dict(temperature=1.0, min_p=-0.1), "min_p"),
        (dict(temperature=1.0, min_p=1.1), "min_p"),
    ],
)
def test_argument_errors(kwargs, argument):
    with pytest.raises(ValueError, match=f"^{argument}:"):
        process_logits(LOGITS, **kwargs)
    with pytest.raises(ValueError, match=f"^{argument}:"):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "logits",
    [
        torch.tensor([1, 2, 3]),
        torch.tensor([0.0, math.nan]),
        torch.tensor([0.0, math.inf]),
        torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]]),
        torch.tensor(1.0),
        torch.zeros(2, 0),
        [0.0, 1.0],
    ],
    ids=["ints", "nan", "posinf", "all-banned-row", "scalar", "empty-vocab", "list"],
)
def test_logit_errors(logits):
    with pytest.raises(ValueError, match="^logits:"):
        process_logits(logits, temperature=1.0)


def test_sampling_params():
    params = SamplingParams(temperature=0.7, top_k=3, top_p=0.9, min_p=0.01)
    assert not params.is_greedy and SamplingParams(temperature=0).is_greedy
    assert SamplingParams() == SamplingParams(temperature=1.0, top_k=None, top_p=None, min_p=None)
    logits = _random_logits((2, 20), derive_seed("params"))
    assert torch.equal(params.apply(logits), process_logits(logits, temperature=0.7, top_k=3, top_p=0.9, min_p=0.01))
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 1.0  # type: ignore[misc]
