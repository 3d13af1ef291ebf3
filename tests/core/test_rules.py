"""Unit tests of specverify.core.rules: exact where possible (injected uniforms, enumeration).

The exactness checks enumerate every draft path and every cell of the uniform grid (the rules'
output is piecewise constant in each uniform, with breakpoints at ``p/q`` and at the CDF edges of
the candidate final distributions), so they compute the law of a step with no sampling error.
A small local stand-in (``exact_step_law``) does the enumeration so that this file does not
depend on specverify.core.exact; every exact check is also shown to fail on buggy rules.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from specverify.core.rules import (
    VerifyResult,
    greedy_as_verify,
    greedy_verify,
    point_mass_as_verify,
    point_mass_verify,
    rejection_sample,
    row_sum_tolerance,
    typical_acceptance_as_verify,
    typical_acceptance_verify,
    validate_verify_inputs,
    verify,
)
from specverify.core.seeding import derive_seed

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
F64 = torch.float64


def t64(values, device="cpu"):
    return torch.tensor(values, dtype=F64, device=device)


def tokens(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int64, device=device)


def random_distributions(rng: np.random.Generator, shape, zero_fraction=0.0) -> np.ndarray:
    """Dirichlet-like rows with a fraction of exact zeros (each row keeps at least one mass)."""
    weights = rng.exponential(size=shape)
    if zero_fraction:
        weights[rng.random(shape) < zero_fraction] = 0.0
        empty = weights.sum(-1) == 0
        weights[empty, 0] = 1.0
    return weights / weights.sum(-1, keepdims=True)


# --------------------------------------------------------------------------------------------
# A plain loop implementation of the uniform convention (one row), with optional known bugs
# --------------------------------------------------------------------------------------------


def _inverse_cdf_row(weights: np.ndarray, u: float) -> int:
    cumulative = np.cumsum(weights)
    return int(np.argmax(cumulative > u * cumulative[-1]))


def loop_rejection_row(p, q, x, u, n, bug=None):
    """Row-by-row modified rejection sampling (Leviathan Algorithm 1) in float64 numpy.

    ``bug``: None (correct), "resample_from_p" (ignore the residual), "inverted_ratio" (accept
    with min(1, q/p)), "bonus_from_last_draft_position" (bonus drawn from p_{n-1}).
    """
    emitted = []
    for i in range(n):
        ratio_test = u[i] * p[i, x[i]] < q[i, x[i]] if bug == "inverted_ratio" else u[i] * q[i, x[i]] < p[i, x[i]]
        if not ratio_test:
            residual = np.maximum(p[i] - q[i], 0.0)
            if bug == "resample_from_p" or residual.sum() == 0:
                residual = p[i]
            return emitted + [_inverse_cdf_row(residual, u[-1])]
        emitted.append(int(x[i]))
    bonus_position = max(n - 1, 0) if bug == "bonus_from_last_draft_position" else n
    return emitted + [_inverse_cdf_row(p[bonus_position], u[-1])]


def loop_rule(bug=None):
    """SPEC §1 rule (with ``uniforms=``) built from :func:`loop_rejection_row`."""

    def rule(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
        p, q = target_probs.double().numpy(), draft_probs.double().numpy()
        x, u = draft_tokens.numpy(), uniforms.double().numpy()
        batch, positions = u.shape
        emitted = torch.full((batch, positions), -1, dtype=torch.int64)
        for b in range(batch):
            row = loop_rejection_row(p[b], q[b], x[b], u[b], positions - 1, bug)
            emitted[b, : len(row)] = torch.tensor(row)
        return emitted

    return rule


# --------------------------------------------------------------------------------------------
# Exact law of one step by enumeration over draft paths x uniform cells (stand-in for exact.py)
# --------------------------------------------------------------------------------------------


def _cdf_edges(weights: np.ndarray) -> list[float]:
    total = weights.sum()
    return [] if total <= 0 else list(np.cumsum(weights) / total)


def _uniform_breakpoints(p: np.ndarray, q: np.ndarray, path: tuple[int, ...]) -> list[np.ndarray]:
    """Candidate breakpoints of every uniform column for one draft path."""
    positions = p.shape[0]
    columns = []
    for i, x in enumerate(path):
        ratio = p[i, x] / q[i, x] if q[i, x] > 0 else 1.0
        inverse_ratio = q[i, x] / p[i, x] if p[i, x] > 0 else 1.0  # breakpoint of the inverted-ratio bug
        columns.append(np.unique(np.clip([0.0, ratio, inverse_ratio, p[i, x], 1.0], 0.0, 1.0)))
    final_edges = [0.0, 1.0]
    for n in range(positions):
        final_edges += _cdf_edges(p[n])
        if n < positions - 1:
            final_edges += _cdf_edges(np.maximum(p[n] - q[n], 0.0))
            zeroed = p[n].copy()
            zeroed[path[n]] = 0.0
            final_edges += _cdf_edges(zeroed)
    columns.append(np.unique(np.clip(final_edges, 0.0, 1.0)))
    return columns


def exact_step_law(rule, p: np.ndarray, q: np.ndarray) -> dict[tuple[int, ...], float]:
    """Exact law of the emitted tuple of ``rule`` for one row with target ``p [K+1, V]`` and draft
    ``q [K, V]`` (draft paths weighted by prod q).  Each cell is evaluated at two interior points
    (1/4 and 3/4 of the way through every interval): they must agree, which guards against a
    missing breakpoint."""
    positions, vocab = p.shape
    rows_p, rows_q, rows_x, rows_u, weights = [], [], [], [], []
    for path in itertools.product(range(vocab), repeat=positions - 1):
        path_probability = math.prod(q[i, x] for i, x in enumerate(path))
        if path_probability == 0:
            continue
        columns = _uniform_breakpoints(p, q, path)
        for cell in itertools.product(*(range(len(c) - 1) for c in columns)):
            lows = np.array([c[j] for c, j in zip(columns, cell)])
            highs = np.array([c[j + 1] for c, j in zip(columns, cell)])
            volume = float(np.prod(highs - lows))
            if volume <= 0:
                continue
            for fraction in (0.25, 0.75):
                rows_p.append(p)
                rows_q.append(q)
                rows_x.append(path)
                rows_u.append(lows + fraction * (highs - lows))
            weights.append(path_probability * volume)
    result = rule(
        torch.tensor(np.array(rows_p)), torch.tensor(np.array(rows_q)), torch.tensor(rows_x, dtype=torch.int64),
        None, uniforms=torch.tensor(np.array(rows_u)),
    )
    emitted = (result.emitted if isinstance(result, VerifyResult) else result).numpy()
    law: dict[tuple[int, ...], float] = {}
    for k, weight in enumerate(weights):
        first, second = emitted[2 * k], emitted[2 * k + 1]
        assert np.array_equal(first, second), "the rule is not constant on a cell: a breakpoint is missing"
        key = tuple(int(t) for t in first if t >= 0)
        law[key] = law.get(key, 0.0) + weight
    return law


def completed_total_variation(law: dict[tuple[int, ...], float], p: np.ndarray) -> float:
    """TV between the step law extended by target sampling to K+1 tokens and prod_i p_i."""
    positions, vocab = p.shape
    distance = 0.0
    for full in itertools.product(range(vocab), repeat=positions):
        target = math.prod(p[i, t] for i, t in enumerate(full))
        completed = sum(
            probability * math.prod(p[j, full[j]] for j in range(len(prefix), positions))
            for prefix, probability in law.items()
            if full[: len(prefix)] == prefix
        )
        distance += abs(completed - target)
    return distance / 2


def small_case(seed: int, positions: int = 3, vocab: int = 3, zero_fraction: float = 0.3):
    rng = np.random.default_rng(seed)
    p = random_distributions(rng, (positions, vocab), zero_fraction)
    q = random_distributions(rng, (positions - 1, vocab), zero_fraction)
    return p, q


# --------------------------------------------------------------------------------------------
# Hand-computed cases with injected uniforms
# --------------------------------------------------------------------------------------------

# K = 2, V = 3; dyadic values so that every boundary below is exact in floating point.
P_HAND = [[0.375, 0.25, 0.375], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]]
Q_HAND = [[0.25, 0.5, 0.25], [0.5, 0.25, 0.25]]
# draft 1 at position 0: p/q = 0.25/0.5 = 0.5;  residual (p0-q0)+ = [0.125, 0, 0.125]
# draft 0 at position 1: p/q = 0.25/0.5 = 0.5;  residual (p1-q1)+ = [0, 0.25, 0]
# bonus p2 = [0.25, 0.25, 0.5]: cumsum [0.25, 0.5, 1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "drafts, u, expected, accepted",
    [
        ([1, 0], [0.5, 0.0, 0.0], [0, -1, -1], 0),  # u*q = p exactly: rejected; residual -> token 0
        ([1, 0], [0.5, 0.0, 0.4999], [0, -1, -1], 0),
        ([1, 0], [0.5, 0.0, 0.5], [2, -1, -1], 0),  # u*S = 0.125 = cumsum[0] = cumsum[1]: skips zero-mass token 1
        ([1, 0], [0.4999, 0.4999, 0.0], [1, 0, 0], 2),  # both accepted, bonus from p2
        ([1, 0], [0.4999, 0.4999, 0.4999], [1, 0, 1], 2),
        ([1, 0], [0.4999, 0.4999, 0.5], [1, 0, 2], 2),  # u*S = cumsum[1] = 0.5 is not > 0.5
        ([1, 0], [0.4999, 0.5, 0.9999], [1, 1, -1], 1),  # rejected at 1: residual is a point mass at 1
        ([0, 1], [0.9999999, 0.9999999, 0.0], [0, 1, 0], 2),  # p >= q: accepted even for u -> 1
        ([2, 2], [0.9999999, 0.0, 0.75], [2, 2, 2], 2),  # p = q at position 1: accepted at u = 0
    ],
)
def test_rejection_sample_hand_cases(device, drafts, u, expected, accepted):
    result = rejection_sample(
        t64([P_HAND], device), t64([Q_HAND], device), tokens([drafts], device), uniforms=t64([u], device)
    )
    assert result.emitted.device.type == device
    assert result.emitted.dtype == torch.int64 and result.num_accepted.dtype == torch.int64
    assert result.emitted.tolist() == [expected]
    assert result.num_accepted.tolist() == [accepted]


def test_zero_target_mass_draft_is_never_accepted():
    p = t64([[[0.0, 1.0], [0.5, 0.5]]])
    q = t64([[[0.5, 0.5]]])
    result = rejection_sample(p, q, tokens([[0]]), uniforms=t64([[0.0, 0.0]]))
    assert result.emitted.tolist() == [[1, -1]]


def test_subnormal_residual_mass_is_still_sampled():
    """(p0 - q0)+ = [0, 0, 1e-322]: u_K * total rounds up to the (subnormal) total for u_K -> 1; the
    inverse CDF must still return token 2, the only token with mass, and not run off the end."""
    p = t64([[[0.5, 0.5 - 2.0**-54, 1e-322], [0.5, 0.5, 0.0]]])
    q = t64([[[0.5, 0.5, 0.0]]])
    largest_below_one = float(np.nextafter(1.0, 0))
    for u_final in (0.0, 0.5, largest_below_one):
        result = rejection_sample(p, q, tokens([[1]]), uniforms=t64([[largest_below_one, u_final]]))
        assert result.emitted.tolist() == [[2, -1]]


def test_residual_without_mass_falls_back_to_target_row():
    # p0 = q0 * (1 - 2^-29): a rejection is possible (u close to 1) but the float residual is 0.
    shrink = 1 - 2.0**-29
    p = t64([[[0.5 * shrink, 0.5 * shrink], [0.5, 0.5]]])
    q = t64([[[0.5, 0.5]]])
    for u_final, token in ((0.25, 0), (0.75, 1)):
        result = rejection_sample(p, q, tokens([[0]]), uniforms=t64([[1 - 2.0**-40, u_final]]))
        assert result.emitted.tolist() == [[token, -1]]


@pytest.mark.parametrize("device", DEVICES)
def test_ragged_rows(device):
    p = t64([P_HAND] * 3, device)
    q = t64([Q_HAND] * 3, device)
    drafts = tokens([[-1, -1], [1, -1], [1, 0]], device)  # padding beyond num_draft may be -1
    q[0] = 0.0  # padding positions of draft_probs are ignored too
    num_draft = tokens([0, 1, 2], device)
    u = t64([[0.0, 0.0, 0.3], [0.1, 0.0, 0.3], [0.1, 0.1, 0.6]], device)
    result = rejection_sample(p, q, drafts, uniforms=u, num_draft=num_draft)
    # row 0: bonus from p0 = [.375, .25, .375] at u=.3 -> 0; row 1: draft accepted, bonus from p1 at
    # u=.3 -> 1 (cumsum .25, .75); row 2: both accepted, bonus from p2 at u=.6 -> 2.
    assert result.emitted.tolist() == [[0, -1, -1], [1, 1, -1], [1, 0, 2]]
    assert result.num_accepted.tolist() == [0, 1, 2]


def test_ragged_rows_match_truncated_single_rows():
    rng = np.random.default_rng(derive_seed("ragged", 5, 4))
    batch, num_draft_tokens, vocab = 12, 4, 5
    p = torch.tensor(random_distributions(rng, (batch, num_draft_tokens + 1, vocab), 0.2))
    q = torch.tensor(random_distributions(rng, (batch, num_draft_tokens, vocab), 0.2))
    drafts = torch.tensor([[rng.choice(vocab,
                                       p=q[b, i].numpy()) for i in range(num_draft_tokens)] for b in range(batch)])
    n = torch.tensor(rng.integers(1, num_draft_tokens + 1, size=batch))
    u = torch.rand(batch, num_draft_tokens + 1, generator=torch.Generator().manual_seed(3), dtype=F64)
    batched = rejection_sample(p, q, drafts, uniforms=u, num_draft=n)
    for b in range(batch):
        k = int(n[b])
        alone = rejection_sample(
            p[b : b + 1, : k + 1], q[b : b + 1, :k], drafts[b : b + 1, :k],
            uniforms=torch.cat([u[b : b + 1, :k], u[b : b + 1, -1:]], dim=1),
        )
        assert batched.emitted[b, : k + 1].tolist() == alone.emitted[0].tolist()
        assert (batched.emitted[b, k + 1 :] == -1).all()


def test_batched_equals_row_by_row_and_loop_reference():
    rng = np.random.default_rng(derive_seed("batched", 32, 3, 6))
    batch, num_draft_tokens, vocab = 32, 3, 6
    p = torch.tensor(random_distributions(rng, (batch, num_draft_tokens + 1, vocab), 0.3))
    q = torch.tensor(random_distributions(rng, (batch, num_draft_tokens, vocab), 0.3))
    drafts = torch.tensor([[rng.choice(vocab,
                                       p=q[b, i].numpy()) for i in range(num_draft_tokens)] for b in range(batch)])
    u = torch.tensor(rng.random((batch, num_draft_tokens + 1)))
    batched = rejection_sample(p, q, drafts, uniforms=u)
    rows = torch.cat(
        [rejection_sample(p[b : b + 1], q[b : b + 1], drafts[b : b + 1],
                          uniforms=u[b : b + 1]).emitted for b in range(batch)]
    )
    assert torch.equal(batched.emitted, rows)
    assert torch.equal(batched.emitted, loop_rule()(p, q, drafts, uniforms=u))
    assert torch.equal(batched.num_accepted, (batched.emitted >= 0).sum(1) - 1)


@pytest.mark.parametrize("device", DEVICES)
def test_generator_draws_exactly_one_float64_block(device):
    batch, num_draft_tokens, vocab = 7, 3, 5
    rng = np.random.default_rng(derive_seed("generator", batch, num_draft_tokens, vocab))
    p = torch.tensor(random_distributions(rng, (batch, num_draft_tokens + 1, vocab)), device=device)
    q = torch.tensor(random_distributions(rng, (batch, num_draft_tokens, vocab)), device=device)
    drafts = torch.tensor(rng.integers(0, vocab, (batch, num_draft_tokens)), device=device)
    generator = torch.Generator(device=device).manual_seed(derive_seed("generator-stream"))
    clone = torch.Generator(device=device)
    clone.set_state(generator.get_state())

    for rule in (
        lambda **kw: rejection_sample(p, q, drafts, **kw),
        lambda **kw: point_mass_verify(p, drafts, **kw),
        lambda **kw: typical_acceptance_verify(p, drafts, **kw),
    ):
        drawn = rule(generator=generator)
        u = torch.rand(batch, num_draft_tokens + 1, generator=clone, dtype=F64, device=device)
        injected = rule(uniforms=u)
        assert torch.equal(drawn.emitted, injected.emitted)
        assert torch.equal(generator.get_state(), clone.get_state())  # consumed exactly B*(K+1) doubles


def test_output_padding_shape_and_dtype():
    p, q = small_case(derive_seed("padding"), positions=4, vocab=4, zero_fraction=0.0)
    batch = 50
    generator = torch.Generator().manual_seed(derive_seed("padding-stream"))
    drafts = torch.multinomial(torch.tensor(q), batch, replacement=True, generator=generator).T.contiguous()
    result = rejection_sample(
        torch.tensor(p).expand(batch, -1, -1), torch.tensor(q).expand(batch, -1, -1), drafts, generator
    )
    emitted = result.emitted
    assert emitted.shape == (batch, 4) and emitted.dtype == torch.int64
    lengths = (emitted >= 0).sum(1)
    assert torch.equal(lengths, result.num_accepted + 1)
    for b in range(batch):  # valid tokens form a prefix, then only -1
        assert (emitted[b, : lengths[b]] >= 0).all() and (emitted[b, lengths[b] :] == -1).all()
        assert torch.equal(emitted[b, : result.num_accepted[b]], drafts[b, : result.num_accepted[b]])


# --------------------------------------------------------------------------------------------
# Exactness by enumeration, and the same check failing on buggy rules
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("positions, vocab", [(2, 3), (3, 3), (2, 4)])
def test_rejection_sample_is_exact_by_enumeration(seed, positions, vocab):
    p, q = small_case(derive_seed("exact", seed, positions, vocab), positions, vocab)
    law = exact_step_law(verify, p, q)
    assert abs(sum(law.values()) - 1) < 1e-12
    assert completed_total_variation(law, p) < 1e-12


def test_enumeration_agrees_with_the_loop_reference():
    p, q = small_case(derive_seed("loop-vs-vectorised"), 3, 3)
    vectorised, loop = exact_step_law(verify, p, q), exact_step_law(loop_rule(), p, q)
    assert vectorised.keys() == loop.keys()
    assert all(abs(vectorised[k] - loop[k]) < 1e-12 for k in loop)


@pytest.mark.parametrize("bug", ["resample_from_p", "inverted_ratio", "bonus_from_last_draft_position"])
def test_enumeration_catches_buggy_rules(bug):
    p, q = small_case(derive_seed("buggy", bug), 3, 3, zero_fraction=0.0)
    assert completed_total_variation(exact_step_law(loop_rule(), p, q), p) < 1e-12
    assert completed_total_variation(exact_step_law(loop_rule(bug), p, q), p) > 1e-3


@pytest.mark.parametrize("seed", range(3))
def test_point_mass_is_exact_for_deterministic_drafts(seed):
    rng = np.random.default_rng(derive_seed("point-mass", seed))
    p = random_distributions(rng, (3, 4), zero_fraction=0.25)
    for path in itertools.product(range(4), repeat=2):  # every deterministic draft pair
        one_hot = np.eye(4)[list(path)]
        law = exact_step_law(point_mass_as_verify, p, one_hot)
        assert completed_total_variation(law, p) < 1e-12


def test_point_mass_equals_rejection_sample_with_one_hot_draft():
    rng = np.random.default_rng(derive_seed("point-mass-one-hot"))
    batch, num_draft_tokens, vocab = 64, 3, 5
    p = torch.tensor(random_distributions(rng, (batch, num_draft_tokens + 1, vocab), 0.3))
    drafts = torch.tensor(rng.integers(0, vocab, (batch, num_draft_tokens)))
    one_hot = torch.nn.functional.one_hot(drafts, vocab).to(F64)
    u = torch.tensor(rng.random((batch, num_draft_tokens + 1)))
    assert torch.equal(point_mass_verify(p, drafts, uniforms=u).emitted,
                       rejection_sample(p, one_hot, drafts, uniforms=u).emitted)


def test_point_mass_is_exact_even_for_sampled_drafts():
    """Exact conditionally on every draft path, so also for drafts sampled from any q (independent
    of the step's uniforms); it merely accepts less often than rejection_sample."""
    p, q = small_case(derive_seed("point-mass-sampled"), 3, 3, zero_fraction=0.0)
    assert completed_total_variation(exact_step_law(point_mass_as_verify, p, q), p) < 1e-12


def test_point_mass_check_catches_resampling_the_rejected_token():
    """The known bug: at a rejection sample from p itself instead of p with x zeroed."""
    p = random_distributions(np.random.default_rng(derive_seed("point-mass-bug")), (3, 3))
    one_hot = np.eye(3)[[0, 2]]
    assert completed_total_variation(exact_step_law(loop_rule(), p, one_hot), p) < 1e-12
    assert completed_total_variation(exact_step_law(loop_rule("resample_from_p"), p, one_hot), p) > 1e-2


def test_typical_acceptance_is_lossy_hand_example():
    """p0 = [.5, .5]: H = ln 2, bar = min(0.09, 0.3 * 0.5) = 0.09 < 0.5, so every draft is accepted
    and the first token follows q0 = [.9, .1]; completed law {(0,t): .45, (1,t): .05} against the
    target's .25 each: TV = (2 * .2 + 2 * .2) / 2 = 0.4."""
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    q = np.array([[0.9, 0.1]])
    law = exact_step_law(typical_acceptance_as_verify, p, q)
    assert law.keys() == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert law[(0, 0)] == pytest.approx(0.45, abs=1e-12) and law[(1, 1)] == pytest.approx(0.05, abs=1e-12)
    assert completed_total_variation(law, p) == pytest.approx(0.4, abs=1e-12)


def test_typical_acceptance_rejection_path_hand_example():
    """p0 = [.95, .04, .01]: H = 0.2236, 0.3 e^-H = 0.240, bar = 0.09: only token 0 passes.  With
    q0 uniform the first token is 0 with probability 1/3 + 2/3 * 0.95 = 0.9667, not 0.95."""
    p = np.array([[0.95, 0.04, 0.01], [0.2, 0.3, 0.5]])
    q = np.full((1, 3), 1 / 3)
    law = exact_step_law(typical_acceptance_as_verify, p, q)
    first_is_zero = sum(v for k, v in law.items() if k[0] == 0)
    assert first_is_zero == pytest.approx(1 / 3 + 2 / 3 * 0.95, abs=1e-12)
    # the second token is p1-distributed either way, so the TV is that of the first token: 0.05 / 3
    assert completed_total_variation(law, p) == pytest.approx(0.05 / 3, abs=1e-12)


# --------------------------------------------------------------------------------------------
# Numerics: zero mass, low precision, large vocabularies
# --------------------------------------------------------------------------------------------


def test_zero_mass_tokens_never_emitted_at_adversarial_uniforms():
    rng = np.random.default_rng(derive_seed("zero-mass"))
    vocab = 8
    p = random_distributions(rng, (2, vocab), zero_fraction=0.5)
    q = random_distributions(rng, (1, vocab), zero_fraction=0.5)
    draft = int(np.flatnonzero(q[0])[0])
    edges = set()
    for weights in (p[0], p[1], np.maximum(p[0] - q[0], 0)):
        for edge in np.cumsum(weights) / weights.sum():
            edges |= {edge, np.nextafter(edge, 0), np.nextafter(edge, 1)}
    u_final = sorted(e for e in edges | {0.0, np.nextafter(1.0, 0)} if 0 <= e < 1)
    u_accept = [0.0, np.nextafter(1.0, 0)]  # certainly accepted / rejected (p/q < 1) at the extremes
    rows = [(a, f) for a in u_accept for f in u_final]
    batch = len(rows)
    result = rejection_sample(
        torch.tensor(p).expand(batch, -1, -1), torch.tensor(q).expand(batch, -1, -1),
        torch.full((batch, 1), draft), uniforms=torch.tensor(rows),
    )
    for emitted, n in zip(result.emitted.tolist(), result.num_accepted.tolist()):
        final_token = emitted[n]
        if n == 1:
            assert p[1, final_token] > 0
        else:
            assert max(p[0, final_token] - q[0, final_token], 0) > 0
    pm = point_mass_verify(torch.tensor(p).expand(batch, -1, -1), torch.full((batch, 1), draft),
                           uniforms=torch.tensor(rows))
    for emitted, n in zip(pm.emitted.tolist(), pm.num_accepted.tolist()):
        final_token = emitted[n]
        assert p[n, final_token] > 0 and (n == 1 or final_token != draft)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs_match_their_float64_upcast(dtype):
    rng = np.random.default_rng(derive_seed("low-precision", str(dtype)))
    batch, num_draft_tokens, vocab = 40, 3, 16
    p = torch.tensor(random_distributions(rng, (batch, num_draft_tokens + 1, vocab), 0.3)).to(dtype)
    q = torch.tensor(random_distributions(rng, (batch, num_draft_tokens, vocab), 0.0)).to(dtype)
    drafts = torch.tensor(rng.integers(0, vocab, (batch, num_draft_tokens)))
    u = torch.tensor(rng.random((batch, num_draft_tokens + 1)))
    low = rejection_sample(p, q, drafts, uniforms=u)
    upcast = rejection_sample(p.double(), q.double(), drafts, uniforms=u, validate=False)
    assert torch.equal(low.emitted, upcast.emitted)
    low_point_mass = point_mass_verify(p, drafts, uniforms=u)
    upcast_point_mass = point_mass_verify(p.double(), drafts, uniforms=u, validate=False)
    assert torch.equal(low_point_mass.emitted, upcast_point_mass.emitted)


def test_row_sum_tolerance_values():
    assert row_sum_tolerance(torch.float64, 10) == pytest.approx(1e-4)
    assert row_sum_tolerance(torch.float32, 131072) == pytest.approx(1e-4)
    assert row_sum_tolerance(torch.float16, 1) == pytest.approx(4 * 2.0**-10, rel=1e-3)
    assert row_sum_tolerance(torch.float16, 131072) == pytest.approx(4 * 2.0**-10 + 131072 * 2.0**-25, rel=1e-3)
    assert row_sum_tolerance(torch.bfloat16, 131072) == pytest.approx(4 * 2.0**-7, rel=1e-3)


def test_fp16_rounding_accepted_but_same_error_in_fp32_rejected():
    row = torch.tensor([[[0.5, 0.498], [0.5, 0.5]]])  # sums to 0.998: fp16-level error
    q = torch.tensor([[[0.5, 0.5]]])
    rejection_sample(row.half(), q.half(), tokens([[0]]), uniforms=t64([[0.5, 0.5]]))
    with pytest.raises(ValueError, match="target_probs: a row does not sum to 1"):
        rejection_sample(row, q, tokens([[0]]), uniforms=t64([[0.5, 0.5]]))


def _tiny_mass_row(vocab: int, tiny: float) -> torch.Tensor:
    row = torch.full((vocab,), tiny, dtype=torch.float32)
    row[0] = 1 - (vocab - 1) * tiny
    return row


def test_tiny_masses_in_a_128k_vocabulary_keep_their_probability():
    """Bonus row: token 0 has 1 - (V-1)e-8 ≈ 0.99869, every other token 1e-8.  u_K is placed in
    the middle of the tail, so the inverse CDF must return a token near V/2; an fp32 cumulative
    sum (ulp 6e-8 near 1) drops the 1e-8 increments and cannot reach the tail at all."""
    vocab, tiny = 131072, 1e-8
    bonus = _tiny_mass_row(vocab, tiny)
    p = torch.stack([torch.full((vocab,), 1 / vocab), bonus])[None]
    q = p[:, :1].clone()
    total = bonus.double().sum().item()
    u_final = 1 - 0.5 * (vocab - 1) * float(bonus[1]) / total
    result = rejection_sample(p, q, tokens([[7]]), uniforms=t64([[0.0, u_final]]))
    expected = int(np.argmax(np.cumsum(bonus.double().numpy()) > u_final * total))
    assert result.emitted.tolist() == [[7, expected]]
    assert abs(expected - vocab // 2) <= 2


def test_tiny_masses_are_resolved_token_by_token_unlike_a_float32_inverse_cdf():
    """u_K aimed at the middle of 20 single tail tokens (mass 1e-8 each) must return exactly those
    tokens; the known bug, an inverse CDF in float32 (ulp 6e-8 near 1), cannot resolve them."""
    vocab, tiny, rows = 131072, 1e-8, 20
    bonus = _tiny_mass_row(vocab, tiny)
    cumulative = bonus.double().cumsum(0)
    aimed = torch.arange(rows) * 6007 + 1000
    u = (cumulative[aimed - 1] + 0.5 * tiny) / cumulative[-1]
    p = torch.stack([torch.full((vocab,), 1 / vocab), bonus])[None].expand(rows, -1, -1)
    result = rejection_sample(p, p[:, :1], torch.full((rows, 1), 7),
                              uniforms=torch.stack([torch.zeros(rows, dtype=F64), u], 1))
    assert torch.equal(result.emitted[:, 1], aimed)
    fp32_cumulative = bonus.cumsum(0)
    fp32_tokens = torch.searchsorted(fp32_cumulative, (u * fp32_cumulative[-1].item()).float(), right=True)
    assert (fp32_tokens != aimed).sum() >= rows // 2


def test_tiny_masses_in_the_residual_of_a_128k_vocabulary():
    vocab, tiny = 131072, 1e-8
    target = _tiny_mass_row(vocab, tiny)
    draft = torch.zeros(vocab)
    draft[0] = 1.0  # residual (p - q)+ = the tail of 1e-8 masses, total 1.3e-3
    p = torch.stack([target, target])[None]
    q = draft[None, None]
    for u_final, low, high in ((0.0, 1, 1), (0.5, vocab // 2 - 2, vocab // 2 + 2),
                               (np.nextafter(1.0, 0), vocab - 1, vocab - 1)):
        result = rejection_sample(p, q, tokens([[0]]), uniforms=t64([[0.9999, u_final]]))
        assert result.num_accepted.item() == 0
        assert low <= result.emitted[0, 0].item() <= high


# --------------------------------------------------------------------------------------------
# Greedy and typical acceptance
# --------------------------------------------------------------------------------------------


def test_greedy_verify_equals_argmax_decoding():
    rng = np.random.default_rng(derive_seed("greedy"))
    batch, num_draft_tokens, vocab = 64, 4, 4
    p = torch.tensor(random_distributions(rng, (batch, num_draft_tokens + 1, vocab)))
    greedy = p.argmax(-1)
    # drafts agree with the target's argmax for a random number of leading positions
    agree = torch.tensor(rng.integers(0, num_draft_tokens + 1, batch))
    drafts = greedy[:, :-1].clone()
    for b in range(batch):
        if agree[b] < num_draft_tokens:
            drafts[b, agree[b]] = (drafts[b, agree[b]] + 1) % vocab
    result = greedy_verify(p, drafts)
    assert torch.equal(result.num_accepted, agree)
    for b in range(batch):
        n = int(agree[b])
        assert result.emitted[b, : n + 1].tolist() == greedy[b, : n + 1].tolist()
        assert (result.emitted[b, n + 1 :] == -1).all()
    assert torch.equal(greedy_as_verify(p, None, drafts, None), result.emitted)


def test_greedy_ties_pick_the_first_maximum_and_respect_num_draft():
    p = t64([[[0.25, 0.375, 0.375], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]]] * 2)
    result = greedy_verify(p, tokens([[1, 0], [1, -1]]), num_draft=tokens([2, 1]))
    assert result.emitted.tolist() == [[1, 0, 1], [1, 0, -1]]
    assert greedy_verify(p, tokens([[2, 0], [2, 0]])).emitted.tolist() == [[1, -1, -1]] * 2


def test_typical_acceptance_hand_cases():
    p = t64([[[0.95, 0.04, 0.01], [0.2, 0.3, 0.5]]])
    # bar = 0.09: token 0 passes; token 1 (0.04) fails and the correction is drawn from p0 itself
    assert typical_acceptance_verify(p, tokens([[0]]), uniforms=t64([[0.99, 0.6]])).emitted.tolist() == [[0, 2]]
    assert typical_acceptance_verify(p, tokens([[1]]), uniforms=t64([[0.0, 0.96]])).emitted.tolist() == [[1, -1]]
    assert typical_acceptance_verify(p, tokens([[1]]), uniforms=t64([[0.0, 0.5]])).emitted.tolist() == [[0, -1]]
    # the comparison is strict: with threshold 0.04 = p0(1) token 1 is rejected
    assert typical_acceptance_verify(p, tokens([[1]]), uniforms=t64([[0.0, 0.5]]),
                                     threshold=0.04).emitted.tolist() == [[0, -1]]
    # a threshold of 0.03 lets token 1 through
    assert typical_acceptance_verify(p, tokens([[1]]), uniforms=t64([[0.0, 0.1]]),
                                     threshold=0.03).emitted.tolist() == [[1, 0]]


@pytest.mark.parametrize("argument, value", [("threshold", -0.1), ("threshold", math.nan), ("alpha", math.inf)])
def test_typical_acceptance_parameter_errors(argument, value):
    p = t64([[[0.5, 0.5], [0.5, 0.5]]])
    with pytest.raises(ValueError, match=argument):
        typical_acceptance_verify(p, tokens([[0]]), uniforms=t64([[0.0, 0.0]]), **{argument: value})


# --------------------------------------------------------------------------------------------
# A sampled sanity check (the exact checks above are the primary evidence)
# --------------------------------------------------------------------------------------------

STATISTICAL_ALPHA = 1e-3
SAMPLED_ROWS = 20_000


@pytest.mark.statistical
@pytest.mark.parametrize("rule, lossless", [(verify, True), (typical_acceptance_as_verify, False)])
def test_first_token_law_chisquare(rule, lossless):
    """Pearson chi-square of the first emitted token against p0, alpha = 1e-3, N = 20000 rows.

    Power: moving mass 0.03 (TV 0.03) between any two cells (each of mass <= 0.6) gives
    noncentrality lambda >= N * 2 * 0.03^2 / 0.6 = 60 on 3 dof: power > 0.999 (asserted below).
    The lossy typical rule (bar 0.09 passes tokens 0-2, rejects 3) gives the first token the law
    [0.4, 0.3, 0.2875, 0.0125], TV 0.2375 from p0, and must be caught."""
    p0 = [0.6, 0.2, 0.15, 0.05]
    q0 = [0.25, 0.25, 0.25, 0.25]
    p = torch.tensor([p0, [0.25] * 4], dtype=F64).expand(SAMPLED_ROWS, -1, -1)
    q = torch.tensor([q0], dtype=F64).expand(SAMPLED_ROWS, -1, -1)
    generator = torch.Generator().manual_seed(derive_seed("chisquare", rule.__name__))
    drafts = torch.multinomial(torch.tensor(q0, dtype=F64), SAMPLED_ROWS, replacement=True,
                               generator=generator)[:, None]
    first = rule(p, q, drafts, generator)[:, 0]
    counts = torch.bincount(first, minlength=4).numpy()
    expected = SAMPLED_ROWS * np.array(p0)
    noncentrality = SAMPLED_ROWS * 2 * 0.03**2 / 0.6
    critical = stats.chi2.ppf(1 - STATISTICAL_ALPHA, 3)
    assert stats.ncx2.sf(critical, 3, noncentrality) > 0.999
    pvalue = stats.chisquare(counts, expected).pvalue
    assert (pvalue > STATISTICAL_ALPHA) == lossless


# --------------------------------------------------------------------------------------------
# Validation: every ValueError path
# --------------------------------------------------------------------------------------------


def _valid_inputs():
    p = t64([P_HAND, P_HAND])
    q = t64([Q_HAND, Q_HAND])
    return dict(target_probs=p, draft_probs=q, draft_tokens=tokens([[1, 0], [2, 2]]), generator=None,
                uniforms=t64([[0.1, 0.2, 0.3]] * 2), num_draft=None)


def _set(tensor_name, index, value):
    def mutate(inputs):
        tensor = inputs[tensor_name].clone()
        tensor[index] = value
        inputs[tensor_name] = tensor
    return mutate


def _replace(name, value):
    def mutate(inputs):
        inputs[name] = value(inputs) if callable(value) else value
    return mutate


VALIDATION_CASES = {
    "target NaN": (_set("target_probs", (0, 1, 0), math.nan), "target_probs: contains NaN or Inf"),
    "target Inf": (_set("target_probs", (1, 2, 2), math.inf), "target_probs: contains NaN or Inf"),
    "draft NaN": (_set("draft_probs", (0, 0, 0), math.nan), "draft_probs: contains NaN or Inf"),
    "target negative": (_replace("target_probs",
                                 lambda i: i["target_probs"] + t64([[0.375, -0.5, 0.125], [0, 0, 0], [0, 0, 0]])),
                        "target_probs: contains negative"),
    "draft negative": (_replace("draft_probs", lambda i: i["draft_probs"] + t64([[[0, 0, 0], [0.375, -0.5, 0.125]]])),
                       "draft_probs: contains negative"),
    "target not normalised": (_replace("target_probs", lambda i: i["target_probs"] * 1.01),
                              "target_probs: a row does not sum to 1"),
    "draft not normalised": (_replace("draft_probs", lambda i: i["draft_probs"] * 0.9), "draft_probs: a "
                             "row does not sum to 1"),
    "target 2-D": (_replace("target_probs", lambda i: i["target_probs"][0]), r"target_probs: "
                   r"expected shape \[B, K\+1, V\]"),
    "target ints": (_replace("target_probs", lambda i: i["target_probs"].long()), "target_probs: "
                    "expected a floating-point"),
    "K = 0": (lambda i: i.update(target_probs=i["target_probs"][:, :1], draft_probs=i["draft_probs"][:, :0],
                                 draft_tokens=i["draft_tokens"][:, :0], uniforms=i["uniforms"][:, :1]), "K >= 1"),
    "batch mismatch": (_replace("draft_probs", lambda i: i["draft_probs"][:1]), "draft_probs: expected shape"),
    "K mismatch": (_replace("draft_probs", lambda i: i["draft_probs"][:, :1]), "draft_probs: K = 1 positions"),
    "vocab mismatch": (_replace("draft_probs",
                                lambda i: torch.cat([i["draft_probs"], torch.zeros(2, 2, 1, dtype=F64)], -1)),
                       "draft_probs: vocabulary size 4"),
    "tokens int32": (_replace("draft_tokens", lambda i: i["draft_tokens"].int()), "draft_tokens: "
                     "expected dtype torch.int64"),
    "tokens shape": (_replace("draft_tokens", lambda i: i["draft_tokens"][:, :1]), r"draft_tokens: "
                     r"expected shape \[B, K\]"),
    "token too large": (_set("draft_tokens", (1, 0), 3), r"draft_tokens: token ids must lie in \[0, V\)"),
    "token negative": (_set("draft_tokens", (0, 1), -1), r"draft_tokens: token ids must lie in \[0, V\)"),
    "draft prob zero at token": (_replace("draft_probs",
                                          lambda i: torch.zeros_like(i["draft_probs"]) + t64([0.5, 0.5, 0.0])),
                                 "draft_probs: a draft token has draft probability 0"),  # row 1 drafts token 2
    "uniform = 1": (_set("uniforms", (0, 2), 1.0), r"uniforms: values must be finite and lie in \[0, 1\)"),
    "uniform < 0": (_set("uniforms", (1, 0), -0.5), r"uniforms: values must be finite and lie in \[0, 1\)"),
    "uniform NaN": (_set("uniforms", (1, 1), math.nan), r"uniforms: values must be finite"),
    "uniforms shape": (_replace("uniforms", lambda i: i["uniforms"][:, :2]), r"uniforms: expected shape \[B, K\+1\]"),
    "uniforms ints": (_replace("uniforms", lambda i: i["uniforms"].long()), "uniforms: expected a floating-point"),
    "neither generator nor uniforms": (_replace("uniforms", None), "generator/uniforms: pass exactly one"),
    "both generator and uniforms": (_replace("generator", torch.Generator()), "generator/uniforms: pass exactly one"),
    "generator not a generator": (lambda i: i.update(uniforms=None, generator=3), "generator: expected a "
                                  "torch.Generator"),
    "num_draft too large": (_replace("num_draft", tokens([2, 3])), "num_draft: entries must lie in 0..K"),
    "num_draft negative": (_replace("num_draft", tokens([-1, 2])), "num_draft: entries must lie in 0..K"),
    "num_draft int32": (_replace("num_draft", torch.tensor([1, 1], dtype=torch.int32)), "num_draft: expected an int64"),
    "num_draft shape": (_replace("num_draft", tokens([1, 1, 1])), r"num_draft: expected shape \[B\]"),
    "device meta": (_replace("draft_tokens", lambda i: i["draft_tokens"].to("meta")), "draft_tokens: on device meta"),
}


@pytest.mark.parametrize("case", sorted(VALIDATION_CASES))
def test_validation_errors(case):
    mutate, message = VALIDATION_CASES[case]
    inputs = _valid_inputs()
    rejection_sample(**inputs)  # the unmutated inputs are valid
    mutate(inputs)
    with pytest.raises(ValueError, match=message):
        rejection_sample(**inputs)


def test_validation_ignores_positions_beyond_num_draft():
    inputs = _valid_inputs()
    inputs["num_draft"] = tokens([1, 0])
    inputs["draft_tokens"] = tokens([[1, -1], [-1, 99]])
    inputs["draft_probs"] = inputs["draft_probs"].clone()
    inputs["draft_probs"][0, 1] = math.nan
    inputs["target_probs"] = inputs["target_probs"].clone()
    inputs["target_probs"][1, 1:] = 0.0
    rejection_sample(**inputs)
    inputs["num_draft"] = tokens([2, 0])
    with pytest.raises(ValueError, match="draft_tokens: token ids"):
        rejection_sample(**inputs)


def test_validation_of_rules_without_draft_probs():
    p = t64([P_HAND])
    with pytest.raises(ValueError, match="draft_tokens: token ids"):
        point_mass_verify(p, tokens([[0, 5]]), uniforms=t64([[0.1, 0.1, 0.1]]))
    with pytest.raises(ValueError, match="generator/uniforms"):
        typical_acceptance_verify(p, tokens([[0, 1]]))
    with pytest.raises(ValueError, match="target_probs: a row does not sum to 1"):
        greedy_verify(p * 2, tokens([[0, 1]]))
    validate_verify_inputs(p, None, tokens([[0, 1]]), needs_randomness=False)


@pytest.mark.gpu
def test_validation_rejects_mixed_devices():
    inputs = _valid_inputs()
    inputs["uniforms"] = inputs["uniforms"].cuda()
    with pytest.raises(ValueError, match="uniforms: on device cuda"):
        rejection_sample(**inputs)
    inputs["uniforms"], inputs["generator"] = None, torch.Generator(device="cuda")
    with pytest.raises(ValueError, match="generator: on device cuda"):
        rejection_sample(**inputs)


@pytest.mark.gpu
def test_cuda_matches_cpu_on_random_batches():
    rng = np.random.default_rng(derive_seed("cuda-vs-cpu"))
    batch, num_draft_tokens, vocab = 256, 4, 1000
    p = torch.tensor(random_distributions(rng, (batch, num_draft_tokens + 1, vocab), 0.3), dtype=torch.float32)
    q = torch.tensor(random_distributions(rng, (batch, num_draft_tokens, vocab), 0.0), dtype=torch.float32)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=torch.Generator().manual_seed(1)).reshape(batch, -1)
    u = torch.tensor(rng.random((batch, num_draft_tokens + 1)))
    n = torch.tensor(rng.integers(0, num_draft_tokens + 1, batch))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        cpu = rejection_sample(p.to(dtype), q.to(dtype), drafts, uniforms=u, num_draft=n,
                               validate=dtype == torch.float32)
        cuda = rejection_sample(p.to(dtype).cuda(), q.to(dtype).cuda(), drafts.cuda(), uniforms=u.cuda(),
                                num_draft=n.cuda(),
                                validate=dtype == torch.float32)
        assert torch.equal(cpu.emitted, cuda.emitted.cpu())
        assert torch.equal(cpu.num_accepted, cuda.num_accepted.cpu())
