"""Exact laws of tree speculative decoding: enumeration over drafted trees, integration over the uniforms.

A *tree shape* is ``parents``, a tuple with one entry per node: ``-1`` for a child of the root,
else the index of an earlier node (SPEC §3).  A *scheme* says how siblings are drawn from the
draft law ``q`` at their parent's path (``specverify.core.tree_rules.DRAFT_SCHEMES``):

- ``independent``: every node ``x_n ~ q`` independently (SpecInfer; duplicate sibling tokens possible);
- ``without_replacement``: ``x_n ~ q`` without the earlier siblings' tokens, renormalised
  (Jeon et al. 2024, Recursive Speculative Decoding);
- ``deterministic``: the ``k``-th child of a node is the draft's ``k``-th most likely token
  (top-k expansion; ties broken by the lower token id), drawn from a one-hot law.

The target and draft laws come from a :class:`specverify.core.chains.Chain` keyed by the path
(``chain.target(prefix + path)``), so a node's target law depends on its ancestors.

:func:`tree_step_distribution` integrates *any* rule that follows the uniform convention of
:mod:`specverify.core.tree_rules` (``u [B, N+1]``: column ``n`` the accept test of node ``n``,
column ``N`` the final inverse-CDF draw) exactly, with the same machinery as
:func:`specverify.core.exact.step_distribution` (a product grid of candidate breakpoints per
drafted tree, random and one-axis checks that every cell is constant, bisection for missed
breakpoints, at most ``exact.MAX_REFINEMENTS`` rounds).  :func:`ideal_tree_step_distribution` is
the analytic law of recursive rejection sampling, :func:`tree_sequence_distribution` the law of
the first L tokens of a decoding run that drafts a fresh tree of the same shape every step.
Distributions are ``dict[tuple[int, ...], float]`` as in :mod:`specverify.core.exact`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specverify.core import exact
from specverify.core.chains import Chain
from specverify.core.exact import Distribution, prefix_law_of_steps
from specverify.core.tree_rules import DRAFT_SCHEMES

TreeRule = Callable[..., Any]


# --------------------------------------------------------------------------------------------
# Tree shapes and drafted trees
# --------------------------------------------------------------------------------------------


def check_shape(parents: Sequence[int]) -> tuple[int, ...]:
    """``parents`` as a tuple, after checking that every node's parent is -1 or an earlier node."""
    shape = tuple(int(a) for a in parents)
    if not shape:
        raise ValueError("parents: a tree needs at least one node")
    for node, parent in enumerate(shape):
        if not -1 <= parent < node:
            raise ValueError(f"parents: node {node} has parent {parent}; expected -1 or an earlier node (< {node})")
    return shape


def depths(parents: Sequence[int]) -> tuple[int, ...]:
    """Depth of every node (a child of the root has depth 1)."""
    result: list[int] = []
    for parent in check_shape(parents):
        result.append(1 if parent < 0 else result[parent] + 1)
    return tuple(result)


def tree_depth(parents: Sequence[int]) -> int:
    """Number of nodes on the longest root-to-node path: a step emits at most ``depth + 1`` tokens."""
    return max(depths(parents))


def chain_shape(num_nodes: int) -> tuple[int, ...]:
    """``(-1, 0, 1, …)``: the §1 chain as a tree."""
    return tuple(range(-1, num_nodes - 1))


def star_shape(num_nodes: int) -> tuple[int, ...]:
    """Every node a child of the root (``num_nodes`` drafts for the next token)."""
    return (-1,) * num_nodes


def broom_shape(num_nodes: int) -> tuple[int, ...]:
    """One child of the root with every other node as its child: ``num_nodes − 1`` children of
    node 0, node ``n`` at index distance ``n`` from its parent (every distance 1 … N − 1)."""
    return (-1,) + (0,) * (num_nodes - 1)


