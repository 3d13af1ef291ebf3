"""Transition goodness of fit (specverify.core.transitions): level over null runs, power against a
deviation at one deep position, impossible cells, the sample size bound, argument errors."""

from __future__ import annotations

import numpy as np
import pytest

from specverify.core import stats
from specverify.core.transitions import transition_goodness_of_fit

V, LENGTH = 4, 9


def _chain(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.ones(V), size=V)  # [state, token]


def _sequences(table: np.ndarray, n: int, rng: np.random.Generator, deviant: np.ndarray | None = None,
               at: int = 5) -> np.ndarray:
    """n order-1 sequences from state 0 (``deviant`` replaces the table at position ``at``)."""
    tokens = np.empty((n, LENGTH), dtype=np.int64)
    state = np.zeros(n, dtype=np.int64)
    for j in range(LENGTH):
        laws = (deviant if deviant is not None and j == at else table)[state]
        tokens[:, j] = (laws.cumsum(-1) > rng.random(n)[:, None]).argmax(-1)
        state = tokens[:, j]
    return tokens


def _blocks(table: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """counts [L·V, V] by (position, state before it) and the target's laws there."""
    counts = np.zeros((LENGTH, V, V), dtype=np.int64)
    state = np.zeros(len(tokens), dtype=np.int64)
    for j in range(LENGTH):
        np.add.at(counts[j], (state, tokens[:, j]), 1)
        state = tokens[:, j]
    return counts.reshape(-1, V), np.broadcast_to(table[None], (LENGTH, V, V)).reshape(-1, V)


def test_level_over_2000_null_runs():
    table = _chain(0)
    rng = np.random.default_rng(1)
    pvalues = np.array([transition_goodness_of_fit(*_blocks(table, _sequences(table, 400, rng))).pvalue
                        for _ in range(2000)])
    for alpha in (0.05, 0.01):
        rejected = int((pvalues <= alpha).sum())
        # one-sided exact binomial upper bound at 1e-4: the rejection rate is not above alpha
        assert stats.binomial_test(rejected, 2000, alpha, "greater").pvalue > 1e-4, (alpha, rejected)


def test_power_against_a_deviation_at_one_deep_position():
    table = _chain(0)
    deviant = 0.7 * table + 0.3 * _chain(5)  # position 6 only
    epsilon = float((0.5 * np.abs(deviant - table).sum(-1)).max())
    n = stats.sample_size_for_tv(0.05, alpha=1e-3, power=0.99, num_cells=LENGTH * V * (V - 1) + 1)
    rng = np.random.default_rng(2)
    counts, probs = _blocks(table, _sequences(table, n, rng, deviant))
    fit = transition_goodness_of_fit(counts, probs)
    assert epsilon > 0.05 and fit.pvalue < 1e-3
    totals = counts.sum(-1).reshape(LENGTH, V)
    per_position = (fit.block_tv.reshape(LENGTH, V) * totals).sum(-1) / totals.sum(-1)  # ε_j, plug-in
    assert int(per_position.argmax()) == 5


def test_an_impossible_token_fails_with_p_zero():
    table = _chain(0)
    table[0, 3] = 0.0
    table[0] /= table[0].sum()
    counts = np.zeros((1, V), dtype=np.int64)
    counts[0] = [10, 10, 10, 1]
    fit = transition_goodness_of_fit(counts, table[:1])
    assert fit.pvalue == 0.0 and fit.impossible_count == 1 and fit.method == "impossible-cell"


def test_blocks_too_small_to_test_give_no_test():
    fit = transition_goodness_of_fit(np.array([[1, 0, 0, 0]]), np.full((1, V), 0.25))
    assert fit.pvalue == 1.0 and fit.dof == 0 and fit.method == "no-test"


def test_argument_errors_name_the_argument():
    with pytest.raises(ValueError, match="counts, probs"):
        transition_goodness_of_fit(np.zeros((2, 3)), np.full((2, 4), 0.25))
    with pytest.raises(ValueError, match="probs: every block"):
        transition_goodness_of_fit(np.zeros((1, 2)), np.array([[0.5, 0.6]]))
    with pytest.raises(ValueError, match="counts: expected non-negative"):
        transition_goodness_of_fit(np.array([[-1, 2]]), np.array([[0.5, 0.5]]))
