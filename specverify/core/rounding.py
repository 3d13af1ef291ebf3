"""How far from exact a correct rule may be in finite precision: the exact check's tolerance.

A rule that computes in float32 (every engine kernel does) cannot emit exactly the law a float64
integration expects: its accept tests, residuals and inverse CDF are rounded.  Calling that a loss
would accuse correct code.  This module bounds the total variation that rounding alone can cause
in one step, from the unit roundoff ``u`` of the arithmetic (``u = eps / 2``: 2⁻²⁴ for float32,
2⁻¹¹ for float16, 2⁻⁸ for bfloat16, 2⁻⁵³ for float64), the number of draft positions (or tree
nodes) ``K`` and the vocabulary size ``V``.

The bound (first order in ``u``; a coupling of the exact and the rounded step on the same
uniforms, so the TV is at most the probability that any decision differs):

- accept test ``u_i · q(x) < p(x)``: p, q and the product each carry a relative error ≤ u, so the
  acceptance threshold ``min(1, p/q)`` moves by ≤ 3u: ≤ 3u per position, ≤ 3Ku in all;
- residual ``max(0, p − q)`` (also a tree's recursive residual after each rejected sibling): each
  entry is off by ≤ u(p + q) plus the subtraction's rounding, ‖Δr‖₁ ≤ 4u, and the normalised draw
  from it differs with probability ≤ ‖Δr‖₁ / ‖r‖₁ while it is reached with probability ≤ ‖r‖₁:
  ≤ 4u per position, ≤ 4Ku in all;
- final draw by inverse CDF over V tokens: the rounded cumulative sums ``C'_x`` of nonnegative
  terms are each within ``⌈log₂ V⌉ u`` of the total S for tree (parallel-scan) summation orders,
  and within one addition's rounding ``u S`` of ``C'_{x−1} + r_x`` for sequential ones, so each
  interval length ``C'_x − C'_{x−1}`` is off by at most ``(1 + 2⌈log₂ V⌉) u S`` (its input's
  rounding included), and the division by the rounded total moves every breakpoint by ≤ V u
  relative: ≤ ``V (2 + 2⌈log₂ V⌉) u`` in all.

So ``TV ≤ u · (7K + V (2 + 2⌈log₂ V⌉))``, plus :data:`INTEGRATION_FLOOR` for the float64
integration itself.  At K = 2, V = 3 in float32 that is 1.9e-6: a float32 kernel at exact TV 2e-8
passes ("exact up to float32 rounding"), a bug of the catalog (TV ≥ 1e-3) fails.  The bound grows
with V (0.06 at V = 32,768 in float32): at large V the exact check of a float32 rule can only rule
out deviations above it, and says so.

A function declares the precision of its arithmetic with an attribute,
``verify.arithmetic = "float32"`` (any of :data:`ARITHMETICS`); without one the audit assumes
float32, the precision engines verify in, so a float32 kernel is never accused of its rounding.
The reference rules compute in float64 and declare it, and get the float64 tolerance.
"""

from __future__ import annotations

import math
from typing import Any

import torch

ARITHMETICS: dict[str, torch.dtype] = {"float64": torch.float64, "float32": torch.float32,
                                       "float16": torch.float16, "bfloat16": torch.bfloat16}
"""The precisions a function may declare in its ``arithmetic`` attribute."""

DEFAULT_ARITHMETIC = "float32"
"""The arithmetic assumed for a function that declares none."""

INTEGRATION_FLOOR = 1e-9
"""The float64 integrator's own error bound (its grid and cell sums carry errors around 1e-13)."""


def unit_roundoff(arithmetic: str) -> float:
    """``u = eps / 2`` of the named precision (round to nearest)."""
    return torch.finfo(ARITHMETICS[check_arithmetic(arithmetic)]).eps / 2


def check_arithmetic(arithmetic: Any) -> str:
    """``arithmetic`` as one of :data:`ARITHMETICS` (a torch dtype is accepted too), or a ValueError."""
    if isinstance(arithmetic, torch.dtype):
        arithmetic = str(arithmetic).removeprefix("torch.")
    if arithmetic not in ARITHMETICS:
        raise ValueError(f"arithmetic: expected one of {', '.join(ARITHMETICS)} (the precision the function "
                         f"computes in, e.g. verify.arithmetic = 'float32'), got {arithmetic!r}")
    return str(arithmetic)


def rounding_tolerance(arithmetic: str, num_draft: int, vocab_size: int) -> float:
    """The largest one-step TV rounding in ``arithmetic`` explains for ``num_draft`` positions
    (or tree nodes) over ``vocab_size`` tokens: ``u (7K + V (2 + 2⌈log₂ V⌉)) + INTEGRATION_FLOOR``
    (module docstring)."""
    if num_draft < 0 or vocab_size < 1:
        raise ValueError(f"num_draft, vocab_size: expected K >= 0 and V >= 1, got {num_draft}, {vocab_size}")
    u = unit_roundoff(arithmetic)
    scan = 2 + 2 * math.ceil(math.log2(vocab_size)) if vocab_size > 1 else 2
    return u * (7 * num_draft + vocab_size * scan) + INTEGRATION_FLOOR


def declared_arithmetic(fn: Any) -> tuple[str, bool]:
    """The precision ``fn`` declares (its ``arithmetic`` attribute) and whether it declared one;
    :data:`DEFAULT_ARITHMETIC` when it did not.  Raises ValueError for an unknown precision."""
    declared = getattr(fn, "arithmetic", None)
    if declared is None:
        return DEFAULT_ARITHMETIC, False
    return check_arithmetic(declared), True
