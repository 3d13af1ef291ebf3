"""Tree rules (specverify.core.tree_rules): hand-computed cases, exact laws, validation errors."""

from __future__ import annotations

import pytest
import torch

from specverify.core import exact, tree_exact, tree_rules
from specverify.core.chains import PositionalChain, random_markov_chain


def _star_case():
    """Two independent siblings of the root, both token 0: p = [0.5, 0.5], q = [0.9, 0.1]."""
    p = torch.tensor([[[0.5, 0.5], [0.2, 0.8], [0.6, 0.4]]], dtype=torch.float64)
    q = torch.tensor([[[0.9, 0.1], [0.9, 0.1]]], dtype=torch.float64)
    return p, q, torch.tensor([[0, 0]]), torch.tensor([[-1, -1]])


def test_first_sibling_accepted_then_bonus_from_its_row():
    p, q, x, parents = _star_case()
    # u_0 q(0) = 0.45 < 0.5: node 0 accepted; it is a leaf, so the bonus comes from p[1] = [0.2, 0.8]
    result = tree_rules.tree_rejection_sample(p, q, x, parents, uniforms=torch.tensor([[0.5, 0.0, 0.1]]))
    assert result.emitted.tolist() == [[0, 0, -1]]
    assert result.last_node.tolist() == [0] and result.num_accepted.tolist() == [1]
    result = tree_rules.tree_rejection_sample(p, q, x, parents, uniforms=torch.tensor([[0.5, 0.0, 0.3]]))
    assert result.emitted.tolist() == [[0, 1, -1]]


def test_rejected_sibling_updates_the_residual_for_the_next():
    p, q, x, parents = _star_case()
    # u_0 q(0) = 0.54 >= 0.5: rejected; residual (p - q)+ = [0, 0.4] gives token 0 mass 0, so the
    # duplicate sibling is rejected whatever u_1, and the final token is 1.
    result = tree_rules.tree_rejection_sample(p, q, x, parents, uniforms=torch.tensor([[0.6, 0.0, 0.0]]))
    assert result.emitted.tolist() == [[1, -1, -1]]
    assert result.last_node.tolist() == [-1]
    # the lossy unchanged-p rule accepts the second copy at u_1 = 0 (tested against p = [0.5, 0.5])
    lossy = tree_rules.unchanged_target_tree_verify(p, q, x, parents, uniforms=torch.tensor([[0.6, 0.0, 0.0]]))
    assert lossy.emitted.tolist() == [[0, 0, -1]] and lossy.last_node.tolist() == [1]


def test_second_sibling_tested_against_the_residual():
    # p = [0.3, 0.3, 0.4], q = [0.6, 0.1, 0.3]: child 0 (token 0) rejected -> r = (p - q)+ = [0, 0.2, 0.1] / 0.3
    p = torch.tensor([[[0.3, 0.3, 0.4], [1, 0, 0], [0, 0, 1.0]]], dtype=torch.float64)
    q = torch.tensor([[[0.6, 0.1, 0.3], [0.6, 0.1, 0.3]]], dtype=torch.float64)
    x, parents = torch.tensor([[0, 2]]), torch.tensor([[-1, -1]])
    # node 1 (token 2): r(2) = 1/3, accept iff u q(2) = 0.3 u < 1/3 -> always; its bonus row is [0, 0, 1]
    out = tree_rules.tree_rejection_sample(p, q, x, parents, uniforms=torch.tensor([[0.99, 0.99, 0.5]]))
    assert out.emitted.tolist() == [[2, 2, -1]]


def test_exact_law_of_the_star_case_by_hand():
    # one level, two independent siblings; exact one-step law of the first token must be p
    chain = PositionalChain([[0.5, 0.5], [0.2, 0.8]], [[0.9, 0.1]])
    law = tree_exact.ideal_tree_step_distribution(chain, (-1, -1), "independent")
    first = {t: sum(v for e, v in law.items() if e[0] == t) for t in (0, 1)}
    assert first[0] == pytest.approx(0.5) and first[1] == pytest.approx(0.5)
    # P(accept some sibling) = 0.9·5/9 + (0.9·4/9)·0 + 0.1·1 + 0.9·4/9 ... computed: tree (0,0): 5/9;
    # (0,1): 5/9 + 4/9 (token 1 accepted from residual [0,1]); (1,·): 1.  weights .81, .09, .1
    accepted = sum(v for e, v in law.items() if len(e) == 2)
    assert accepted == pytest.approx(0.81 * 5 / 9 + 0.09 * 1.0 + 0.1 * 1.0)
    assert tree_exact.exact_tree_step_tv(tree_rules.verify_tree, chain, (-1, -1), "independent") < 1e-12


