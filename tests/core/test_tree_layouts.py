"""SGLang-style and EAGLE-style tree layouts: round trips, and the adapters' exact laws."""

from __future__ import annotations

import torch

from specverify.core import tree_exact, tree_layouts
from specverify.core.chains import random_markov_chain
from specverify.testing.tree_strategies import eagle_shape


def _batch():
    shapes = [(-1, -1, 0, 0, 1), (-1, 0, 1), eagle_shape(2, 2, 1)]
    width = max(len(s) for s in shapes)
    parents = torch.full((3, width), -1, dtype=torch.int64)
    tokens = torch.full((3, width), -1, dtype=torch.int64)
    for b, shape in enumerate(shapes):
        parents[b, : len(shape)] = torch.tensor(shape)
        tokens[b, : len(shape)] = torch.arange(len(shape)) % 3
    return tokens, parents


def test_sglang_layout_round_trip():
    tokens, parents = _batch()
    candidates, retrive_index, next_token, next_sibling = tree_layouts.to_sglang_layout(tokens, parents)
    # row 0: root's first child is linked node 1, whose next sibling is node 2; node 1's first child is node 3
    assert next_token[0, 0] == 1 and next_sibling[0, 1] == 2 and next_token[0, 1] == 3 and next_sibling[0, 3] == 4
    assert retrive_index[1, 0] == tokens.shape[1] + 1
    back_tokens, back_parents = tree_layouts.from_sglang_layout(candidates, next_token, next_sibling)
    assert torch.equal(back_tokens, tokens) and torch.equal(back_parents, parents)


def test_eagle_layout_round_trip():
    tokens, parents = _batch()
    mask, positions = tree_layouts.to_eagle_layout(tokens, parents)
    assert positions[0].tolist() == [0, 0, 1, 1, 1]
    assert mask[0, 4].tolist() == [False, True, False, False, True]  # node 4 sees its parent 1 and itself
    assert torch.equal(tree_layouts.from_eagle_layout(mask, positions), parents)


def test_adapters_are_exact():
    chain = random_markov_chain(3, 1, seed=7, closeness=0.0)
    for shape in [(-1, -1), (-1, 0, 0)]:
        assert tree_exact.exact_tree_step_tv(tree_layouts.sglang_style_verify_tree, chain, shape,
                                             "deterministic") < 1e-12
        for scheme in ("independent", "without_replacement", "deterministic"):
            assert tree_exact.exact_tree_step_tv(tree_layouts.eagle_style_verify_tree, chain, shape, scheme) < 1e-12


def test_sglang_thresholds_below_one_are_lossy():
    tokens, parents = torch.tensor([[0, 1]]), torch.tensor([[-1, -1]])
    candidates, retrive_index, next_token, next_sibling = tree_layouts.to_sglang_layout(tokens, parents)
    p = torch.tensor([[0.3, 0.3, 0.4]] * 3, dtype=torch.float64)
    coins = torch.tensor([[0.35, 0.0, 0.0]])
    exact_rule = tree_layouts.sglang_target_only_sample(candidates, retrive_index, next_token, next_sibling, p, coins,
                                                        torch.tensor([0.5]))
    relaxed = tree_layouts.sglang_target_only_sample(candidates, retrive_index, next_token, next_sibling, p, coins,
                                                     torch.tensor([0.5]), threshold_acc=0.5)
    assert exact_rule[1].tolist() == [1] and exact_rule[0][0, 1] == 2  # u in [0.3, 0.6): the second child
    assert relaxed[0][0, 1] == 1  # 0.35 < 0.3 / 0.5: the first child, over-accepted
