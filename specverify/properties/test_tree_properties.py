"""Tree properties (SPEC §3): exact laws of the reference tree rules, chain equivalence, laws.

No sampling, so nothing here can flake.  ``specverify.core.tree_exact.tree_step_distribution``
integrates a tree rule that follows the uniform convention of ``specverify.core.tree_rules``
exactly over every drafted tree; by the theorem of recursive rejection sampling (Miao et al.
2024 Theorem 4.2; Jeon et al. 2024) a lossless step completed by target sampling has the law of
``depth + 1`` tokens of target sampling, for every sibling scheme, and a run of steps has the
law of target sampling.  ``LARGEST_DEVIATION`` collects the largest ``|P_rule(y) − P_target(y)|``
seen, printed at the end of the module (``pytest -s``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from specverify.core import exact, rules, tree_exact, tree_rules
from specverify.core.chains import PositionalChain
from specverify.testing.tree_strategies import (
    NODE_ORDERS,
    chain_shape,
    path_chains,
    sibling_schemes,
    tree_batches,
    tree_shapes,
)

EXACT_TOLERANCE = 1e-9
"""Largest accepted ``|P_rule(y) − P_target(y)|`` (integration is exact up to ~1e-14 rounding)."""

EXACT_SETTINGS: dict[str, Any] = dict(deadline=None, database=None, phases=(Phase.explicit, Phase.generate),
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FAST_SETTINGS: dict[str, Any] = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

LARGEST_DEVIATION: dict[str, float] = {}


def _record(name: str, value: float) -> None:
    LARGEST_DEVIATION[name] = max(LARGEST_DEVIATION.get(name, 0.0), value)


@pytest.fixture(scope="module", autouse=True)
def _print_deviation():
    yield
    for name, value in sorted(LARGEST_DEVIATION.items()):
        print(f"\n[tree exact] largest |P_rule - P_target| in {name}: {value:.3g}")


def _assume_drawable(chain, shape, scheme) -> None:
    """Siblings must fit the vocabulary (top-k) or the draft's support (without replacement)."""
    children = tree_exact.max_children(shape)
    if scheme == "deterministic":
        assume(children <= chain.vocab_size)
    if scheme == "without_replacement":
        assume(children <= np.count_nonzero(chain.draft_table, axis=1).min())


@settings(max_examples=25, **EXACT_SETTINGS)
@given(chain=path_chains(st.integers(2, 3), st.integers(0, 1)), shape=tree_shapes(3, orders=NODE_ORDERS),
       scheme=sibling_schemes())
def test_reference_tree_step_is_exact(chain, shape, scheme):
    """One step of the reference rule, integrated exactly, completed by target sampling = target law."""
    _assume_drawable(chain, shape, scheme)
    step = tree_exact.tree_step_distribution(tree_rules.verify_tree, chain, shape, scheme)
    completed = tree_exact.completed_tree_step_distribution(step, chain, shape)
    target = exact.target_sequence_distribution(chain, tree_exact.tree_depth(shape) + 1)
    deviation = exact.max_abs_difference(completed, target)
    _record("one step (reference)", deviation)
    assert deviation <= EXACT_TOLERANCE, (shape, scheme, deviation)
    # the integrated law is also the analytic law of recursive rejection sampling
    ideal = tree_exact.ideal_tree_step_distribution(chain, shape, scheme)
    assert exact.max_abs_difference(step, ideal) <= EXACT_TOLERANCE


@settings(max_examples=8, **EXACT_SETTINGS)
@given(chain=path_chains(st.integers(2, 3), st.integers(0, 1)), shape=tree_shapes(3, ("chain", "star", "binary")))
def test_point_mass_tree_rule_is_exact_on_deterministic_trees(chain, shape):
    _assume_drawable(chain, shape, "deterministic")
    step = tree_exact.tree_step_distribution(tree_rules.point_mass_verify_tree, chain, shape, "deterministic")
    completed = tree_exact.completed_tree_step_distribution(step, chain, shape)
    deviation = exact.max_abs_difference(completed,
                                         exact.target_sequence_distribution(chain, tree_exact.tree_depth(shape) + 1))
    _record("one step (point mass, deterministic)", deviation)
    assert deviation <= EXACT_TOLERANCE


@settings(max_examples=6, **EXACT_SETTINGS)
@given(chain=path_chains(2, 1), shape=st.sampled_from([(-1, -1), (-1, 0), (-1, -1, 0)]), scheme=sibling_schemes())
def test_reference_tree_decoding_run_is_exact(chain, shape, scheme):
    """The first 3 tokens of a run that drafts a fresh tree every step follow the target."""
    _assume_drawable(chain, shape, scheme)
    run = tree_exact.tree_sequence_distribution(tree_rules.verify_tree, chain, shape, scheme, 3)
    deviation = exact.max_abs_difference(run, exact.target_sequence_distribution(chain, 3))
    _record("decoding run, L=3 (reference)", deviation)
    assert deviation <= EXACT_TOLERANCE