def far_child_star_shape(num_nodes: int) -> tuple[int, ...]:
    """``N − 1`` children of the root, the last node a child of the first: the root's first child,
    tested first, has its only child ``N − 1`` indices after it."""
    return (-1,) * (num_nodes - 1) + (0,)


def mirrored_shape(num_nodes: int, shift: int) -> tuple[int, ...]:
    """A chain of the first ``h = N // 2`` nodes whose second children come in mirror order at the
    end: node ``j ≥ h`` is a child of node ``N − 1 − shift − j`` (where that is a chain node, else
    of the chain's last node), at index distance ``2j − N + 1 + shift``.  Two children per node
    at most; ``shift`` 0 and 1 together give every distance 1 … N − 1 (for even N, 0 the odd
    ones and 1 the even ones)."""
    if num_nodes < 2:
        raise ValueError(f"num_nodes: a mirrored tree needs at least 2 nodes, got {num_nodes}")
    half = num_nodes // 2
    parents = [-1] + list(range(half - 1))
    for node in range(half, num_nodes):
        mirror = num_nodes - 1 - shift - node
        parents.append(mirror if 0 <= mirror < half else half - 1)
    return check_shape(parents)


def binary_shape(num_nodes: int) -> tuple[int, ...]:
    """A complete binary tree in breadth-first order: node ``n``'s parent is ``(n − 2) // 2``
    (the root's two children first)."""
    return tuple(-1 if n < 2 else (n - 2) // 2 for n in range(num_nodes))


def eagle_shape(top_k: int, depth: int, expand: int) -> tuple[int, ...]:
    """EAGLE-like expansion: ``top_k`` children of the root, then at every level ``top_k``
    children for each of the first ``expand`` nodes of the previous level (the best-scored ones,
    which a drafter lists first), ``depth`` levels in all."""
    parents: list[int] = [-1] * top_k
    level = list(range(top_k))
    for _ in range(depth - 1):
        next_level = []
        for node in level[:expand]:
            for _ in range(top_k):
                next_level.append(len(parents))
                parents.append(node)
        level = next_level
    return tuple(parents)


def dynamic_tree_shape(seed: int, *, num_nodes: int = 60, depth: int = 8, top_k: int = 10,
                       expand: int = 8, concentration: float = 0.3) -> tuple[int, ...]:
    """An EAGLE-2-like dynamic draft tree (Li et al. 2024, "EAGLE-2: Faster Inference of Language
    Models with Dynamic Draft Trees", §4.2: expansion, then reranking), breadth-first.

    Every node has a confidence ``c``; its value is the product of the confidences on its path.
    The children of an expanded node take the ``top_k`` confidences ``Dirichlet(concentration)``
    sorted in decreasing order (a drafter's top-k probabilities, from ``numpy.random.default_rng(seed)``).
    Expansion: the root is expanded, then at each of the next ``depth − 1`` levels the ``expand``
    nodes of largest value.  Reranking: the ``num_nodes`` nodes of largest value are kept (a
    child's value is below its parent's, so every kept node's parent is kept), breadth-first:
    by depth, then by the parent's position, then by confidence (sibling rank).  The result has
    depth ≤ ``depth`` and at most ``top_k`` children per node; how deep and how wide it is
    depends on the seed, as EAGLE-2's trees depend on the draft's confidence.
    """
    for name, argument in (("num_nodes", num_nodes), ("depth", depth), ("top_k", top_k), ("expand", expand)):
        if not isinstance(argument, int) or argument < 1:
            raise ValueError(f"{name}: expected a positive integer, got {argument!r}")
    rng = np.random.default_rng(seed)
    # candidates: (value, depth, parent candidate, rank); candidate 0.. in creation order
    candidates: list[tuple[float, int, int, int]] = []
    frontier: list[tuple[int, float]] = [(-1, 1.0)]  # (candidate id, value) of the nodes expanded at this level
    for level in range(1, depth + 1):
        created: list[tuple[int, float]] = []
        for parent, value in frontier:
            confidences = np.sort(rng.dirichlet(np.full(top_k, concentration)))[::-1]
            for rank, confidence in enumerate(confidences):
                candidates.append((value * float(confidence), level, parent, rank))
                created.append((len(candidates) - 1, value * float(confidence)))
        created.sort(key=lambda item: (-item[1], item[0]))
        frontier = created[:expand]
    kept = sorted(range(len(candidates)), key=lambda i: (-candidates[i][0], i))[:num_nodes]
    position: dict[int, int] = {-1: -1}  # candidate id -> node index, parents numbered first
    shape: list[int] = []
    for level in range(1, depth + 1):
        level_nodes = sorted((i for i in kept if candidates[i][1] == level),
                             key=lambda i: (position[candidates[i][2]], candidates[i][3]))
        for i in level_nodes:
            position[i] = len(shape)
            shape.append(position[candidates[i][2]])
    return check_shape(shape)


def breadth_first_order(parents: Sequence[int]) -> tuple[int, ...]:
    """The same tree with its nodes renumbered breadth-first (by depth; within a depth by the
    parent's new index, siblings keeping their relative order)."""
    return _renumbered(parents, _breadth_first(check_shape(parents)))


def depth_first_order(parents: Sequence[int]) -> tuple[int, ...]:
    """The same tree with its nodes renumbered depth-first (pre-order: a node, then its first
    child's whole subtree, then its second child's …; siblings keep their relative order).
    Siblings are then no longer adjacent: SpecInfer-style token trees, still valid SPEC §3 trees."""
    shape = check_shape(parents)
    children = children_of(shape)
    order: list[int] = []
    stack = list(reversed(children.get(-1, [])))
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children.get(node, [])))
    return _renumbered(shape, order)


