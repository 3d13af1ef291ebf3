"""Speedup model for tree speculative decoding: tokens per target pass of a tree shape, cost of
verifying its N nodes (the tree extension of :mod:`specverify.core.speedup`).

Acceptance model (as in SpecInfer's and Sequoia's analyses): the ``k``-th child (``k = 0, 1, …``,
in index order) of a node that was reached is accepted with probability ``rates[k]`` given that
its earlier siblings were rejected, independently across nodes.  A node is on the accepted path
with probability

    P(n) = P(parent(n)) · Π_{j<k} (1 − rates[j]) · rates[k]      (P(root) = 1),

and one pass emits ``E[tokens] = 1 + Σ_n P(n)``.  For a chain with ``rates = [α]`` this is
Leviathan et al. 2023 eq. (1), ``(1 − α^{N+1}) / (1 − α)``.  For drafts verified by recursive
rejection sampling the exact value for given laws is
:func:`specverify.core.tree_exact.expected_tree_accepted_length` ``+ 1``; deterministic
(top-k) children have ``rates[k] = p(k-th draft token) / (1 − Σ_{j<k} p(j-th))``.

Cost of one pass in target steps: ``depth · c + 1 + N · v``: the drafter runs one (batched) pass
per tree level (``c`` each), the target scores all N nodes in one pass with a tree attention
mask, each scored node beyond the first costing ``v`` (0 when memory bound, up to 1 when
compute bound; :mod:`specverify.core.speedup`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specverify.core.tree_exact import check_shape, tree_depth


@dataclass(frozen=True)
class TreeSpeedupEstimate:
    """The model's prediction for one tree shape: ``tokens_per_pass``, ``pass_cost`` and their ratio."""

    num_nodes: int
    depth: int
    tokens_per_pass: float
    pass_cost: float
    speedup: float


def node_acceptance(parents: Sequence[int], rates: Sequence[float]) -> tuple[float, ...]:
    """``P(n)``, the probability that node ``n`` is on the accepted path (model of the module docstring).
    ``rates[k]`` applies to the ``k``-th child of a node; the last rate repeats for later children."""
    shape = check_shape(parents)
    rates = tuple(float(r) for r in rates)
    if not rates or any(not (math.isfinite(r) and 0 <= r <= 1) for r in rates):
        raise ValueError(f"rates: expected a non-empty sequence of probabilities in [0, 1], got {rates!r}")
    reached: list[float] = []
    rank_of: dict[int, int] = {}
    for parent in shape:
        rank = rank_of.get(parent, 0)
        rank_of[parent] = rank + 1
        earlier_fail = math.prod(1.0 - rates[min(j, len(rates) - 1)] for j in range(rank))
        base = 1.0 if parent < 0 else reached[parent]
        reached.append(base * earlier_fail * rates[min(rank, len(rates) - 1)])
    return tuple(reached)


def tree_tokens_per_pass(parents: Sequence[int], rates: Sequence[float]) -> float:
    """``E[tokens per target pass] = 1 + Σ_n P(n)``."""
    return 1.0 + math.fsum(node_acceptance(parents, rates))


def tree_pass_cost(parents: Sequence[int], draft_cost: float, verify_cost: float = 0.0) -> float:
    """``depth · c + 1 + N · v`` target steps (see the module docstring)."""
    for name, value in (("draft_cost", draft_cost), ("verify_cost", verify_cost)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}: expected a finite cost >= 0 in target steps, got {value!r}")
    shape = check_shape(parents)
    return tree_depth(shape) * draft_cost + 1.0 + len(shape) * verify_cost


def tree_speedup(parents: Sequence[int], rates: Sequence[float], draft_cost: float,
                 verify_cost: float = 0.0) -> TreeSpeedupEstimate:
    """Walltime improvement over plain decoding: ``tokens_per_pass / pass_cost``."""
    tokens = tree_tokens_per_pass(parents, rates)
    cost = tree_pass_cost(parents, draft_cost, verify_cost)
    shape = check_shape(parents)
    return TreeSpeedupEstimate(len(shape), tree_depth(shape), tokens, cost, tokens / cost)