@settings(max_examples=30, **FAST_SETTINGS)
@given(data=st.data(), vocab=st.integers(2, 5), length=st.integers(1, 5), batch=st.integers(1, 6))
def test_chain_shaped_tree_equals_the_chain_rule(data, vocab, length, batch):
    """With the same uniforms, a chain-shaped tree emits exactly what §1 rejection sampling emits."""
    seed = data.draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(batch, length + 1, vocab, generator=g, dtype=torch.float64) ** 3
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(batch, length, vocab, generator=g, dtype=torch.float64) ** 3
    q = q / q.sum(-1, keepdim=True)
    x = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, length)
    u = torch.rand(batch, length + 1, generator=g, dtype=torch.float64)
    parents = torch.tensor(chain_shape(length)).expand(batch, length).contiguous()
    chain = rules.rejection_sample(p, q, x, uniforms=u)
    tree = tree_rules.tree_rejection_sample(p, q, x, parents, uniforms=u)
    assert torch.equal(chain.emitted, tree.emitted)
    assert torch.equal(chain.num_accepted, tree.num_accepted)


@settings(max_examples=40, **FAST_SETTINGS)
@given(data=st.data(), chain=path_chains(st.integers(2, 4), st.integers(0, 2)))
def test_tree_step_laws(data, chain):
    """Tokens per step in 1..depth+1; accepted tokens form a tree path; a target-impossible token
    is never emitted; a row's output does not depend on the other rows of the batch."""
    batch = data.draw(tree_batches(chain, max_rows=4, max_nodes=6, duplicates=data.draw(st.booleans())))
    u = torch.rand(batch.tree_tokens.shape[0], batch.tree_tokens.shape[1] + 1,
                   generator=torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1))), dtype=torch.float64)
    result = tree_rules.tree_rejection_sample(batch.target_probs, batch.draft_probs, batch.tree_tokens, batch.parents,
                                              uniforms=u)
    for b in range(batch.tree_tokens.shape[0]):
        present = int((batch.tree_tokens[b] >= 0).sum())
        shape = tuple(batch.parents[b, :present].tolist())
        emitted = [t for t in result.emitted[b].tolist() if t >= 0]
        assert 1 <= len(emitted) <= tree_exact.tree_depth(shape) + 1
        assert len(emitted) == int(result.num_accepted[b]) + 1
        # the accepted tokens are the path to last_node, and each had target probability > 0
        node, path = int(result.last_node[b]), []
        while node >= 0:
            path.append(node)
            node = shape[node]
        path.reverse()
        assert emitted[:-1] == [int(batch.tree_tokens[b, n]) for n in path]
        positions = [0] + [n + 1 for n in path]
        for token, position in zip(emitted, positions):
            assert batch.target_probs[b, position, token] > 0
        alone = tree_rules.tree_rejection_sample(batch.target_probs[b:b + 1], batch.draft_probs[b:b + 1],
                                                 batch.tree_tokens[b:b + 1], batch.parents[b:b + 1],
                                                 uniforms=u[b:b + 1])
        assert torch.equal(alone.emitted[0], result.emitted[b])


@settings(max_examples=30, **FAST_SETTINGS)
@given(data=st.data(), vocab=st.integers(2, 4), shape=tree_shapes(6))
def test_draft_equal_to_target_accepts_along_the_drawn_path(data, vocab, shape):
    """q = p at every node (siblings drawn independently): the first child of every reached node is
    accepted, so the step ends at the leaf of the first-child path with its bonus token."""
    levels = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).dirichlet(np.ones(vocab), size=8)
    # tree_batches draws its own tree of up to len(shape) nodes: a chain as deep as any of them.
    chain = PositionalChain(levels[: len(shape) + 1], levels[: len(shape)])
    batch = data.draw(tree_batches(chain, max_rows=1, max_nodes=len(shape), kinds=("random",),
                                   schemes=st.just("independent")))
    row_shape = tuple(batch.parents[0].tolist())
    u = torch.rand(1, len(row_shape) + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    result = tree_rules.tree_rejection_sample(batch.target_probs, batch.draft_probs, batch.tree_tokens, batch.parents,
                                              uniforms=u)
    children = tree_exact.children_of(row_shape)
    node, depth = -1, 0
    while children.get(node):
        node, depth = children[node][0], depth + 1
    assert int(result.last_node[0]) == node and int(result.num_accepted[0]) == depth