def interleaved_order(parents: Sequence[int], seed: int) -> tuple[int, ...]:
    """The same tree in a random order that SPEC §3 allows (every node after its parent), siblings
    keeping their relative order: at each step one of the nodes whose parent and earlier siblings
    are already placed is chosen uniformly (``numpy.random.default_rng(seed)``)."""
    shape = check_shape(parents)
    children = children_of(shape)
    rng = np.random.default_rng(seed)
    next_child = {-1: 0}
    order: list[int] = []
    while len(order) < len(shape):
        ready = [parent for parent, i in next_child.items() if i < len(children.get(parent, []))]
        parent = ready[int(rng.integers(len(ready)))]
        node = children[parent][next_child[parent]]
        next_child[parent] += 1
        next_child[node] = 0
        order.append(node)
    return _renumbered(shape, order)


NODE_ORDERS = ("breadth_first", "depth_first", "interleaved")
"""The node orders :func:`reorder` produces (SPEC §3 requires only that a node follow its parent)."""


def reorder(parents: Sequence[int], order: str, seed: int = 0) -> tuple[int, ...]:
    """``parents`` renumbered in one of :data:`NODE_ORDERS` (``seed``: for ``interleaved``)."""
    if order == "breadth_first":
        return breadth_first_order(parents)
    if order == "depth_first":
        return depth_first_order(parents)
    if order == "interleaved":
        return interleaved_order(parents, seed)
    raise ValueError(f"order: expected one of {', '.join(NODE_ORDERS)}, got {order!r}")


def _breadth_first(shape: tuple[int, ...]) -> list[int]:
    children = children_of(shape)
    order: list[int] = []
    level = children.get(-1, [])
    while level:
        order += level
        level = [child for node in level for child in children.get(node, [])]
    return order


def _renumbered(shape: Sequence[int], order: list[int]) -> tuple[int, ...]:
    """The shape with old node ``order[i]`` as new node ``i``."""
    new_index = {old: new for new, old in enumerate(order)}
    new_index[-1] = -1
    return check_shape(tuple(new_index[shape[old]] for old in order))


