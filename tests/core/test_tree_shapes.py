"""Production tree shapes (specverify.core.tree_exact): EAGLE-2-like dynamic trees and the node
orders SPEC §3 allows (breadth-first, depth-first, interleaved)."""

from __future__ import annotations

import pytest

from specverify.auditing.runner import load_battery
from specverify.auditing.tree.battery import DEEP_VOCAB, PRODUCTION_NODES, PRODUCTION_SEEDS, production_trees
from specverify.core import tree_exact
from specverify.core.tree_exact import (
    NODE_ORDERS,
    breadth_first_order,
    children_of,
    depth_first_order,
    depths,
    dynamic_tree_shape,
    interleaved_order,
    max_children,
    reorder,
    shape_span,
    tree_depth,
)


def _canonical(shape: tuple[int, ...]) -> frozenset:
    """The tree as a set of root-to-node paths of sibling ranks (invariant under renumbering that
    keeps siblings in their relative order)."""
    children = children_of(shape)
    paths: dict[int, tuple[int, ...]] = {-1: ()}
    for node in range(len(shape)):
        parent = shape[node]
        paths[node] = paths[parent] + (children[parent].index(node),)
    return frozenset(paths[n] for n in range(len(shape)))


@pytest.mark.parametrize("seed", range(6))
def test_dynamic_trees_are_breadth_first_eagle_trees(seed):
    shape = dynamic_tree_shape(seed, num_nodes=60, depth=8, top_k=10)
    assert len(shape) == 60 and tree_depth(shape) <= 8 and max_children(shape) <= 10
    assert breadth_first_order(shape) == shape
    assert list(depths(shape)) == sorted(depths(shape))  # breadth-first: depth never decreases


def test_dynamic_trees_depend_on_the_seed_and_parameters():
    assert dynamic_tree_shape(0) == dynamic_tree_shape(0)
    assert len({dynamic_tree_shape(seed) for seed in range(6)}) == 6
    assert tree_depth(dynamic_tree_shape(0, top_k=4, concentration=0.15, expand=2)) == 8
    assert max_children(dynamic_tree_shape(2, concentration=1.0, expand=3)) == 10
    with pytest.raises(ValueError, match="num_nodes"):
        dynamic_tree_shape(0, num_nodes=0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("order", NODE_ORDERS)
def test_reordering_keeps_the_tree_and_every_node_after_its_parent(seed, order):
    shape = dynamic_tree_shape(seed)
    reordered = reorder(shape, order, seed)
    assert all(parent < node for node, parent in enumerate(reordered))
    assert _canonical(reordered) == _canonical(shape)


def test_depth_first_order_is_pre_order_and_separates_siblings():
    assert depth_first_order((-1, -1, 0, 1)) == (-1, 0, -1, 2)
    shape = depth_first_order(dynamic_tree_shape(0))
    subtree = {node: {node} for node in range(len(shape))}
    for node in reversed(range(len(shape))):
        if shape[node] >= 0:
            subtree[shape[node]] |= subtree[node]
    assert all(max(s) - min(s) + 1 == len(s) == len(s & set(range(n, n + len(s)))) for n, s in subtree.items())
    roots = children_of(shape)[-1]
    assert any(b - a > 1 for a, b in zip(roots, roots[1:]))  # the root's children are not adjacent


def test_interleaved_orders_vary_with_the_seed():
    shape = dynamic_tree_shape(1)
    orders = {interleaved_order(shape, seed) for seed in range(5)}
    assert len(orders) == 5 and all(_canonical(o) == _canonical(shape) for o in orders)
    with pytest.raises(ValueError, match="order"):
        reorder(shape, "random")


def test_production_tree_sets_reach_depth_eight_ten_children_and_every_order():
    deep = production_trees(top_k=10, concentration=0.15, expand=4)
    wide = production_trees(top_k=10, concentration=1.0, expand=3)
    narrow = production_trees(top_k=4, concentration=0.15, expand=4)
    assert len(deep) == len(PRODUCTION_SEEDS) * len(NODE_ORDERS)
    assert max(tree_depth(s) for s in deep) == 8 and max(tree_depth(s) for s in narrow) == 8
    assert max(max_children(s) for s in wide) == 10 and max(max_children(s) for s in narrow) <= 4
    assert all(len(s) == 60 for s in deep + wide)
    # each dynamic tree appears in breadth-first, depth-first and interleaved order (three different layouts)
    assert all(len(set(deep[3 * i: 3 * i + 3])) == 3 for i in range(len(PRODUCTION_SEEDS)))
    assert tree_exact.depth_first_order(deep[0]) == deep[1]


def test_limit_shapes_reach_every_distance_depth_and_fan_out():
    assert tree_exact.broom_shape(5) == (-1, 0, 0, 0, 0)
    assert tree_exact.far_child_star_shape(5) == (-1, -1, -1, -1, 0)
    assert tree_exact.mirrored_shape(8, 0) == (-1, 0, 1, 2, 3, 2, 1, 0)  # distances 1, 3, 5, 7
    assert tree_exact.mirrored_shape(8, 1) == (-1, 0, 1, 2, 2, 1, 0, 3)  # distances 2, 4, 6 and 4
    for num_nodes in range(2, 61):
        far = shape_span(tree_exact.far_parent_shapes(num_nodes))
        assert far.missing_distances(num_nodes) == () and max(far.depths) == num_nodes and max(far.children) <= 2
        wide = shape_span(tree_exact.fan_out_shapes(num_nodes))
        assert wide.missing_distances(num_nodes) == () and max(wide.children) == num_nodes - 1
    with pytest.raises(ValueError, match="num_nodes"):
        tree_exact.mirrored_shape(1, 0)


def test_shape_span_counts_distances_depths_and_children_in_the_given_order():
    span = shape_span([(-1, -1, 0, 1), (-1, 0, -1, 2)])
    assert span.distances == {2, 1} and span.depths == {1, 2} and span.children == {1, 2}
    assert span.missing_distances(5) == (3, 4)


def test_the_production_checks_span_what_a_60_node_tree_allows():
    """Every parent–child index distance 1 … 59 and depth 60 in every deep check; 59 children of a
    node and of the root in the fan-out check (independent siblings: without replacement or top-k
    a node has at most V = 4)."""
    battery = load_battery("tree")
    checks = {c.name: c for c in battery.checks(battery.open_session("reference", device="cpu", timeout_s=60))}
    for scheme in ("independent", "without_replacement", "deterministic"):
        span = shape_span(checks[f"tree-dynamic-deep-{scheme}"].shapes)
        assert span.missing_distances(PRODUCTION_NODES) == () and max(span.depths) == PRODUCTION_NODES
        assert max(span.children) >= DEEP_VOCAB  # V = 4 bounds top-k and without-replacement siblings
    broom, star = checks["tree-fan-out-independent"].shapes
    span = shape_span((broom, star))
    assert span.missing_distances(PRODUCTION_NODES) == () and max(span.children) == PRODUCTION_NODES - 1
    assert len(children_of(broom)[0]) == len(children_of(star)[-1]) == PRODUCTION_NODES - 1
