"""The tree harness (specverify.testing.tree_harness): drafted trees follow each scheme's law in
any node order, laws as SPEC §3 states them, rows of mixed schemes, calls in groups."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch

import specverify.testing.tree_harness as harness
from specverify.auditing.isolation.guarded import GuardedTreeFunction
from specverify.auditing.tree.battery import tree_bank
from specverify.core import stats, tree_exact
from specverify.core.tree_rules import greedy_verify_tree
from specverify.testing.tree_harness import (
    call_in_groups,
    draft_trees,
    node_depths,
    padded_parents,
    present_nodes,
    sibling_ranks,
)

SHAPES = ((-1, 0, -1, -1, 2, 0), tree_exact.depth_first_order((-1, -1, 0, 0, 1)), (-1, -1, -1, -1))


def _draft(bank, shapes, scheme, rows, seed=0, scheme_of_row=None):
    chain = torch.zeros(rows, dtype=torch.int64)
    shape_of_row = torch.arange(rows) % len(shapes)
    return draft_trees(bank, chain, bank.prompt_states(chain), padded_parents(shapes, shape_of_row),
                       present_nodes(shapes, shape_of_row), scheme, torch.Generator().manual_seed(seed), scheme_of_row)


@pytest.mark.parametrize("race_max_vocab", [harness.RACE_MAX_VOCAB, 0])  # the race and the rejection draws
@pytest.mark.parametrize("scheme", ["independent", "without_replacement", "deterministic"])
@pytest.mark.parametrize("shape", SHAPES)
def test_drafted_trees_follow_the_schemes_law_with_the_stated_laws(shape, scheme, race_max_vocab, monkeypatch):
    monkeypatch.setattr(harness, "RACE_MAX_VOCAB", race_max_vocab)
    bank = tree_bank("harness-law", 4, 1)
    drafted = _draft(bank, (shape,), scheme, 40_000)
    trees = {t.tokens: t for t in tree_exact.enumerate_trees(bank.chain(0), shape, scheme)}
    counts = Counter(map(tuple, drafted.proposal.tree_tokens.tolist()))
    assert set(counts) <= set(trees)
    keys = sorted(trees)
    fit = stats.goodness_of_fit([counts.get(k, 0) for k in keys], [trees[k].prob for k in keys], seed=1)
    assert fit.pvalue > 1e-6, fit
    for row in range(50):  # the laws passed are the law each node was drawn from, and the target at its path
        tree = trees[tuple(drafted.proposal.tree_tokens[row].tolist())]
        np.testing.assert_allclose(drafted.proposal.draft_probs[row].numpy(), tree.draft, atol=1e-6)
        np.testing.assert_allclose(drafted.proposal.target_probs[row].numpy(), tree.target, atol=1e-6)


def test_rows_of_mixed_schemes_and_absent_nodes():
    bank = tree_bank("harness-mixed", 4, 1)
    scheme_of_row = torch.arange(12) % 3
    drafted = _draft(bank, ((-1, -1, 0), (-1,)), ("independent", "without_replacement", "deterministic"), 12, 3,
                     scheme_of_row)
    proposal = drafted.proposal
    deterministic = (scheme_of_row == 2).nonzero().squeeze(-1)
    assert torch.all(proposal.draft_probs[deterministic].max(-1).values[proposal.tree_tokens[deterministic] >= 0] == 1)
    absent = proposal.tree_tokens < 0
    assert torch.all(proposal.draft_probs[absent] == 0)
    assert torch.allclose(proposal.target_probs[:, 1:][absent], torch.full((4,), 0.25))
    wor = (scheme_of_row == 1).nonzero().squeeze(-1)
    first, second = proposal.tree_tokens[wor, 0], proposal.tree_tokens[wor, 1]
    assert torch.all(first != second)  # siblings drawn without replacement are distinct


def test_depths_and_sibling_ranks_in_any_order():
    parents = torch.tensor([[-1, 0, 1, -1, 3, 0, -1], [-1, -1, 0, -1, -1, -1, -1]])
    present = torch.tensor([[True] * 7, [True, True, True, False, False, False, False]])
    assert node_depths(parents, present).tolist() == [[1, 2, 3, 1, 2, 2, 1], [1, 1, 2, 0, 0, 0, 0]]
    assert sibling_ranks(parents, present).tolist() == [[0, 0, 0, 1, 0, 1, 2], [0, 1, 0, 0, 0, 0, 0]]


def test_calls_in_groups_give_the_one_call_outputs_and_trim_each_group():
    bank = tree_bank("harness-groups", 4, 1)
    drafted = _draft(bank, ((-1, -1, 0, 1, 2), (-1,), (-1, 0)), "independent", 40)
    function = GuardedTreeFunction(greedy_verify_tree, timeout_s=60, isolation="none")
    whole, whole_lengths, _ = function(drafted.proposal, function.generator(0), where="whole")
    seen: list[int] = []

    def recording(proposal, generator, *, where, strided=False):
        seen.append(proposal.tree_tokens.shape[1])
        return function(proposal, generator, where=where, strided=strided)

    emitted, lengths = call_in_groups(recording, drafted.proposal, function.generator(0), itertools.cycle([1, 2, 3]),
                                      "groups", itertools.cycle([False, True]))
    assert torch.equal(emitted, whole) and torch.equal(lengths, whole_lengths)
    assert seen[:3] == [5, 2, 5] and len(seen) == 21  # rows 1-2 hold trees of 1 and 2 nodes: N = 2
    seen.clear()
    call_in_groups(recording, drafted.proposal, function.generator(0), itertools.cycle([1]), "rows")
    assert seen[:3] == [5, 1, 2]  # a single row of shape (-1,) is called with N = 1
