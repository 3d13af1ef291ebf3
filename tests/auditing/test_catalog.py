"""Tests of specverify.auditing.sampler.catalog: every entry is well formed, and every bug is real.

"Real" is shown three ways, all exact (no sampling):
- hand examples with injected uniforms where the entry emits something the reference does not
  (often a token the target forbids), with the outputs worked out by hand below;
- the exact one-step law (``specverify.core.exact.exact_step_tv``) differs from the target's law, on a
  V=4, K=2 example chosen so that every bug class has something to act on, while the reference
  rule has TV 0 on it (the control);
- the two random-state entries, which ignore the uniforms, by reproducibility checks on seeded
  generators.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.auditing.loading import load_target
from specverify.auditing.sampler.catalog import CATALOG, COARSE_UNIFORM_STEP, BuggyRule
from specverify.core.chains import PositionalChain
from specverify.core.rules import verify
from specverify.testing.strategies import verify_inputs

F64 = torch.float64
BUG_CLASSES = {"acceptance", "residual", "bonus", "indexing", "randomness", "batching", "processing", "lossy-by-design",
               "vocabulary", "precision", "draft-length", "layout", "dtype"}
INTEGRABLE = [name for name, entry in CATALOG.items() if entry.integrable]
TOY_SHAPED = [name for name in INTEGRABLE if CATALOG[name].shows_at(vocab_size=4, num_draft=2, batch_size=1)]
"""Integrable entries whose bug shows on the V = 4, K = 2, one-row hand example; the production-shape
entries are tested in tests/auditing/test_audit.py (PRODUCTION_SHAPED)."""
STATISTICAL_ONLY = [name for name, entry in CATALOG.items() if not entry.integrable]

# The hand example: V = 4, K = 2.  Ratios p_0/q_0 = (0, 0.5, 4, 4), p_1/q_1 = (0.25, 2/3, 1.5, 4);
# residuals (p_0 - q_0)+ = (0, 0, .3, .3) and (p_1 - q_1)+ = (0, 0, .1, .3); the bonus p_2 is
# uniform.  Token 0 has p_0(0) = 0 < q_0(0): accepting or emitting it first is impossible.
P = [[0.0, 0.2, 0.4, 0.4], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]]
Q = [[0.4, 0.4, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1]]


def one_row(drafts, uniforms):
    """``(target_probs, draft_probs, draft_tokens, uniforms)`` of the hand example, B = 1."""
    return (
        torch.tensor([P], dtype=F64),
        torch.tensor([Q], dtype=F64),
        torch.tensor([drafts], dtype=torch.int64),
        torch.tensor([uniforms], dtype=F64),
    )


def emitted_tokens(row: torch.Tensor) -> list[int]:
    return [int(t) for t in row if t >= 0]


# ------------------------------------------------------------------------------------------------
# Structure
# ------------------------------------------------------------------------------------------------


def test_catalog_has_at_least_twelve_well_formed_entries():
    assert len(CATALOG) >= 12
    for name, entry in CATALOG.items():
        assert isinstance(entry, BuggyRule) and entry.name == name
        assert entry.bug_class in BUG_CLASSES
        assert len(entry.description) > 60 and entry.modelled_on and callable(entry.fn)
        assert entry.min_batch_size >= 1
    assert {"lossy-by-design", "randomness", "residual", "bonus", "batching"} <= {e.bug_class for e in CATALOG.values()}


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_entries_load_through_the_catalog_prefix(name):
    assert load_target(f"catalog:{name}") is CATALOG[name].fn


@settings(max_examples=15)
@given(verify_inputs(batch_size=st.integers(1, 4), num_draft=st.integers(1, 3), vocab_size=st.integers(2, 6)))
def test_every_entry_emits_int64_drafts_then_one_token_then_padding(inputs):
    target_probs, draft_probs, draft_tokens, _ = inputs
    batch, positions, size = target_probs.shape
    for name, entry in CATALOG.items():
        emitted = entry.fn(target_probs, draft_probs, draft_tokens, torch.Generator().manual_seed(0))
        assert emitted.dtype == torch.int64 and emitted.shape == (batch, positions), name
        present = emitted >= 0
        count = present.sum(-1)
        assert torch.all(count >= 1), name
        assert torch.all(present == (torch.arange(positions) < count[:, None])), name  # tokens, then -1 only
        assert torch.all(emitted[present] < size), name
        for row in range(batch):
            accepted = int(count[row]) - 1
            assert torch.equal(emitted[row, :accepted], draft_tokens[row, :accepted]), name


@pytest.mark.parametrize("name", INTEGRABLE)
def test_integrable_entries_draw_exactly_the_convention_uniforms_from_a_generator(name):
    generator_inputs = torch.Generator().manual_seed(11)
    target_probs = torch.rand(5, 4, 6, generator=generator_inputs, dtype=F64).softmax(-1)
    draft_probs = torch.rand(5, 3, 6, generator=generator_inputs, dtype=F64).softmax(-1)
    draft_tokens = torch.multinomial(draft_probs.reshape(-1, 6), 1, generator=generator_inputs).reshape(5, 3)
    with_generator = CATALOG[name].fn(target_probs, draft_probs, draft_tokens, torch.Generator().manual_seed(3))
    uniforms = torch.rand(5, 4, generator=torch.Generator().manual_seed(3), dtype=F64)
    with_uniforms = CATALOG[name].fn(target_probs, draft_probs, draft_tokens, uniforms=uniforms)
    assert torch.equal(with_generator, with_uniforms)


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_entries_reject_malformed_inputs(name):
    target_probs, draft_probs, draft_tokens, uniforms = one_row([1, 3], [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="uniforms"):
        CATALOG[name].fn(target_probs, draft_probs, draft_tokens, uniforms=uniforms[:, :2])
    with pytest.raises(ValueError, match="draft_tokens"):
        CATALOG[name].fn(target_probs, draft_probs, torch.tensor([[9, 0]]), uniforms=uniforms)
    with pytest.raises(ValueError, match="target_probs"):
        CATALOG[name].fn(target_probs * 2, draft_probs, draft_tokens, uniforms=uniforms)


# ------------------------------------------------------------------------------------------------
# Hand examples with injected uniforms (outputs derived by hand from P, Q above)
# ------------------------------------------------------------------------------------------------

HAND_EXAMPLES = [
    # name, drafts, uniforms (u_0, u_1, u_K), reference output, buggy output, why
    ("zero_uniform_accepts", [0, 3], [0.001, 0.5, 0.1], [2], [0, 3, 0],
     "u_0 rounds down to 0 and 0 * q <= p = 0 accepts token 0, which p_0 forbids"),
    ("residual_is_target", [0, 3], [0.5, 0.5, 0.1], [2], [1],
     "correction from p_0 = (0, .2, .4, .4) gives token 1 although its residual is 0"),
    ("residual_softmax", [0, 3], [0.5, 0.5, 0.1], [2], [0],
     "softmax((0, 0, .3, .3)) puts mass 0.21 on token 0, which p_0 forbids"),
    ("residual_absolute", [0, 3], [0.5, 0.5, 0.1], [2], [0],
     "|p_0 - q_0| = (.4, .2, .3, .3) puts mass 1/3 on token 0, which p_0 forbids"),
    ("bonus_from_draft", [2, 3], [0.5, 0.5, 0.5], [2, 3, 2], [2, 3, 1],
     "bonus from q_1 (cumsum .4, .7, ...) instead of the uniform p_2"),
    ("bonus_from_previous_position", [2, 3], [0.5, 0.5, 0.2], [2, 3, 0], [2, 3, 1],
     "bonus from p_1 (cumsum .1, .3, ...) instead of the uniform p_2"),
    ("target_off_by_one", [0, 3], [0.2, 0.5, 0.1], [2], [0, 3, 0],
     "token 0 tested against p_1(0)/q_0(0) = 0.25 > u_0 and accepted, although p_0(0) = 0"),
    ("inverted_ratio", [0, 3], [0.5, 0.5, 0.1], [2], [0, 2],
     "q_0(0)/p_0(0) = inf accepts token 0; then q_1(3)/p_1(3) = .25 rejects token 3"),
    ("correction_one_position_late", [1, 3], [0.9, 0.5, 0.4], [2], [3],
     "rejection at 0, but the correction comes from row 1 (0, 0, .1, .3)"),
    ("shared_accept_uniform", [1, 0], [0.2, 0.9, 0.1], [1, 2], [1, 0, 0],
     "u_1 is replaced by u_0 = 0.2 < p_1(0)/q_1(0) = 0.25, so token 0 is accepted at position 1"),
    ("correction_reuses_accept_uniform", [0, 3], [0.9, 0.5, 0.1], [2], [3],
     "the correction after rejecting at 0 uses u_0 = 0.9 instead of u_K = 0.1"),
    ("draft_temperature_in_acceptance", [1, 3], [0.47, 0.5, 0.1], [1, 3, 0], [2],
     "with q'_0(1) = 0.439 the ratio is 0.455 < u_0 = 0.47, so token 1 is rejected"),
    ("greedy_acceptance_when_sampling", [1, 3], [0.25, 0.5, 0.1], [1, 3, 0], [1],
     "token 1 is not argmax p_0 (token 2), so it is rejected and p_0 is sampled"),
    ("counts_every_passing_test", [1, 3], [0.9, 0.5, 0.1], [2], [1, 2],
     "token 1 fails its test but the later pass of token 3 counts, so token 1 is emitted"),
    ("typical_acceptance", [1, 3], [0.9, 0.5, 0.1], [2], [1, 3, 0],
     "p_0(1) = 0.2 > min(0.09, 0.3 exp(-H(p_0))) accepts token 1 whatever u_0 is"),
]


def test_hand_examples_cover_every_single_row_integrable_entry():
    assert set(TOY_SHAPED) == {example[0] for example in HAND_EXAMPLES}


@pytest.mark.parametrize(
    ("name", "drafts", "uniforms", "reference", "buggy", "why"), HAND_EXAMPLES, ids=[e[0] for e in HAND_EXAMPLES]
)
def test_hand_example_with_injected_uniforms(name, drafts, uniforms, reference, buggy, why):
    target_probs, draft_probs, draft_tokens, u = one_row(drafts, uniforms)
    assert emitted_tokens(verify(target_probs, draft_probs, draft_tokens, uniforms=u)[0]) == reference
    assert emitted_tokens(CATALOG[name].fn(target_probs, draft_probs, draft_tokens, uniforms=u)[0]) == buggy, why


def test_batch_rows_rolled_hand_example_uses_the_next_rows_target():
    # Row 1 equals row 0 except p_0 = (0, 0, 0, 1); row 0's correction then comes from
    # (p^1_0 - q^0_0)+ = (0, 0, 0, .9): token 3 instead of the reference's token 2.
    target_probs, draft_probs, draft_tokens, u = one_row([0, 3], [0.5, 0.5, 0.1])
    neighbour = target_probs.clone()
    neighbour[0, 0] = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=F64)
    batch = (torch.cat([target_probs, neighbour]), draft_probs.repeat(2, 1, 1), draft_tokens.repeat(2, 1))
    assert emitted_tokens(verify(*batch, uniforms=u.repeat(2, 1))[0]) == [2]
    assert emitted_tokens(CATALOG["batch_rows_rolled"].fn(*batch, uniforms=u.repeat(2, 1))[0]) == [3]
    single = CATALOG["batch_rows_rolled"].fn(target_probs, draft_probs, draft_tokens, uniforms=u)
    assert torch.equal(single, verify(target_probs, draft_probs, draft_tokens, uniforms=u))  # invisible at B = 1


def test_zero_uniform_acceptance_probability_of_an_impossible_token_is_exactly_one_256th():
    # The accept decision depends on u_0 only through floor(256 u_0), so the midpoints of the 256
    # cells give the exact acceptance probability of draft token 0 (p_0(0) = 0, q_0(0) = 0.4).
    cells = round(1 / COARSE_UNIFORM_STEP)
    u_0 = (torch.arange(cells, dtype=F64) + 0.5) / cells
    uniforms = torch.stack([u_0, torch.full_like(u_0, 0.5), torch.full_like(u_0, 0.5)], dim=1)
    target_probs, draft_probs, draft_tokens, _ = one_row([0, 3], [0.5, 0.5, 0.5])
    batch = (target_probs.expand(cells, -1, -1), draft_probs.expand(cells, -1, -1), draft_tokens.expand(cells, -1))
    buggy_first = CATALOG["zero_uniform_accepts"].fn(*batch, uniforms=uniforms)[:, 0]
    reference_first = verify(*batch, uniforms=uniforms)[:, 0]
    assert float((buggy_first == 0).double().mean()) == COARSE_UNIFORM_STEP
    assert not torch.any(reference_first == 0)


# ------------------------------------------------------------------------------------------------
# Exact one-step laws (specverify.core.exact)
# ------------------------------------------------------------------------------------------------

def positional_chain() -> PositionalChain:
    return PositionalChain(np.array(P), np.array(Q))


def with_companion_row(rule, companion_target: torch.Tensor):
    """``rule`` called with every row followed by a companion row (target ``companion_target``,
    same draft and uniforms), returning only the original rows: the law of a request that shares
    its batch with another one."""

    def paired(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
        targets = target_probs.repeat_interleave(2, dim=0)
        targets[1::2] = companion_target.to(targets.dtype)
        emitted = rule(
            targets,
            draft_probs.repeat_interleave(2, dim=0),
            draft_tokens.repeat_interleave(2, dim=0),
            generator,
            uniforms=uniforms.repeat_interleave(2, dim=0),
        )
        return emitted[0::2]

    return paired


def test_reference_rule_is_exactly_lossless_on_the_example():
    exact = pytest.importorskip("specverify.core.exact")
    assert exact.exact_step_tv(verify, positional_chain(), 2) < 1e-12


@pytest.mark.parametrize(
    "name",
    TOY_SHAPED,
)
def test_exact_one_step_law_differs_from_the_target(name):
    """Every integrable entry is exactly off the target law on the example.

    ``zero_uniform_accepts`` is off by 0.003125 here (its extra acceptance region is at most 2^-8
    wide in the uniform); all other entries by more than 0.01.
    """
    exact = pytest.importorskip("specverify.core.exact")
    tv = exact.exact_step_tv(CATALOG[name].fn, positional_chain(), 2)
    assert tv > (3e-3 if name == "zero_uniform_accepts" else 0.01)


def test_exact_law_of_a_row_next_to_a_different_request_shows_the_batch_bug():
    exact = pytest.importorskip("specverify.core.exact")
    companion = torch.tensor([[0.0, 0.0, 0.0, 1.0], P[1], P[2]], dtype=F64)
    chain = positional_chain()
    assert exact.exact_step_tv(with_companion_row(verify, companion), chain, 2) < 1e-12
    assert exact.exact_step_tv(CATALOG["batch_rows_rolled"].fn, chain, 2) < 1e-12  # B = 1 per request: hidden
    assert exact.exact_step_tv(with_companion_row(CATALOG["batch_rows_rolled"].fn, companion), chain, 2) > 0.01


# ------------------------------------------------------------------------------------------------
# Statistical-only entries: randomness that ignores the uniforms
# ------------------------------------------------------------------------------------------------


def random_batch(rows: int = 64):
    generator = torch.Generator().manual_seed(7)
    target_probs = torch.rand(rows, 4, 8, generator=generator, dtype=F64).softmax(-1)
    draft_probs = torch.rand(rows, 3, 8, generator=generator, dtype=F64).softmax(-1)
    draft_tokens = torch.multinomial(draft_probs.reshape(-1, 8), 1, generator=generator).reshape(rows, 3)
    return target_probs, draft_probs, draft_tokens


def test_statistical_only_entries_ignore_injected_uniforms():
    target_probs, draft_probs, draft_tokens = random_batch()
    low, high = torch.zeros(64, 4, dtype=F64), torch.full((64, 4), 0.999, dtype=F64)
    assert STATISTICAL_ONLY == ["global_torch_rng", "reseeded_every_call"]
    assert not torch.equal(
        verify(target_probs, draft_probs, draft_tokens, uniforms=low),
        verify(target_probs, draft_probs, draft_tokens, uniforms=high),
    )
    for name in STATISTICAL_ONLY:
        torch.manual_seed(0)
        with_low = CATALOG[name].fn(target_probs, draft_probs, draft_tokens, uniforms=low)
        torch.manual_seed(0)
        with_high = CATALOG[name].fn(target_probs, draft_probs, draft_tokens, uniforms=high)
        assert torch.equal(with_low, with_high), name


def test_global_torch_rng_is_not_reproducible_from_the_generator():
    target_probs, draft_probs, draft_tokens = random_batch()
    runs = {}
    for rule_name, rule in (("reference", verify), ("buggy", CATALOG["global_torch_rng"].fn)):
        outputs = []
        for global_seed in (1, 2):
            torch.manual_seed(global_seed)
            outputs.append(rule(target_probs, draft_probs, draft_tokens, torch.Generator().manual_seed(5)))
        runs[rule_name] = torch.equal(*outputs)
    assert runs == {"reference": True, "buggy": False}


def test_reseeded_every_call_repeats_itself_across_steps():
    # Two successive steps with independent generators must be able to differ (the reference
    # does, on a 64-row batch); the buggy rule emits the same tokens whatever generator it gets.
    target_probs, draft_probs, draft_tokens = random_batch()
    steps = {}
    for rule_name, rule in (("reference", verify), ("buggy", CATALOG["reseeded_every_call"].fn)):
        first = rule(target_probs, draft_probs, draft_tokens, torch.Generator().manual_seed(1))
        second = rule(target_probs, draft_probs, draft_tokens, torch.Generator().manual_seed(2))
        steps[rule_name] = torch.equal(first, second)
    assert steps == {"reference": False, "buggy": True}


def test_exact_integration_refuses_the_global_rng_entry():
    exact = pytest.importorskip("specverify.core.exact")
    with pytest.raises(ValueError, match="randomness other than"):
        exact.step_distribution(CATALOG["global_torch_rng"].fn, positional_chain(), 2)
