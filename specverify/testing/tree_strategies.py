"""Hypothesis strategies for draft trees (SPEC §3).

- :func:`tree_shapes`: ``parents`` tuples of a kind: ``chain``, ``star``, ``binary``, ``eagle``
  (top-k expansion of the best nodes, level by level), ``dynamic`` (EAGLE-2's expansion and
  reranking by path confidence, :func:`specverify.core.tree_exact.dynamic_tree_shape`) or
  ``random``; with ``orders`` renumbered breadth-first, depth-first or interleaved.
- :func:`node_orders`: one of :data:`specverify.core.tree_exact.NODE_ORDERS`.
- :func:`sibling_schemes`: one of ``independent``, ``without_replacement``, ``deterministic``.
- :func:`path_chains`: target/draft pairs keyed by the path (order-``k`` Markov chains), so a
  node's target law depends on its ancestors.
- :func:`tree_batches`: ready tensors ``(target_probs, draft_probs, tree_tokens, parents)`` for a
  ragged batch: rows of different shapes and schemes, padded with absent nodes (``-1``), the
  tokens drawn from each node's law (duplicate sibling tokens included under independent drawing,
  and forced with ``duplicates=True``).

Shrinking goes towards small trees (a single child of the root), small vocabularies and the
first tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from hypothesis import strategies as st

from specverify.core.tree_exact import (
    NODE_ORDERS,
    binary_shape,
    chain_shape,
    dynamic_tree_shape,
    eagle_shape,
    reorder,
    sibling_law,
    star_shape,
)
from specverify.core.tree_rules import DRAFT_SCHEMES
from specverify.testing.strategies import markov_chains

SHAPE_KINDS = ("chain", "star", "binary", "eagle", "dynamic", "random")
__all__ = ["NODE_ORDERS", "SHAPE_KINDS", "TreeBatch", "binary_shape", "chain_shape", "dynamic_tree_shape",
           "eagle_shape",
           "node_orders", "path_chains", "sibling_schemes", "star_shape", "tree_batches", "tree_shapes"]


@st.composite
def _random_shape(draw: st.DrawFn, max_nodes: int) -> tuple[int, ...]:
    num_nodes = draw(st.integers(1, max_nodes))
    return tuple([-1] + [draw(st.integers(-1, n - 1)) for n in range(1, num_nodes)])


def tree_shapes(max_nodes: int = 4, kinds: tuple[str, ...] = SHAPE_KINDS,
                orders: tuple[str, ...] = ("breadth_first",)) -> st.SearchStrategy[tuple[int, ...]]:
    """``parents`` tuples with 1..``max_nodes`` nodes of the given kinds (a parent always precedes
    its children; ``eagle`` shapes are generated with ``top_k``, ``depth``, ``expand`` ≤ 2 and
    truncated to ``max_nodes``; ``dynamic`` ones with ``num_nodes`` ≤ ``max_nodes``, depth ≤ 8,
    ``top_k`` ≤ 10), each in one of ``orders`` (:data:`NODE_ORDERS`; the kinds' own numbering is
    breadth-first except ``random``, which keeps its own)."""
    unknown = set(kinds) - set(SHAPE_KINDS)
    if unknown or not kinds:
        raise ValueError(f"kinds: expected a non-empty subset of {SHAPE_KINDS}, got {kinds!r}")
    if max_nodes < 1:
        raise ValueError(f"max_nodes: expected at least 1, got {max_nodes}")
    if set(orders) - set(NODE_ORDERS) or not orders:
        raise ValueError(f"orders: expected a non-empty subset of {NODE_ORDERS}, got {orders!r}")
    sizes = st.integers(1, max_nodes)
    options = []
    if "chain" in kinds:
        options.append(sizes.map(chain_shape))
    if "star" in kinds:
        options.append(sizes.map(star_shape))
    if "binary" in kinds:
        options.append(sizes.map(binary_shape))
    if "eagle" in kinds:
        options.append(st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 2))
                       .map(lambda args: eagle_shape(*args)[:max_nodes]))
    if "dynamic" in kinds:
        options.append(st.builds(lambda seed, n, depth, top_k: dynamic_tree_shape(seed, num_nodes=n, depth=depth,
                                                                                  top_k=top_k),
                                 st.integers(0, 2**16), sizes, st.integers(1, 8), st.integers(1, 10)))
    if "random" in kinds:
        options.append(_random_shape(max_nodes))
    shapes = st.one_of(*options)
    if orders == ("breadth_first",):
        return shapes
    return st.builds(lambda shape, order, seed: shape if order == "breadth_first" else reorder(shape, order, seed),
                     shapes, st.sampled_from(orders), st.integers(0, 2**16))


def node_orders() -> st.SearchStrategy[str]:
    """One of :data:`NODE_ORDERS` (shrinks to ``breadth_first``)."""
    return st.sampled_from(NODE_ORDERS)


def sibling_schemes() -> st.SearchStrategy[str]:
    """One of :data:`specverify.core.tree_rules.DRAFT_SCHEMES` (shrinks to ``independent``)."""
    return st.sampled_from(DRAFT_SCHEMES)


def path_chains(vocab_size: int | st.SearchStrategy[int] = st.integers(2, 3),
                order: int | st.SearchStrategy[int] = st.integers(0, 2), *, relation: str = "any") -> st.SearchStrategy:
    """Chains whose laws depend on the last ``order`` tokens of the path (``order = 0``: the same
    laws at every node), from :func:`specverify.testing.strategies.markov_chains`."""
    return markov_chains(vocab_size, order, relation=relation)


class TreeBatch(NamedTuple):
    """SPEC §3 inputs for a batch of rows, float64 (``N`` the largest tree; absent nodes ``-1``)."""

    target_probs: torch.Tensor  # [B, N+1, V]
    draft_probs: torch.Tensor  # [B, N, V]
    tree_tokens: torch.Tensor  # [B, N]
    parents: torch.Tensor  # [B, N]
    schemes: tuple[str, ...]


@st.composite
def _drafted_row(draw: st.DrawFn, chain, shape: tuple[int, ...], scheme: str, duplicates: bool):
    """One row: each node's token drawn (by Hypothesis) from its sibling law's support."""
    tokens: list[int] = []
    paths: list[tuple[int, ...]] = []
    laws = []
    for node, parent in enumerate(shape):
        parent_path = () if parent < 0 else paths[parent]
        earlier = [tokens[m] for m in range(node) if shape[m] == parent]
        law = sibling_law(chain.draft(parent_path), earlier, scheme)
        support = [int(t) for t in np.flatnonzero(law)]
        if duplicates and scheme == "independent" and earlier and earlier[0] in support:
            token = earlier[0]
        else:
            token = draw(st.sampled_from(support))
        tokens.append(token)
        paths.append(parent_path + (token,))
        laws.append(law)
    target = [chain.target(())] + [chain.target(path) for path in paths]
    return tokens, np.stack(target), np.stack(laws)


@st.composite
def tree_batches(draw: st.DrawFn, chain, *, max_rows: int = 4, max_nodes: int = 4,
                 kinds: tuple[str, ...] = SHAPE_KINDS, schemes: st.SearchStrategy[str] | None = None,
                 duplicates: bool = False) -> TreeBatch:
    """A ragged batch over one chain: every row its own shape (:func:`tree_shapes`) and scheme,
    padded to the largest tree with absent nodes (token and parent ``-1``, zero draft rows,
    uniform target rows).  ``chain`` must give draft laws of full enough support for the
    ``without_replacement`` scheme (rows that cannot be drawn are redrawn as ``independent``)."""
    scheme_strategy = schemes if schemes is not None else sibling_schemes()
    rows = []
    for _ in range(draw(st.integers(1, max_rows))):
        shape = draw(tree_shapes(max_nodes, kinds))
        scheme = draw(scheme_strategy)
        try:
            rows.append((shape, scheme, draw(_drafted_row(chain, shape, scheme, duplicates))))
        except ValueError:
            rows.append((shape, "independent", draw(_drafted_row(chain, shape, "independent", duplicates))))
    width = max(len(shape) for shape, _, _ in rows)
    vocab = chain.vocab_size
    target = np.full((len(rows), width + 1, vocab), 1.0 / vocab)
    draft = np.zeros((len(rows), width, vocab))
    tokens = np.full((len(rows), width), -1, dtype=np.int64)
    parents = np.full((len(rows), width), -1, dtype=np.int64)
    for b, (shape, _, (row_tokens, row_target, row_draft)) in enumerate(rows):
        n = len(shape)
        target[b, : n + 1], draft[b, :n] = row_target, row_draft
        tokens[b, :n], parents[b, :n] = row_tokens, shape
    return TreeBatch(torch.from_numpy(target), torch.from_numpy(draft), torch.from_numpy(tokens),
                     torch.from_numpy(parents), tuple(scheme for _, scheme, _ in rows))