def max_children(parents: Sequence[int]) -> int:
    """The largest number of children of one node (the root included)."""
    return max(len(kids) for kids in children_of(check_shape(parents)).values())


def far_parent_shapes(num_nodes: int) -> tuple[tuple[int, ...], ...]:
    """Trees of ``num_nodes`` nodes at the depth and parent–child distance a tree of that size
    allows, with at most two children per node (so under every sibling scheme at V ≥ 2), each in
    the one node order that makes it extreme: a chain (depth N) and the two mirrored trees
    (:func:`mirrored_shape`: every parent–child index distance 1 … N − 1)."""
    return chain_shape(num_nodes), mirrored_shape(num_nodes, 0), mirrored_shape(num_nodes, 1)


def fan_out_shapes(num_nodes: int) -> tuple[tuple[int, ...], ...]:
    """Trees of ``num_nodes`` nodes at the fan-out a tree of that size allows, each in the one node
    order that makes it extreme: the broom (a node with N − 1 children at index distances
    1 … N − 1, :func:`broom_shape`: a child far from its parent is tested when an early sibling
    was accepted, if its parent is misread) and the star with a far child (N − 1 children of the
    root, :func:`far_child_star_shape`: a child N − 1 indices after its parent is tested
    whenever that parent, the root's first child, is accepted).  Siblings drawn without
    replacement or top-k number at most V."""
    return broom_shape(num_nodes), far_child_star_shape(num_nodes)


@dataclass(frozen=True)
class ShapeSpan:
    """What a set of tree shapes spans, in the node orders they are given in."""

    distances: frozenset[int]
    """``n − parents[n]`` over every node whose parent is a node (not the root)."""
    depths: frozenset[int]
    """The depth of every node (1 for a child of the root)."""
    children: frozenset[int]
    """The number of children of every node that has some, the root included."""

    def missing_distances(self, num_nodes: int) -> tuple[int, ...]:
        """The parent–child index distances 1 … ``num_nodes − 1`` that no shape has."""
        return tuple(d for d in range(1, num_nodes) if d not in self.distances)


def shape_span(shapes: Sequence[Sequence[int]]) -> ShapeSpan:
    """The parent–child index distances, node depths and numbers of children that ``shapes`` span."""
    distances: set[int] = set()
    node_depths: set[int] = set()
    children: set[int] = set()
    for parents in shapes:
        shape = check_shape(parents)
        distances.update(node - parent for node, parent in enumerate(shape) if parent >= 0)
        node_depths.update(depths(shape))
        children.update(len(kids) for kids in children_of(shape).values())
    return ShapeSpan(frozenset(distances), frozenset(node_depths), frozenset(children))


def _check_scheme(scheme: str) -> None:
    if scheme not in DRAFT_SCHEMES:
        raise ValueError(f"scheme: expected one of {', '.join(DRAFT_SCHEMES)}, got {scheme!r}")


def sibling_law(q: np.ndarray, earlier_tokens: Sequence[int], scheme: str) -> np.ndarray:
    """The law a node is drawn from, given the draft law ``q`` at its parent and its earlier
    siblings' tokens (SPEC §3 ``draft_probs``): ``q``; ``q`` without those tokens, renormalised;
    or the one-hot law of the ``len(earlier_tokens)``-th most likely token of ``q``."""
    _check_scheme(scheme)
    if scheme == "independent":
        return q
    if scheme == "without_replacement":
        law = q.copy()
        law[list(earlier_tokens)] = 0.0
        if law.sum() <= 0:
            raise ValueError("parents: a node has more children than its draft law has tokens of positive "
                             "probability, so they cannot be drawn without replacement")
        return np.asarray(law / law.sum())
    rank = len(earlier_tokens)
    if rank >= len(q):
        raise ValueError(f"parents: a node has more than V = {len(q)} deterministic (top-k) children")
    token = int(np.argsort(-q, kind="stable")[rank])
    law = np.zeros_like(q)
    law[token] = 1.0
    return law


