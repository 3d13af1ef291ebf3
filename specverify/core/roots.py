"""Where a monotone function crosses zero, to the last float.

:func:`crossing` bisects a bracket ``[lo, hi]`` of a non-decreasing ``f`` with ``f(lo) < 0 ≤
f(hi)`` until ``lo`` and ``hi`` are neighbouring floats: about 60 evaluations for a bracket of
``[0, 2^k]`` around a root of order 1, each keeping ``f(lo) < 0 ≤ f(hi)``.  The caller takes the
side it needs: ``lo`` for the largest argument still below the crossing, ``hi`` for the least one
at or above it.
"""

from __future__ import annotations

from collections.abc import Callable


def crossing(f: Callable[[float], float], lo: float, hi: float) -> tuple[float, float]:
    """Neighbouring floats ``(lo, hi)`` within the bracket with ``f(lo) < 0 ≤ f(hi)``, for ``f``
    non-decreasing on ``[lo, hi]``; a bracket whose ends do not straddle zero that way raises."""
    if not lo < hi:
        raise ValueError(f"lo, hi: expected a bracket lo < hi, got [{lo!r}, {hi!r}]")
    if not (f(lo) < 0.0 <= f(hi)):
        raise ValueError(f"f: expected f(lo) < 0 <= f(hi) on the bracket [{lo!r}, {hi!r}] (a non-decreasing "
                         "function crossing zero there); widen the bracket")
    while True:
        middle = lo + (hi - lo) / 2.0
        if middle <= lo or middle >= hi:
            return lo, hi
        if f(middle) < 0.0:
            lo = middle
        else:
            hi = middle


__all__ = ["crossing"]
