"""The crossing of a monotone function (specverify/core/roots.py): neighbouring floats around the
root, each side on its side, and a bracket that does not straddle zero refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specverify.core.roots import crossing


@pytest.mark.parametrize("target", [2.0, math.pi, 1e-9, 123_456.789])
def test_the_crossing_is_a_pair_of_neighbouring_floats_around_the_root(target):
    lo, hi = crossing(lambda x: x * x - target * target, 0.0, 2 * target + 1)
    assert np.nextafter(lo, math.inf) == hi and lo * lo < target * target <= hi * hi


def test_a_step_function_crosses_at_its_step():
    assert crossing(lambda x: -1.0 if x < 0.25 else 1.0, 0.0, 1.0) == (np.nextafter(0.25, 0.0), 0.25)


@pytest.mark.parametrize("bracket", [(1.0, 3.0), (-3.0, -1.0), (2.0, 2.0)])
def test_a_bracket_that_does_not_straddle_zero_is_refused(bracket):
    with pytest.raises(ValueError, match="bracket"):
        crossing(lambda x: x, *bracket)