@dataclass(frozen=True)
class DraftedTree:
    """One draw of the tree's tokens with its probability and the laws every rule sees along it."""

    tokens: tuple[int, ...]
    prob: float
    target: np.ndarray  # float64 [N+1, V]: root, then after each node's path
    draft: np.ndarray  # float64 [N, V]: the law each node was drawn from


def enumerate_trees(chain: Chain, parents: Sequence[int], scheme: str,
                    prefix: tuple[int, ...] = ()) -> list[DraftedTree]:
    """Every drafted tree of positive probability: ``P = Π_n law_n(x_n)`` with ``law_n`` from
    :func:`sibling_law` at the path of node ``n``'s parent."""
    shape = check_shape(parents)
    _check_scheme(scheme)
    prefix = tuple(int(t) for t in prefix)
    # partial trees: (tokens, prob, node paths, draft rows)
    level: list[tuple[tuple[int, ...], float, list[tuple[int, ...]], list[np.ndarray]]] = [((), 1.0, [], [])]
    for node, parent in enumerate(shape):
        extended = []
        for tokens, prob, paths, laws in level:
            parent_path = () if parent < 0 else paths[parent]
            earlier = [tokens[m] for m in range(node) if shape[m] == parent]
            law = sibling_law(chain.draft(prefix + parent_path), earlier, scheme)
            for token in np.flatnonzero(law):
                extended.append((tokens + (int(token),), prob * float(law[token]),
                                 paths + [parent_path + (int(token),)], laws + [law]))
        level = extended
    trees = []
    for tokens, prob, paths, laws in level:
        target = np.stack([chain.target(prefix)] + [chain.target(prefix + path) for path in paths])
        trees.append(DraftedTree(tokens, prob, target.astype(np.float64), np.stack(laws).astype(np.float64)))
    return trees


def children_of(parents: Sequence[int]) -> dict[int, list[int]]:
    """node (-1 for the root) -> its children in index order."""
    children: dict[int, list[int]] = defaultdict(list)
    for node, parent in enumerate(parents):
        children[parent].append(node)
    return children


# --------------------------------------------------------------------------------------------
# The analytic law of recursive rejection sampling
# --------------------------------------------------------------------------------------------


def ideal_tree_step_distribution(chain: Chain, parents: Sequence[int], scheme: str,
                                 prefix: tuple[int, ...] = ()) -> Distribution:
    """Analytic law of the tuple one step of recursive rejection sampling emits
    (:func:`specverify.core.tree_rules.tree_rejection_sample`).

    For every drafted tree (weight ``P(tree)``): at a node with current law ``r`` the ``i``-th
    tested child is accepted with probability ``a = min(1, r(x)/q_i(x))`` (descend with the
    target law at the child), else the weight is multiplied by ``1 − a`` and ``r`` becomes
    ``(r − q_i)+`` normalised; when no child is left the final token has law ``r``.
    """
    shape = check_shape(parents)
    children = children_of(shape)
    law: Distribution = defaultdict(float)

    def visit(tree: DraftedTree, node: int, r: np.ndarray, weight: float, emitted: tuple[int, ...]) -> None:
        for child in children.get(node, []):
            x, q = tree.tokens[child], tree.draft[child]
            accept = min(1.0, r[x] / q[x])
            if accept > 0:
                visit(tree, child, tree.target[child + 1], weight * accept, emitted + (x,))
            weight *= 1.0 - accept
            if weight <= 0:
                return
            residual = np.maximum(r - q, 0.0)
            if residual.sum() > 0:
                r = residual / residual.sum()
        for token in np.flatnonzero(r):
            law[emitted + (int(token),)] += weight * r[token] / r.sum()

    for tree in enumerate_trees(chain, shape, scheme, prefix):
        visit(tree, -1, tree.target[0], tree.prob, ())
    return dict(law)