def test_deterministic_children_equal_target_sampling():
    chain = random_markov_chain(3, 1, seed=1)
    for shape in [(-1, -1), (-1, -1, 0, 0)]:
        assert tree_exact.exact_tree_step_tv(tree_rules.point_mass_verify_tree, chain, shape, "deterministic") < 1e-12


def test_greedy_tree_follows_the_argmax_through_branches():
    p = torch.tensor([[[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]]], dtype=torch.float64)
    # root children: node 0 (token 0), node 1 (token 1: the argmax); node 2 child of node 1 (token 1 = argmax of p[2])
    result = tree_rules.greedy_tree_verify(p, torch.tensor([[0, 1, 1]]), torch.tensor([[-1, -1, 1]]))
    assert result.emitted.tolist() == [[1, 1, 0, -1]]  # path 1 -> 1, then argmax of p[3] = 0
    assert result.last_node.tolist() == [2]


def test_ragged_batch_rows_are_independent():
    chain = random_markov_chain(3, 1, seed=2)
    shapes = [(-1, 0, 0, 1), (-1, -1)]
    rows = [tree_exact.enumerate_trees(chain, s, "independent")[3] for s in shapes]
    n = 4
    target = torch.full((2, n + 1, 3), 1 / 3, dtype=torch.float64)
    draft = torch.zeros(2, n, 3, dtype=torch.float64)
    tokens = torch.full((2, n), -1)
    parents = torch.full((2, n), -1)
    for b, (shape, tree) in enumerate(zip(shapes, rows)):
        k = len(shape)
        target[b, : k + 1] = torch.from_numpy(tree.target)
        draft[b, :k] = torch.from_numpy(tree.draft)
        tokens[b, :k] = torch.tensor(tree.tokens)
        parents[b, :k] = torch.tensor(shape)
    u = torch.rand(2, n + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    both = tree_rules.tree_rejection_sample(target, draft, tokens, parents, uniforms=u).emitted
    second = tree_rules.tree_rejection_sample(target[1:, :3], draft[1:, :2], tokens[1:, :2], parents[1:, :2],
                                              uniforms=torch.cat([u[1:, :2], u[1:, -1:]], dim=1)).emitted
    assert both[1, :3].tolist() == second[0].tolist() and both[1, 3:].tolist() == [-1, -1]


def test_generator_draws_exactly_the_documented_uniforms():
    p, q, x, parents = _star_case()
    p, q, x, parents = (t.expand(64, *t.shape[1:]).contiguous() for t in (p, q, x, parents))
    u = torch.rand(64, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    by_generator = tree_rules.verify_tree(p, q, x, parents, torch.Generator().manual_seed(5))
    assert torch.equal(by_generator, tree_rules.verify_tree(p, q, x, parents, uniforms=u))


def test_lossy_rules_are_lossy():
    chain = random_markov_chain(3, 1, seed=3)
    for rule in (tree_rules.typical_verify_tree, tree_rules.unchanged_target_verify_tree,
                 tree_rules.thresholded_verify_tree, tree_rules.greedy_verify_tree):
        assert tree_exact.exact_tree_step_tv(rule, chain, (-1, -1), "independent") > 0.01, rule.__name__


def test_expected_accepted_length_grows_with_the_tree():
    chain = random_markov_chain(3, 1, seed=4)
    one = tree_exact.expected_tree_accepted_length(chain, (-1,), "independent")
    assert one == pytest.approx(exact.acceptance_probability(chain.target(()), chain.draft(())))
    assert tree_exact.expected_tree_accepted_length(chain, (-1, -1), "independent") > one
    at_least = tree_exact.acceptance_by_depth(chain, (-1, 0), "independent")
    assert at_least[0] >= at_least[1] > 0


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _valid():
    p = torch.full((1, 4, 3), 1 / 3, dtype=torch.float64)
    q = torch.full((1, 3, 3), 1 / 3, dtype=torch.float64)
    return p, q, torch.tensor([[0, 1, 2]]), torch.tensor([[-1, 0, 0]])


@pytest.mark.parametrize("change, match", [
    (dict(parents=torch.tensor([[-1, 2, 0]])), r"parents: a node's parent must be an earlier node"),
    (dict(parents=torch.tensor([[-1, 1, 0]])), r"parents: the parent pointers form a cycle"),
    (dict(parents=torch.tensor([[-1, 2, 1]])), r"parents: the parent pointers form a cycle"),
    (dict(parents=torch.tensor([[-1, 0, 5]])), r"parents: entries must be -1 or a node index"),
    (dict(tree_tokens=torch.tensor([[0, -1, 2]]), parents=torch.tensor([[-1, -1, 0]])), r"absent node "
     r"\(-1\) comes before"),
    (dict(tree_tokens=torch.tensor([[0, 1, -1]]), parents=torch.tensor([[-1, 0, 0]])), r"absent node .* "
     r"must have parent -1"),
    (dict(tree_tokens=torch.tensor([[0, 3, 2]])), r"tree_tokens: token ids must be -1"),
    (dict(tree_tokens=torch.tensor([[0, -2, 2]])), r"tree_tokens: token ids must be -1"),
    (dict(tree_tokens=torch.tensor([[0, 1]]), parents=torch.tensor([[-1, 0]])),
     r"tree_tokens: expected shape \[B, N\]"),
    (dict(parents=torch.tensor([[-1, 0, 0]], dtype=torch.int32)), r"parents: expected dtype torch.int64"),
    (dict(draft_probs=torch.full((1, 2, 3), 1 / 3, dtype=torch.float64)), r"draft_probs: expected shape \[B, N, V\]"),
    (dict(target_probs=torch.full((1, 4, 3), 0.5, dtype=torch.float64)), r"target_probs: a row does not sum to 1"),
    (dict(draft_probs=torch.tensor([[[1 / 3] * 3, [1.0, 0, 0], [1 / 3] * 3]], dtype=torch.float64)),
     r"draft_probs: a node's token has draft probability 0"),
    (dict(uniforms=torch.rand(1, 3, dtype=torch.float64)), r"uniforms: expected shape \[B, N\+1\]"),
    (dict(uniforms=torch.ones(1, 4, dtype=torch.float64)), r"uniforms: values must be finite"),
])
def test_invalid_inputs_name_the_argument(change, match):
    p, q, x, parents = _valid()
    arguments = dict(target_probs=p, draft_probs=q, tree_tokens=x, parents=parents,
                     uniforms=torch.zeros(1, 4, dtype=torch.float64))
    arguments.update(change)
    with pytest.raises(ValueError, match=match):
        tree_rules.tree_rejection_sample(arguments["target_probs"], arguments["draft_probs"], arguments["tree_tokens"],
                                         arguments["parents"], uniforms=arguments["uniforms"])


def test_a_present_node_under_an_absent_parent_is_rejected_by_the_prefix_rule():
    p, q, _, _ = _valid()
    with pytest.raises(ValueError, match="absent node"):
        tree_rules.verify_tree(p, q, torch.tensor([[0, -1, 1]]), torch.tensor([[-1, -1, 1]]),
                               uniforms=torch.zeros(1, 4))


def test_generator_and_uniforms_are_exclusive():
    p, q, x, parents = _valid()
    with pytest.raises(ValueError, match="generator/uniforms"):
        tree_rules.verify_tree(p, q, x, parents)


def test_thresholds_must_lie_in_zero_one():
    p, q, x, parents = _valid()
    with pytest.raises(ValueError, match="threshold_acc"):
        tree_rules.thresholded_tree_verify(p, q, x, parents, uniforms=torch.zeros(1, 4), threshold_acc=1.5)


def test_tree_speedup_model_reduces_to_leviathan_for_a_chain():
    from specverify.core import speedup, tree_speedup

    assert tree_speedup.tree_tokens_per_pass((-1, 0, 1, 2), [0.7]) == pytest.approx(
        speedup.expected_tokens_per_pass(0.7, 4))
    # two root children with rates [0.5, 0.4]: 1 + 0.5 + 0.5 * 0.4
    assert tree_speedup.tree_tokens_per_pass((-1, -1), [0.5, 0.4]) == pytest.approx(1.7)
    estimate = tree_speedup.tree_speedup((-1, -1, 0, 0), [0.5], draft_cost=0.1, verify_cost=0.01)
    assert estimate.pass_cost == pytest.approx(2 * 0.1 + 1 + 4 * 0.01) and estimate.depth == 2


def test_deterministic_rates_match_the_exact_expectation():
    from specverify.core import tree_speedup

    chain = random_markov_chain(3, 0, seed=6)
    p = chain.target(())
    order = sorted(range(3), key=lambda t: (-chain.draft(())[t], t))
    rates = [p[order[0]], p[order[1]] / (1 - p[order[0]])]
    exact_tokens = tree_exact.expected_tree_accepted_length(chain, (-1, -1), "deterministic") + 1
    assert tree_speedup.tree_tokens_per_pass((-1, -1), rates) == pytest.approx(exact_tokens)
