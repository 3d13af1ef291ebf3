"""Coarse views of large-vocabulary laws (id tiles, probability levels): the partition, the level
of their goodness-of-fit tests under H0, and the power they state against deviations they see."""

from __future__ import annotations

import numpy as np
import pytest

from specverify.auditing.sampler import production_laws as laws
from specverify.core import stats
from specverify.core.coarse import TILE_COUNT, coarse_detectable_tv, coarse_sample_size, coarse_views


def _law(vocab: int) -> np.ndarray:
    return laws.production_law(np.random.default_rng(vocab), vocab)


def _rejects(view, counts, level):
    return stats.goodness_of_fit(view.counts(counts), view.probs, confirm_below=level).pvalue <= level


@pytest.mark.parametrize("vocab", [960, 4_099, 50_257, 151_936])
def test_the_views_partition_the_support(vocab):
    p = _law(vocab)
    tiles, levels = coarse_views(p)
    assert len(tiles.probs) <= TILE_COUNT and len(tiles.probs) >= TILE_COUNT // 2
    for view in (tiles, levels):
        assert view.probs.sum() == pytest.approx(1.0) and (view.labels >= 0).sum() == (p > 0).sum()
        assert view.counts(np.ones(vocab, dtype=np.int64)).sum() == (p > 0).sum()
    level_of = np.floor(np.log2(p))
    for cell in range(len(levels.probs)):  # one dyadic level per cell
        assert len(np.unique(level_of[levels.labels == cell])) == 1


def test_the_coarse_tests_keep_their_level():
    """H0: samples from p; at α = 0.05 the rejection rate over 400 samples of each view stays near α."""
    p = _law(4_099)
    rng = np.random.default_rng(7)
    rates = []
    for view in coarse_views(p):
        rejected = sum(_rejects(view, rng.multinomial(2_000, p), 0.05) for _ in range(400))
        rates.append(rejected / 400)
    assert all(rate <= 0.09 for rate in rates), rates


@pytest.mark.parametrize("temperature", [1.2, 0.85])
def test_a_deviation_the_views_see_is_detected_with_the_stated_power(temperature):
    """A temperature moves mass between probability levels: at the n where the views state a TV below
    the deviation's coarse TV, the tests at level 1e-4 reject in (nearly) every replicate."""
    p = _law(50_257)
    tempered = p ** (1 / temperature)
    tempered /= tempered.sum()
    views = coarse_views(p)
    seen = max(0.5 * np.abs(view.counts(np.round(tempered * 1e12).astype(np.int64)) / 1e12 - view.probs).sum()
               for view in views)
    alpha = 1e-4
    n = coarse_sample_size(views, seen * 0.9, alpha=alpha, power=0.99)
    assert coarse_detectable_tv(views, n, alpha=alpha, power=0.99) <= seen * 0.9
    rng = np.random.default_rng(11)
    detected = sum(any(_rejects(view, rng.multinomial(n, tempered), alpha) for view in views) for _ in range(40))
    assert detected >= 38, (n, seen, detected)


def test_a_deviation_inside_one_tile_and_level_is_not_claimed():
    """Two tokens of the same tile and the same level swap their masses: the coarse laws are equal,
    the coarse TV is 0 (the token-level identity test is the one that covers it)."""
    p = _law(4_099)
    tiles, levels = coarse_views(p)
    same = [(a, b) for a in range(200) for b in range(a + 1, 200)
            if tiles.labels[a] == tiles.labels[b] and levels.labels[a] == levels.labels[b] and p[a] != p[b]]
    a, b = same[0]
    swapped = p.copy()
    swapped[[a, b]] = p[[b, a]]
    for view in (tiles, levels):
        assert np.allclose(view.counts(np.round(swapped * 1e12).astype(np.int64)) / 1e12, view.probs, atol=1e-9)