def expected_tree_accepted_length(chain: Chain, parents: Sequence[int], scheme: str,
                                  prefix: tuple[int, ...] = ()) -> float:
    """Expected accepted path length of one step of recursive rejection sampling (the optimal
    rule of this family; tokens per target pass = this + 1)."""
    return exact.mean_emitted_length(ideal_tree_step_distribution(chain, parents, scheme, prefix)) - 1.0


def acceptance_by_depth(chain: Chain, parents: Sequence[int], scheme: str, prefix: tuple[int, ...] = ()) -> np.ndarray:
    """``P(accepted length ≥ d)`` for ``d = 1..depth`` under recursive rejection sampling."""
    law = ideal_tree_step_distribution(chain, parents, scheme, prefix)
    depth = tree_depth(parents)
    return np.array([math.fsum(p for e, p in law.items() if len(e) - 1 >= d) for d in range(1, depth + 1)])


# --------------------------------------------------------------------------------------------
# Exact integration of an arbitrary tree rule
# --------------------------------------------------------------------------------------------


def _paths(trees: list[DraftedTree]) -> exact._DraftPaths:
    tokens = torch.tensor([t.tokens for t in trees], dtype=torch.int64)
    return exact._DraftPaths(tokens, np.array([t.prob for t in trees], dtype=np.float64),
                             torch.from_numpy(np.stack([t.target for t in trees])),
                             torch.from_numpy(np.stack([t.draft for t in trees])))


