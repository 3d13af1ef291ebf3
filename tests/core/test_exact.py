"""Unit tests of specverify.core.exact.

The exact checks are exact: laws are compared to 1e-12 (float64 rounding of sums of at most a few
hundred thousand terms stays below 1e-14).  Each check is also shown to FAIL on a known-buggy rule
written here, with the loss equal to a value derived by hand or by an independent enumeration.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import time
from typing import NamedTuple

import numpy as np
import pytest
import torch

from specverify.core import exact
from specverify.core.chains import MarkovChain, PositionalChain, random_markov_chain, random_positional_chain
from specverify.core.seeding import derive_seed

EXACT = 1e-12

# --------------------------------------------------------------------------------------------
# A local rule that follows the uniform convention, with switchable bugs
# --------------------------------------------------------------------------------------------


class _Result(NamedTuple):
    emitted: torch.Tensor
    num_accepted: torch.Tensor


def _rule(
    target_probs,
    draft_probs,
    draft_tokens,
    generator=None,
    *,
    uniforms=None,
    accept_scale=1.0,
    residual="p-q",
    bonus="target",
):
    """Modified rejection sampling under the uniform convention of docs/ARCHITECTURE.md.

    Bugs: ``accept_scale`` multiplies the acceptance ratio; ``residual`` = ``"p"`` samples the
    correction from ``p_n``, ``"next"`` from ``(p_{n+1} - q_n)_+``; ``bonus = "draft"`` samples
    the bonus token from ``q_{K-1}``.
    """
    batch, positions, vocab_size = target_probs.shape
    num_draft = positions - 1
    if uniforms is None:
        uniforms = torch.rand(batch, positions, generator=generator, dtype=torch.float64)
    rows = torch.arange(batch)
    p_at = target_probs[:, :num_draft].gather(2, draft_tokens[:, :, None])[:, :, 0]
    q_at = draft_probs.gather(2, draft_tokens[:, :, None])[:, :, 0]
    accept = uniforms[:, :num_draft] * q_at < accept_scale * p_at
    num_accepted = torch.cumprod(accept.to(torch.int64), dim=1).sum(dim=1)
    padded_q = torch.cat([draft_probs, torch.zeros(batch, 1, vocab_size, dtype=draft_probs.dtype)], dim=1)
    p_n, q_n = target_probs[rows, num_accepted], padded_q[rows, num_accepted]
    if residual == "p-q":
        weights = (p_n - q_n).clamp(min=0)
    elif residual == "p":
        weights = p_n
    else:  # "next"
        weights = (target_probs[rows, (num_accepted + 1).clamp(max=num_draft)] - q_n).clamp(min=0)
    final_law = p_n if bonus == "target" else draft_probs[:, -1]
    weights = torch.where((num_accepted == num_draft)[:, None], final_law, weights)
    cumulative = weights.cumsum(dim=1)
    token = (cumulative <= uniforms[:, -1:] * cumulative[:, -1:]).sum(dim=1).clamp(max=vocab_size - 1)
    emitted = torch.full((batch, positions), -1, dtype=torch.int64)
    emitted[:, :num_draft] = torch.where(torch.arange(num_draft) < num_accepted[:, None], draft_tokens, -1)
    emitted[rows, num_accepted] = token
    return _Result(emitted, num_accepted)


def _reference(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
    return _rule(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms).emitted


def _enumerated_law(chain, num_draft, accept_prob, correction_law) -> dict:
    """Independent law of rules whose acceptances are independent given the draft path:
    draft ``i`` passes with ``accept_prob(p, q, path, i)`` and the final token follows
    ``correction_law(p, q, path, n)`` (unnormalised) after ``n`` acceptances; enumerated over all
    full draft paths with probability ``Π q_i(x_i)``."""
    law: dict = {}
    for path in itertools.product(range(chain.vocab_size), repeat=num_draft):
        p = [chain.target(path[:i]) for i in range(num_draft + 1)]
        q = [chain.draft(path[:i]) for i in range(num_draft)]
        weight = math.prod(q[i][path[i]] for i in range(num_draft))
        for accepted in range(num_draft + 1):
            if weight == 0:
                break
            stop = 1.0 if accepted == num_draft else 1.0 - accept_prob(p, q, path, accepted)
            final = correction_law(p, q, path, accepted)
            for token in np.flatnonzero(final):
                key = path[:accepted] + (int(token),)
                law[key] = law.get(key, 0.0) + weight * stop * final[token] / final.sum()
            if accepted < num_draft:
                weight *= accept_prob(p, q, path, accepted)
    return law


def _ratio(p, q, path, i):
    return min(1.0, p[i][path[i]] / q[i][path[i]])


def _correct_correction(p, q, path, n):
    return p[n] if n == len(q) else np.maximum(p[n] - q[n], 0.0)


def _chain_cases():
    """Small chains over V 2..5, K 0..3, order 0..2, both kinds (ids readable in the test names)."""
    cases = []
    for vocab_size, num_draft, order, kind in itertools.product((2, 3, 5), (0, 1, 2, 3), (0, 1, 2),
                                                                ("mixture", "sparse")):
        if vocab_size**num_draft * vocab_size**order > 700:
            continue
        cases.append(pytest.param(vocab_size, num_draft, order, kind, id=f"V{vocab_size}-K{num_draft}-o{order}-{kind}"))
    return cases


def _markov(vocab_size, order, kind, *tag, closeness=0.5):
    return random_markov_chain(
        vocab_size, order, derive_seed("exact", vocab_size, order, kind, *tag), kind=kind, closeness=closeness
    )


# --------------------------------------------------------------------------------------------
# Acceptance rates and expected lengths
# --------------------------------------------------------------------------------------------


def test_acceptance_probability_is_one_minus_total_variation():
    p, q = np.array([0.2, 0.5, 0.3]), np.array([0.6, 0.1, 0.3])
    assert exact.acceptance_probability(p, q) == pytest.approx(0.2 + 0.1 + 0.3, abs=1e-15)
    as_dicts = ({(i,): v for i, v in enumerate(p)}, {(i,): v for i, v in enumerate(q)})
    assert exact.acceptance_probability(*as_dicts) == pytest.approx(1 - exact.total_variation(*as_dicts), abs=1e-15)
    with pytest.raises(ValueError, match="^q:"):
        exact.acceptance_probability(p, q[:2])


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.75, 0.999, 1.0])
@pytest.mark.parametrize("num_draft", [0, 1, 3, 7])
def test_expected_tokens_constant_alpha_matches_the_closed_form(alpha, num_draft):
    closed_form = num_draft + 1 if alpha == 1.0 else (1 - alpha ** (num_draft + 1)) / (1 - alpha)
    assert exact.expected_tokens_per_step([alpha] * num_draft) == pytest.approx(closed_form, rel=1e-12)
    assert exact.expected_tokens_constant_alpha(alpha, num_draft) == pytest.approx(closed_form, rel=1e-12)


def test_expected_accepted_length_with_position_dependent_rates():
    assert exact.expected_accepted_length([0.5, 0.4, 0.1]) == pytest.approx(0.5 + 0.2 + 0.02, abs=1e-15)
    assert exact.expected_accepted_length([]) == 0.0
    with pytest.raises(ValueError, match="^alphas:"):
        exact.expected_accepted_length([0.5, 1.2])


def test_acceptance_by_position_of_a_positional_chain_is_the_per_position_alpha():
    chain = random_positional_chain(4, 3, seed=derive_seed("alpha-positional"))
    rates = exact.exact_acceptance_by_position(chain, 3)
    alphas = [exact.acceptance_probability(chain.p[i], chain.q[i]) for i in range(3)]
    np.testing.assert_allclose(rates.conditional, alphas, rtol=0, atol=EXACT)
    np.testing.assert_allclose(rates.at_least, np.cumprod(alphas), rtol=0, atol=EXACT)
    no_drafts = exact.exact_acceptance_by_position(chain, 0)
    assert no_drafts.at_least.shape == (0,) and no_drafts.expected_tokens == 1.0


def test_acceptance_after_an_impossible_position_is_zero_not_nan():
    # p_0 and q_0 have disjoint supports: nothing is ever accepted, so position 1's conditional is 0.
    chain = PositionalChain(np.array([[1.0, 0.0], [0.5, 0.5], [0.5, 0.5]]), np.array([[0.0, 1.0], [0.5, 0.5]]))
    rates = exact.exact_acceptance_by_position(chain, 2)
    np.testing.assert_array_equal(rates.conditional, [0.0, 0.0])
    assert rates.expected_tokens == 1.0


@pytest.mark.parametrize("kind", ["mixture", "sparse"])
def test_expected_tokens_equal_the_mean_length_of_the_step_law(kind):
    chain = _markov(4, 2, kind, "mean-length")
    rates = exact.exact_acceptance_by_position(chain, 3)
    mean_length = exact.mean_emitted_length(exact.ideal_step_distribution(chain, 3))
    assert rates.expected_tokens == pytest.approx(mean_length, abs=EXACT)
    assert exact.expected_tokens_per_step(rates.conditional) == pytest.approx(mean_length, abs=EXACT)
    # Context dependence matters: the product of per-position averages is not the right answer.
    assert not np.allclose(rates.conditional, rates.conditional[0])


# --------------------------------------------------------------------------------------------
# Enumerated laws
# --------------------------------------------------------------------------------------------


def test_target_sequence_distribution_is_the_product_of_next_token_laws():
    chain = _markov(3, 2, "sparse", "target-law")
    law = exact.target_sequence_distribution(chain, 3, prefix=(1,))
    assert math.fsum(law.values()) == pytest.approx(1.0, abs=EXACT)
    for tokens, prob in law.items():
        expected = math.prod(chain.target((1,) + tokens[:t])[tokens[t]] for t in range(3))
        assert prob == pytest.approx(expected, abs=1e-15)
    assert exact.target_sequence_distribution(chain, 0) == {(): 1.0}


@pytest.mark.parametrize(("vocab_size", "num_draft", "order", "kind"), _chain_cases())
def test_ideal_step_completed_is_the_target_law(vocab_size, num_draft, order, kind):
    for closeness in (0.0, 0.7):
        chain = _markov(vocab_size, order, kind, num_draft, closeness=closeness)
        step = exact.ideal_step_distribution(chain, num_draft)
        assert math.fsum(step.values()) == pytest.approx(1.0, abs=EXACT)
        completed = exact.completed_step_distribution(step, chain, num_draft)
        target = exact.target_sequence_distribution(chain, num_draft + 1)
        assert exact.total_variation(completed, target) < EXACT


def test_ideal_step_equals_an_independent_enumeration():
    chain = _markov(3, 1, "sparse", "ideal-vs-enumeration")
    enumerated = _enumerated_law(chain, 2, _ratio, _correct_correction)
    assert exact.max_abs_difference(exact.ideal_step_distribution(chain, 2), enumerated) < EXACT


# --------------------------------------------------------------------------------------------
# Exact integration of rules
# --------------------------------------------------------------------------------------------

_INTEGRATION_CASES = [
    (2, 1, 0, "mixture"),
    (3, 2, 1, "mixture"),
    (3, 2, 1, "sparse"),
    (4, 1, 2, "sparse"),
    (4, 3, 0, "sparse"),
    (3, 3, 1, "mixture"),
    (5, 2, 1, "mixture"),
    (4, 0, 1, "mixture"),
]


@pytest.mark.parametrize(("vocab_size", "num_draft", "order", "kind"), _INTEGRATION_CASES)
def test_step_distribution_of_the_reference_rule_is_the_ideal_law(vocab_size, num_draft, order, kind):
    chain = _markov(vocab_size, order, kind, num_draft, "integration")
    integrated = exact.step_distribution(_reference, chain, num_draft)
    assert exact.max_abs_difference(integrated, exact.ideal_step_distribution(chain, num_draft)) < EXACT


def test_step_distribution_after_a_prefix_and_with_a_result_object():
    chain = _markov(3, 2, "mixture", "prefix")
    integrated = exact.step_distribution(_rule, chain, 2, prefix=(2, 0))
    assert exact.max_abs_difference(integrated, exact.ideal_step_distribution(chain, 2, prefix=(2, 0))) < EXACT


@pytest.mark.parametrize(("vocab_size", "num_draft", "order", "kind"), _INTEGRATION_CASES[:5])
def test_step_distribution_of_specverify_rules_is_the_ideal_law(vocab_size, num_draft, order, kind):
    from specverify.core import rules

    chain = _markov(vocab_size, order, kind, num_draft, "integration")
    ideal = exact.ideal_step_distribution(chain, num_draft)
    candidates = [rules.rejection_sample]
    if "uniforms" in inspect.signature(rules.verify).parameters:
        candidates.append(rules.verify)
    for rule in candidates:
        assert exact.max_abs_difference(exact.step_distribution(rule, chain, num_draft), ideal) < EXACT


# A tiny step by hand: V = 2, K = 1, p_0 = (0.2, 0.8), q_0 = (0.6, 0.4), p_1 = (0.5, 0.5).
# Draft 0 (prob 0.6) passes w.p. 1/3, draft 1 (prob 0.4) always: accepted mass 0.2 + 0.4, rejection 0.4,
# residual (p_0 - q_0)+ = (0, 0.4) -> token 1.
_TINY = PositionalChain(np.array([[0.2, 0.8], [0.5, 0.5]]), np.array([[0.6, 0.4]]))


def test_tiny_step_by_hand():
    expected = {(0, 0): 0.1, (0, 1): 0.1, (1, 0): 0.2, (1, 1): 0.2, (1,): 0.4}
    for law in (exact.ideal_step_distribution(_TINY, 1), exact.step_distribution(_reference, _TINY, 1)):
        assert exact.max_abs_difference(law, expected) < EXACT
    assert exact.exact_step_tv(_reference, _TINY, 1) < EXACT


def test_residual_from_p_loses_exactly_the_hand_computed_amount():
    # On rejection (mass 0.4) the bug samples from p_0 = (0.2, 0.8) instead of (0, 1):
    # TV = 0.4 * TV((0.2, 0.8), (0, 1)) = 0.08.
    buggy = functools.partial(_rule, residual="p")
    assert exact.exact_step_tv(buggy, _TINY, 1) == pytest.approx(0.08, abs=EXACT)


def test_bonus_from_the_draft_loses_exactly_the_hand_computed_amount():
    # After acceptance (mass 0.6) the bug samples the bonus from q_0 = (0.6, 0.4) instead of p_1 = (0.5, 0.5):
    # TV = 0.6 * 0.1 = 0.06.
    buggy = functools.partial(_rule, bonus="draft")
    assert exact.exact_step_tv(buggy, _TINY, 1) == pytest.approx(0.06, abs=EXACT)


def test_breakpoints_outside_the_candidates_are_located_exactly():
    chain = _markov(3, 1, "mixture", "refinement")
    scaled = functools.partial(_rule, accept_scale=0.37)
    expected = _enumerated_law(
        chain, 2, lambda p, q, path, i: min(1.0, 0.37 * p[i][path[i]] / q[i][path[i]]), _correct_correction
    )
    assert exact.max_abs_difference(exact.step_distribution(scaled, chain, 2), expected) < EXACT

    shifted = functools.partial(_rule, residual="next")

    def next_residual(p, q, path, n):
        return p[n] if n == len(q) else np.maximum(p[min(n + 1, len(q))] - q[n], 0.0)

    expected = _enumerated_law(chain, 2, _ratio, next_residual)
    assert exact.max_abs_difference(exact.step_distribution(shifted, chain, 2), expected) < EXACT


def test_one_uniform_shared_by_all_positions_is_integrated_exactly():
    # Bug: u_0 drives the acceptance and the final token.  For K = 1 the law is a 1-D overlap of
    # intervals: after draft x, acceptance is u < r = min(1, p_0(x)/q_0(x)), so the bonus token b
    # gets |[0, r) ∩ [B_{b-1}, B_b)| and the correction y gets |[r, 1) ∩ [C_{y-1}, C_y)|, where B and
    # C are the cumulative sums of p_1 and of the normalised residual.
    def shared(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
        first = uniforms[:, :1].expand_as(uniforms).contiguous()
        return _reference(target_probs, draft_probs, draft_tokens, uniforms=first)

    chain = random_positional_chain(3, 1, seed=derive_seed("shared-uniform"))
    p_0, p_1, q_0 = chain.p[0], chain.p[1], chain.q[0]

    def overlaps(start, stop, law):
        edges = np.concatenate([[0.0], np.cumsum(law) / law.sum()])
        return np.clip(np.minimum(edges[1:], stop) - np.maximum(edges[:-1], start), 0.0, None)

    expected: dict = {}
    for x in range(3):
        ratio = min(1.0, p_0[x] / q_0[x])
        for b, mass in enumerate(overlaps(0.0, ratio, p_1)):
            expected[(x, b)] = q_0[x] * mass
        for y, mass in enumerate(overlaps(ratio, 1.0, np.maximum(p_0 - q_0, 0.0))):
            expected[(y,)] = expected.get((y,), 0.0) + q_0[x] * mass
    integrated = exact.step_distribution(shared, chain, 1)
    assert exact.max_abs_difference(integrated, expected) < EXACT
    assert exact.exact_step_tv(shared, chain, 1) > 1e-3


def test_grid_edges_and_points_stay_inside_the_unit_interval():
    # Edges from ratios that overflow, underflow, are NaN, or sit within rounding of 0 and 1.
    raw = np.array([np.nan, -np.inf, -0.0, 1e-17, 0.3, 0.3 + 1e-15, 1.0 - 1e-12, 1.0 - 1e-17, 1.0, 1.5, np.inf])
    edges = exact._merge_edges(raw)
    assert edges[0] == 0.0 and edges[-1] == 1.0
    assert np.all(np.diff(edges) >= exact.MIN_CELL_WIDTH)
    # The narrowest legal top cell [1 - MIN_CELL_WIDTH, 1): a scan fraction 1 - 8**-7 rounds
    # low + width * f to exactly 1.0 without the clamp.
    top = np.array([0.0, 1.0 - exact.MIN_CELL_WIDTH, 1.0])
    grid = exact._build_grid([[edges, top]], np.array([0]))
    fractions = np.concatenate([[0.0], exact.SCAN_FRACTIONS, [np.nextafter(1.0, 0.0)]])
    for fraction in fractions:
        points = grid.points(np.full(grid.low.shape, fraction))
        assert np.all(points >= grid.low) and np.all(points < grid.high), fraction
        assert np.all(points >= 0.0) and np.all(points < 1.0), fraction


@pytest.mark.parametrize(
    "rule, chain",
    [
        (
            _reference,
            PositionalChain(
                [[1.0, 0.0], [0.9415530584364511, 0.05844694156354893], [0.09152243225885004, 0.90847756774115],
                 [0.5022159443300198, 0.49778405566998013]],
                [[0.30077500873018825, 0.6992249912698119], [0.9415530584364611, 0.05844694156353893],
                 [0.09152243225885004, 0.90847756774115]],
            ),
        ),
        (
            None,  # the point-mass rule
            PositionalChain(
                [[0.0, 0.4139739726860432, 0.5860260273139569],
                 [1.4022777344283394e-13, 0.999999999999, 8.59772226557166e-13]],
                [[0.0, 0.0, 1.0]],
            ),
        ),
    ],
    ids=["narrow-top-cell", "bonus-masses-near-1e-13"],
)
def test_every_uniform_handed_to_the_rule_lies_in_the_unit_interval(rule, chain):
    # Hypothesis 6.170.17's two failing examples on a fresh machine: cells ~1e-13 wide just below 1.
    from specverify.core import rules

    rule = rules.point_mass_as_verify if rule is None else rule
    seen = []

    def recording(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
        seen.append(uniforms.numpy().copy())
        return rule(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms)

    law = exact.step_distribution(recording, chain, chain.num_draft)
    everything = np.concatenate(seen)
    assert everything.min() >= 0.0 and everything.max() < 1.0
    completed = exact.completed_step_distribution(law, chain, chain.num_draft)
    assert exact.max_abs_difference(completed, exact.target_sequence_distribution(chain, chain.num_draft + 1)) < 1e-9


def test_a_rule_that_ignores_the_uniforms_is_refused():
    def sampling_rule(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
        return _reference(target_probs, draft_probs, draft_tokens,
                          uniforms=torch.rand(uniforms.shape, dtype=torch.float64))

    with pytest.raises(ValueError, match="draws randomness other than the injected uniforms"):
        exact.step_distribution(sampling_rule, _markov(3, 1, "mixture", "ignores"), 2)


def test_a_rule_without_the_uniforms_keyword_is_refused():
    def plain(target_probs, draft_probs, draft_tokens, generator):
        return _reference(target_probs, draft_probs, draft_tokens, generator)

    with pytest.raises(ValueError, match="uniforms"):
        exact.step_distribution(plain, _TINY, 1)


def test_breakpoints_that_are_not_axis_aligned_raise():
    def mixing(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
        mixed = uniforms.clone()
        mixed[:, 0] = (uniforms[:, 0] + uniforms[:, 1]) % 1.0
        return _reference(target_probs, draft_probs, draft_tokens, uniforms=mixed)

    with pytest.raises(ValueError, match="cannot find"):
        exact.step_distribution(mixing, _TINY, 1)


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda e: e.fill_(-1), "no token"),
        (lambda e: e.index_fill_(1, torch.tensor([0]), -1), "no token"),
        (lambda e: e.add_(5), "outside|lie in"),
        (lambda e: e.float(), "integer"),
        (lambda e: e[:, :1], "shape"),
    ],
)
def test_malformed_output_raises(corrupt, message):
    def broken(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
        return corrupt(_reference(target_probs, draft_probs, draft_tokens, uniforms=uniforms))

    with pytest.raises(ValueError, match=message):
        exact.step_distribution(broken, _TINY, 1)


def test_step_distribution_runtime_for_v4_k3(capsys):
    chain = _markov(4, 1, "mixture", "runtime")
    start = time.perf_counter()
    law = exact.step_distribution(_reference, chain, 3)
    elapsed = time.perf_counter() - start
    with capsys.disabled():
        print(f"\nstep_distribution(V=4, K=3, order 1, local rule): {elapsed:.2f} s")
    assert exact.max_abs_difference(law, exact.ideal_step_distribution(chain, 3)) < EXACT
    assert elapsed < 10.0  # about 0.5 s alone on one core; generous for a shared machine


# --------------------------------------------------------------------------------------------
# Whole runs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [3, 4, 5])
@pytest.mark.parametrize(("vocab_size", "num_draft", "order", "kind"), [(3, 2, 1, "mixture"), (2, 3, 2, "sparse")])
def test_ideal_run_has_the_target_law(length, vocab_size, num_draft, order, kind):
    chain = _markov(vocab_size, order, kind, "run")
    run = exact.sequence_distribution(None, chain, num_draft, length)
    assert exact.total_variation(run, exact.target_sequence_distribution(chain, length)) < EXACT


def test_run_of_the_reference_rule_has_the_target_law_and_a_buggy_run_does_not():
    chain = _markov(3, 1, "sparse", "rule-run")
    target = exact.target_sequence_distribution(chain, 4)
    assert exact.total_variation(exact.sequence_distribution(_reference, chain, 2, 4), target) < EXACT
    buggy = functools.partial(_rule, residual="p")
    run_loss = exact.total_variation(exact.sequence_distribution(buggy, chain, 2, 4), target)
    assert run_loss >= exact.exact_step_tv(buggy, chain, 2) > 1e-3


def test_sequence_distribution_of_length_zero_and_one():
    chain = _markov(3, 1, "mixture", "short")
    assert exact.sequence_distribution(None, chain, 2, 0) == {(): 1.0}
    one = exact.sequence_distribution(None, chain, 2, 1)
    assert exact.max_abs_difference(one, exact.target_sequence_distribution(chain, 1)) < EXACT


def test_total_variation_and_max_abs_difference_use_the_union_of_keys():
    d1, d2 = {(0,): 0.5, (1,): 0.5}, {(1,): 0.25, (2,): 0.75}
    assert exact.total_variation(d1, d2) == pytest.approx(0.75)
    assert exact.max_abs_difference(d1, d2) == pytest.approx(0.75)
    assert exact.max_abs_difference({}, {}) == 0.0


def test_argument_validation():
    chain = MarkovChain(np.array([[0.5, 0.5]]), np.array([[1.0, 0.0]]), 0)
    with pytest.raises(ValueError, match="^num_draft:"):
        exact.ideal_step_distribution(chain, -1)
    with pytest.raises(ValueError, match="^length:"):
        exact.target_sequence_distribution(chain, -2)
    with pytest.raises(ValueError, match="^prefix:"):
        exact.step_distribution(_reference, chain, 1, prefix=(2,))