def _stage_laws(tree: DraftedTree, shape: tuple[int, ...]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """For every node: the correct rule's current law when it is tested; and every residual law
    the correct rule (or an unchanged-``p`` rule) can finish with."""
    stage: list[np.ndarray] = [np.zeros(0)] * len(shape)
    finals: list[np.ndarray] = []
    for parent, kids in children_of(shape).items():
        r = tree.target[parent + 1]
        for child in kids:
            stage[child] = r
            residual = np.maximum(r - tree.draft[child], 0.0)
            finals += [residual, np.maximum(tree.target[parent + 1] - tree.draft[child], 0.0)]
            without = tree.target[parent + 1].copy()
            without[tree.tokens[child]] = 0.0
            finals.append(without)
            if residual.sum() > 0:
                r = residual / residual.sum()
    return stage, finals


def _tree_breakpoints(tree: DraftedTree, shape: tuple[int, ...]) -> list[np.ndarray]:
    """Initial grid edges of one drafted tree, one sorted array per uniform column.

    Column ``n`` (token ``x``, parent ``a``): ``r(x)/q_n(x)`` for the correct rule's current law
    ``r``, ``p_a(x)/q_n(x)`` (unchanged target), ``r(x)`` and ``p_a(x)`` (one-hot drafts),
    ``p_n(x)/q_n(x)`` (own position) and ``p_{parent(a)}(x)/q_n(x)`` (the parent's position).
    Column ``N``: ``cumsum(w)/sum(w)`` for every target and draft row and every residual law of
    :func:`_stage_laws`.  Other breakpoints are found by bisection.
    """
    stage, finals = _stage_laws(tree, shape)
    columns = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for node, parent in enumerate(shape):
            x, q_x = tree.tokens[node], tree.draft[node, tree.tokens[node]]
            p_parent = tree.target[parent + 1]
            grand = shape[parent] if parent >= 0 else None
            values = [stage[node][x] / q_x, p_parent[x] / q_x, stage[node][x], p_parent[x],
                      tree.target[node + 1, x] / q_x]
            if grand is not None:
                values.append(tree.target[grand + 1, x] / q_x)
            columns.append(np.array(values))
        laws = list(tree.target) + list(tree.draft) + finals
        columns.append(np.concatenate([np.cumsum(law) / law.sum() for law in laws if law.sum() > 0]))
    return [exact._merge_edges(column) for column in columns]


def _as_chain_rule(rule: TreeRule, shape: tuple[int, ...]) -> Callable[..., Any]:
    """The tree rule as a rule of ``exact``'s calling convention, with the shape's parents filled in."""
    parents = torch.tensor(shape, dtype=torch.int64)

    def chain_rule(target_probs: torch.Tensor, draft_probs: torch.Tensor, tokens: torch.Tensor,
                   generator: torch.Generator | None = None, *, uniforms: torch.Tensor | None = None) -> torch.Tensor:
        batch_parents = parents.expand(tokens.shape[0], len(shape)).contiguous()
        emitted: torch.Tensor = rule(target_probs, draft_probs, tokens, batch_parents, None, uniforms=uniforms)
        return emitted

    return chain_rule


def tree_step_distribution(rule: TreeRule, chain: Chain, parents: Sequence[int], scheme: str,
                           prefix: tuple[int, ...] = ()) -> Distribution:
    """Exact law of the tuple one step of ``rule`` emits on trees of shape ``parents`` drawn by ``scheme``.

    ``P(e) = Σ_T P(T) · vol{u ∈ [0,1)^{N+1} : rule(p, q, T, parents, u) emits e}`` over drafted
    trees ``T`` (:func:`enumerate_trees`).  ``rule`` is called as
    ``rule(target_probs, draft_probs, tree_tokens, parents, None, uniforms=u)`` on float64 CPU
    tensors and returns the emitted tensor ``[B, N+1]`` or an object with ``.emitted``.  The
    integration is that of :func:`specverify.core.exact.step_distribution` with the candidate
    breakpoints of :func:`_tree_breakpoints`; it raises ``ValueError`` for rules that draw other
    randomness or whose breakpoints cannot be found.
    """
    shape = check_shape(parents)
    trees = enumerate_trees(chain, shape, scheme, prefix)
    paths = _paths(trees)
    edges = [_tree_breakpoints(tree, shape) for tree in trees]
    return _integrate(_as_chain_rule(rule, shape), paths, edges, chain.vocab_size)


def _integrate(rule: Callable[..., Any], paths: exact._DraftPaths, edges: list[list[np.ndarray]],
               vocab_size: int) -> Distribution:
    """The refinement loop of :func:`specverify.core.exact.step_distribution` on given paths and edges."""
    pending = np.arange(len(paths.probs))
    totals: dict[int, float] = defaultdict(float)
    failed_paths = pending
    for round_index in range(exact.MAX_REFINEMENTS + 1):
        grid = exact._build_grid(edges, pending)
        rng = np.random.default_rng(round_index)
        first = grid.low + grid.width * rng.uniform(0.05, 0.95, size=grid.low.shape)
        second = grid.low + grid.width * rng.uniform(0.05, 0.95, size=grid.low.shape)
        first_codes = exact._evaluate(rule, paths, grid.path, first)
        second_codes = exact._evaluate(rule, paths, grid.path, second)
        pairs = exact._concatenate_pairs(
            exact._pairs_where(first_codes != second_codes, first, first_codes, second, second_codes),
            exact._scan_columns(rule, paths, grid, first, first_codes),
        )
        failed_paths = np.unique(grid.path[pairs.cell])
        exact._add_cell_masses(totals, paths, grid, first_codes, ~np.isin(grid.path, failed_paths))
        if len(failed_paths) == 0:
            return exact._decode_distribution(totals, vocab_size)
        if round_index == exact.MAX_REFINEMENTS:
            break
        pairs = exact._select_pairs(pairs, grid.path)
        cell_paths = grid.path[pairs.cell]
        exact._check_uses_only_uniforms(rule, paths, cell_paths, pairs.point_a, pairs.code_a)
        grown: set[int] = set()
        for path_index, column, value in exact._locate_breakpoints(rule, paths, cell_paths, pairs):
            before = len(edges[path_index][column])
            edges[path_index][column] = exact._merge_edges(np.append(edges[path_index][column], value))
            if len(edges[path_index][column]) > before:
                grown.add(path_index)
        settled = np.array([path for path in failed_paths if int(path) not in grown], dtype=np.int64)
        exact._add_cell_masses(totals, paths, grid, first_codes, np.isin(grid.path, settled))
        pending = np.setdiff1d(failed_paths, settled)
        if len(pending) == 0:
            return exact._decode_distribution(totals, vocab_size)
    raise ValueError(
        f"rule: after {exact.MAX_REFINEMENTS} rounds of breakpoint search its output is still not constant on "
        f"the integration cells of {len(failed_paths)} drafted tree(s): its breakpoints in the uniforms cannot be "
        "found (not axis-aligned, or too many). Exact integration needs the uniform convention of "
        "specverify.core.tree_rules; audit this rule statistically instead."
    )


# --------------------------------------------------------------------------------------------
# Losslessness: completed laws, whole runs, TV
# --------------------------------------------------------------------------------------------


def completed_tree_step_distribution(step_dist: Distribution, chain: Chain, parents: Sequence[int],
                                     prefix: tuple[int, ...] = ()) -> Distribution:
    """Law of the first ``depth + 1`` tokens when each emitted tuple is extended by target sampling;
    the step is lossless iff it equals ``exact.target_sequence_distribution(chain, depth + 1, prefix)``."""
    return exact.completed_step_distribution(step_dist, chain, tree_depth(parents), prefix)


def exact_tree_step_tv(rule: TreeRule | None, chain: Chain, parents: Sequence[int], scheme: str,
                       prefix: tuple[int, ...] = ()) -> float:
    """TV between the rule's completed one-step law and the target's law of ``depth + 1`` tokens
    (``rule=None``: the analytic law of recursive rejection sampling)."""
    if rule is None:
        step = ideal_tree_step_distribution(chain, parents, scheme, prefix)
    else:
        step = tree_step_distribution(rule, chain, parents, scheme, prefix)
    completed = completed_tree_step_distribution(step, chain, parents, prefix)
    return exact.total_variation(completed, exact.target_sequence_distribution(chain, tree_depth(parents) + 1, prefix))


def tree_sequence_distribution(rule: TreeRule | None, chain: Chain, parents: Sequence[int], scheme: str,
                               length: int, prefix: tuple[int, ...] = ()) -> Distribution:
    """Exact law of the first ``length`` tokens of a decoding run that drafts a fresh tree of shape
    ``parents`` (by ``scheme``) at every step and verifies it with ``rule`` (``None``: the analytic
    recursive rejection sampling).  Dynamic programme over steps, step laws memoised by
    ``chain.context_after`` (or the prefix), as :func:`specverify.core.exact.sequence_distribution`."""
    if length < 0:
        raise ValueError(f"length: expected a non-negative integer, got {length}")
    shape = check_shape(parents)
    prefix = tuple(int(t) for t in prefix)
    step_laws: dict[Any, Distribution] = {}

    def step_law(at: tuple[int, ...]) -> Distribution:
        key = chain.context_after(at) if hasattr(chain, "context_after") else at
        if key not in step_laws:
            step_laws[key] = (ideal_tree_step_distribution(chain, shape, scheme, at) if rule is None
                              else tree_step_distribution(rule, chain, shape, scheme, at))
        return step_laws[key]

    return prefix_law_of_steps(step_law, prefix, length)


def exact_tree_run_tv(rule: TreeRule | None, chain: Chain, parents: Sequence[int], scheme: str, length: int,
                      prefix: tuple[int, ...] = ()) -> float:
    """TV between the first ``length`` tokens of a tree decoding run and target sampling."""
    run = tree_sequence_distribution(rule, chain, parents, scheme, length, prefix)
    return exact.total_variation(run, exact.target_sequence_distribution(chain, length, prefix))
