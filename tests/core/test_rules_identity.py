"""Proof that the faster ``rejection_sample`` (issue 12) is bit-identical to the rule it replaced.

The rule was rewritten to read two length-V rows per request in cache-sized chunks and to screen
its inputs with one cheap pass per tensor.  This file keeps a frozen copy of the rule and of its
validator as they were at commit ffae46c (``_frozen_*`` below, test-only) and compares the two on
many random inputs: shapes up to V = 128k, ragged ``num_draft``, fp32/bf16/fp16/fp64, exact zeros,
one-hot rows, the rounding fallback, subnormal masses, injected uniforms (random and at the
acceptance edges ``u = p/q``) and generators (the same single ``torch.rand`` draw).  Outputs must be
equal tensors, and corrupted inputs must raise the same ``ValueError`` message.
"""

from __future__ import annotations

import math

import pytest
import torch

from specverify.core import rules
from specverify.core.rules import (
    VerifyResult,
    _check_structure,
    rejection_sample,
    row_sum_tolerance,
)
from specverify.core.seeding import derive_seed

# --------------------------------------------------------------------------------------------
# Frozen copy of the rule at ffae46c (do not edit: it is the baseline).  The structure checks,
# row_sum_tolerance and VerifyResult are host-only and unchanged, so they are imported.
# --------------------------------------------------------------------------------------------


def _frozen_validate_verify_inputs(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    num_draft: torch.Tensor | None = None,
    needs_randomness: bool = True,
) -> None:
    """Raise ``ValueError`` naming the argument when the inputs of a verification step are invalid.

    Checks: tensor types and dtypes (float probabilities, int64 tokens and ``num_draft``), shapes
    (``[B, K+1, V]``, ``[B, K, V]``, ``[B, K]``, ``[B]``, ``[B, K+1]``) with ``K >= 1``, one device
    for everything (the generator's too), ``num_draft`` in ``0..K``; on the positions in use
    (target ``i <= n_b``, drafts ``i < n_b``): no NaN/Inf, no negative entry, rows summing to 1
    within :func:`row_sum_tolerance`, draft tokens in ``[0, V)``, and a positive draft probability
    at each draft token (a token of draft probability 0 could not have been drawn).
    ``draft_probs=None`` skips the draft-distribution checks (point-mass, greedy, typical rules).
    With ``needs_randomness`` exactly one of ``generator`` and ``uniforms`` must be given, and
    ``uniforms`` must be finite, in ``[0, 1)``, of shape ``[B, K+1]``.

    All value checks are reduced on the device and read back with a single host sync.
    """
    _check_structure(target_probs, draft_probs, draft_tokens, generator, uniforms, num_draft, needs_randomness)
    _, positions, vocab = target_probs.shape
    num_draft_tokens = positions - 1
    drafts, draft_used = _frozen_draft_layout(target_probs, draft_tokens, num_draft)
    target_used = torch.arange(positions, device=target_probs.device) <= drafts[:, None]

    problems: list[tuple[str, torch.Tensor]] = []
    if num_draft is not None:
        problems.append(
            (f"num_draft: entries must lie in 0..K = 0..{num_draft_tokens}; pass the number of real "
             "draft tokens of each row", (num_draft < 0) | (num_draft > num_draft_tokens))
        )
    problems += _frozen_distribution_problems("target_probs", target_probs, target_used)
    tokens_in_range = (draft_tokens >= 0) & (draft_tokens < vocab)
    problems.append(
        (f"draft_tokens: token ids must lie in [0, V) = [0, {vocab}) within num_draft; "
         "map the draft's ids into the target vocabulary", draft_used & ~tokens_in_range)
    )
    if draft_probs is not None:
        problems += _frozen_distribution_problems("draft_probs", draft_probs, draft_used)
        safe_tokens = torch.where(tokens_in_range, draft_tokens, 0)
        q_at_token = draft_probs.gather(-1, safe_tokens.unsqueeze(-1)).squeeze(-1)
        problems.append(
            ("draft_probs: a draft token has draft probability 0, so it could not have been drawn "
             "from draft_probs; pass the distribution each draft token was actually sampled from",
             draft_used & tokens_in_range & (q_at_token <= 0))
        )
    if uniforms is not None:
        problems.append(
            ("uniforms: values must be finite and lie in [0, 1); draw them with torch.rand",
             ~((uniforms >= 0) & (uniforms < 1)))
        )

    flags = torch.stack([mask.any() for _, mask in problems]).tolist() if problems else []
    for (message, mask), flagged in zip(problems, flags):
        if flagged:
            first = tuple(int(i) for i in mask.nonzero()[0].tolist())
            raise ValueError(f"{message} (first offending index {first})")


def _frozen_distribution_problems(name: str, probs: torch.Tensor, used: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Masks of rows (in use) that are not finite, have a negative entry, or do not sum to 1."""
    # Summed in the input dtype (torch accumulates in float32 or wider; a float64 sum would copy the
    # whole tensor); its rounding, at most eps/2 at 1, is inside the slack of row_sum_tolerance.
    # The sum is not finite iff some entry is NaN or ±Inf.
    sums = probs.sum(-1).to(torch.float64)
    finite = torch.isfinite(sums)
    tolerance = row_sum_tolerance(probs.dtype, probs.shape[-1])
    return [
        (f"{name}: contains NaN or Inf; pass probabilities, not logits", used & ~finite),
        (f"{name}: contains negative entries; pass probabilities (e.g. softmax of the logits)",
         used & finite & (probs.amin(-1) < 0)),
        (f"{name}: a row does not sum to 1 (tolerance {tolerance:.3g} for {probs.dtype}, V={probs.shape[-1]}); "
         "normalise each row after temperature/top-k/top-p", used & finite & ((sums - 1).abs() > tolerance)),
    ]




def _frozen_num_drafts(num_draft: torch.Tensor | None, batch: int, num_draft_tokens: int, device: torch.device) -> torch.Tensor:
    """``n_b`` per row: ``num_draft`` when given, else ``K`` for every row."""
    if num_draft is None:
        return torch.full((batch,), num_draft_tokens, dtype=torch.int64, device=device)
    return num_draft


def _frozen_step_uniforms(
    target_probs: torch.Tensor, generator: torch.Generator | None, uniforms: torch.Tensor | None
) -> torch.Tensor:
    """The step's uniforms ``u [B, K+1]`` in float64: the injected ones, or exactly one draw."""
    if uniforms is not None:
        return uniforms.to(torch.float64)
    batch, positions, _ = target_probs.shape
    return torch.rand(batch, positions, generator=generator, dtype=torch.float64, device=target_probs.device)


def _frozen_draft_layout(
    target_probs: torch.Tensor, draft_tokens: torch.Tensor, num_draft: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n_b`` per row (int64 ``[B]``) and the bool ``[B, K]`` mask of real draft positions (``i < n_b``)."""
    batch, positions, _ = target_probs.shape
    drafts = _frozen_num_drafts(num_draft, batch, positions - 1, target_probs.device)
    in_draft = torch.arange(draft_tokens.shape[1], device=draft_tokens.device) < drafts[:, None]
    return drafts, in_draft


def _frozen_prob_at_tokens(probs: torch.Tensor, tokens: torch.Tensor, in_draft: torch.Tensor) -> torch.Tensor:
    """``probs[b, i, tokens[b, i]]`` as float64 ``[B, K]`` (padding positions read token 0)."""
    safe_tokens = torch.where(in_draft, tokens, 0)
    return probs.gather(-1, safe_tokens.unsqueeze(-1)).squeeze(-1).to(torch.float64)


def _frozen_leading_accepts(accept: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of ``True`` per row: the number of accepted drafts, int64 ``[B]``."""
    return accept.to(torch.int64).cumprod(-1).sum(-1)


def _frozen_rows_at(probs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``probs[b, positions[b]]`` for every row: ``[B, V]`` (positions beyond the end are clamped)."""
    rows = torch.arange(probs.shape[0], device=probs.device)
    return probs[rows, positions.clamp(max=probs.shape[1] - 1)]


def _frozen_inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """First token ``t`` with ``cumsum(w)[t] > u * sum(w)``, per row; float64 ``weights [B, V] >= 0``.

    ``sum(w)`` is the last cumulative sum.  For ``u < 1`` and a normal ``sum(w)``, ``u * sum(w)``
    rounds below ``sum(w)``; for a subnormal total (masses ~1e-320) it can round up to it, so the
    threshold is capped one ulp below the total and a token is always found.  Because the
    cumulative sum strictly increases at ``t``, ``w[t] > 0``: a token of zero mass is never
    returned (rows must have positive total mass).  ``weights`` is overwritten with its cumulative
    sums (callers pass a temporary; no new ``[B, V]`` buffer).
    """
    cumulative = weights.cumsum_(-1)
    total = cumulative[:, -1]
    threshold = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cumulative, threshold.unsqueeze(-1), right=True).squeeze(-1)


def _frozen_emit(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, final_token: torch.Tensor) -> torch.Tensor:
    """``emitted [B, K+1]``: accepted drafts, the final token at column ``num_accepted``, then -1."""
    batch, num_draft_tokens = draft_tokens.shape
    columns = torch.arange(num_draft_tokens + 1, device=draft_tokens.device)
    drafts = torch.cat([draft_tokens, draft_tokens.new_zeros(batch, 1)], dim=1)
    emitted = torch.where(columns < num_accepted[:, None], drafts, -1)
    return torch.where(columns == num_accepted[:, None], final_token[:, None], emitted)


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------


def _frozen_rejection_sample(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    num_draft: torch.Tensor | None = None,
    validate: bool = True,
) -> VerifyResult:
    """Modified rejection sampling, the lossless rule (Leviathan et al. 2023 Algorithm 1; Chen et
    al. 2023 Algorithm 2).

    For each row, with ``p_i = target_probs[b, i]``, ``q_i = draft_probs[b, i]``, ``x_i = draft_tokens[b, i]``:
    accept ``x_i`` iff ``u_i * q_i(x_i) < p_i(x_i)`` (probability ``min(1, p_i(x_i)/q_i(x_i))``),
    stopping at the first rejection ``n``; then emit one token from
    ``r = (p_n - q_n)+ / sum((p_n - q_n)+)`` (Chen et al. eq. for the residual; Leviathan et al.
    ``p'(x) = norm(max(0, p(x) - q(x)))``), or from ``r = p_K`` (``p_{n_b}`` for ragged rows) when all
    drafts were accepted, by inverse CDF with ``u_K``.  By Leviathan et al. Theorem 1 every emitted
    token is distributed exactly as ``p`` at its position.

    Rounding fallback: a rejection implies ``q_n(x_n) > p_n(x_n)``, so the exact residual has
    positive mass; if the float64 residual nevertheless has none (``p_n`` and ``q_n`` sum to values
    that differ by rounding, e.g. ``p_n = (1 - 1e-9) q_n``) the token is drawn from ``p_n`` instead.
    That event has probability at most the rounding error of the rows, so it changes the step's
    law by no more than that in total variation.

    Vectorised: no loop over rows or positions, no host sync (besides validation's one), and only
    ``[B, K]`` scalars and one ``[B, V]`` row per request are upcast to float64.
    """
    if validate:
        _frozen_validate_verify_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms, num_draft=num_draft)
    u = _frozen_step_uniforms(target_probs, generator, uniforms)
    drafts, in_draft = _frozen_draft_layout(target_probs, draft_tokens, num_draft)

    p_at_draft = _frozen_prob_at_tokens(target_probs[:, :-1], draft_tokens, in_draft)
    q_at_draft = _frozen_prob_at_tokens(draft_probs, draft_tokens, in_draft)
    accept = in_draft & (u[:, :-1] * q_at_draft < p_at_draft)
    num_accepted = _frozen_leading_accepts(accept)

    rejected = num_accepted < drafts
    # Few fresh [B, V] buffers (the first touch of new memory costs more than the arithmetic): the
    # two gathered rows in the input dtype and two float64 rows, all later updates in place.
    # Rejected rows: (p - q)+ in float64; accepted rows: p - 0 = p exactly (the clamp is then a
    # no-op); rows whose residual rounds to all zeros (the fallback) get p added back: 0 + p = p.
    p_final = _frozen_rows_at(target_probs, num_accepted)
    q_final = _frozen_rows_at(draft_probs, num_accepted)
    weights = p_final.to(torch.float64, copy=True)  # p_final is read again below
    scratch = q_final.to(torch.float64)
    weights.sub_(scratch.mul_(rejected[:, None])).clamp_(min=0)
    fallback = rejected & (weights.sum(-1) <= 0)
    weights.add_(scratch.copy_(p_final).mul_(fallback[:, None]))
    final_token = _frozen_inverse_cdf(weights, u[:, -1])
    return VerifyResult(_frozen_emit(draft_tokens, num_accepted, final_token), num_accepted)



# --------------------------------------------------------------------------------------------
# Random inputs
# --------------------------------------------------------------------------------------------

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def random_rows(gen: torch.Generator, shape: tuple[int, ...], zero_fraction: float, one_hot_fraction: float) -> torch.Tensor:
    """Float64 probability rows: peaked softmaxes, some entries exactly 0, some rows one-hot."""
    logits = 3.0 * torch.randn(shape, generator=gen, dtype=torch.float64)
    probs = torch.softmax(logits, -1)
    if zero_fraction:
        probs = probs * (torch.rand(shape, generator=gen, dtype=torch.float64) >= zero_fraction)
        empty = probs.sum(-1) == 0
        probs[..., 0] += empty
    if one_hot_fraction:
        hot = torch.rand(shape[:-1], generator=gen, dtype=torch.float64) < one_hot_fraction
        one_hot = torch.nn.functional.one_hot(probs.argmax(-1), shape[-1]).to(torch.float64)
        probs = torch.where(hot[..., None], one_hot, probs)
    return probs / probs.sum(-1, keepdim=True)


def random_case(seed: int, batch: int, num_draft_tokens: int, vocab: int, dtype: torch.dtype, ragged: bool):
    """``(target_probs, draft_probs, draft_tokens, uniforms, num_draft)`` with draft tokens drawn from
    the draft rows as cast to ``dtype`` (so every draft token has positive draft probability).
    A quarter of the requests draft from the target itself (high acceptance), and one row in eight
    copies its draft row into the target at position 0 scaled by (1 - 1e-9), which rejects by
    rounding with a residual of no mass (the rule's fallback)."""
    gen = torch.Generator().manual_seed(seed)
    zeros = float(torch.rand((), generator=gen)) * 0.5
    hot = float(torch.rand((), generator=gen)) * 0.3
    p = random_rows(gen, (batch, num_draft_tokens + 1, vocab), zeros, hot)
    q = random_rows(gen, (batch, num_draft_tokens, vocab), zeros, hot)
    same = torch.rand(batch, generator=gen) < 0.25
    q = torch.where(same[:, None, None], p[:, :-1], q)
    near = torch.rand(batch, generator=gen) < 0.125
    p[near, 0] = q[near, 0] * (1 - 1e-9)
    p_cast, q_cast = p.to(dtype), q.to(dtype)
    drafts = torch.multinomial(q_cast.double().reshape(-1, vocab), 1, generator=gen).reshape(batch, num_draft_tokens)
    u = torch.rand(batch, num_draft_tokens + 1, generator=gen, dtype=torch.float64)
    edge = torch.rand(batch, num_draft_tokens, generator=gen) < 0.2  # u_i = p/q exactly: the accept boundary
    p_at = p_cast.double()[:, :-1].gather(-1, drafts[..., None]).squeeze(-1)
    q_at = q_cast.double().gather(-1, drafts[..., None]).squeeze(-1)
    ratio = (p_at / q_at).clamp(max=math.nextafter(1.0, 0.0))
    u[:, :-1] = torch.where(edge, ratio, u[:, :-1])
    u[near, 0] = math.nextafter(1.0, 0.0)  # rejects the near-copy of q (in float64): the fallback
    num_draft = torch.randint(0, num_draft_tokens + 1, (batch,), generator=gen) if ragged else None
    if ragged:  # padding beyond num_draft: -1 tokens and zero rows, which both rules must ignore
        pad = torch.arange(num_draft_tokens) >= num_draft[:, None]
        drafts = torch.where(pad, -1, drafts)
        q_cast = torch.where(pad[..., None], torch.zeros((), dtype=dtype), q_cast)
    return p_cast, q_cast, drafts, u, num_draft


def outcome(rule, *args, **kwargs):
    """The rule's result, or the text of the ValueError it raised."""
    try:
        result = rule(*args, **kwargs)
    except ValueError as error:
        return str(error)
    assert isinstance(result, VerifyResult)
    return result


def assert_same(old, new):
    if isinstance(old, str) or isinstance(new, str):
        assert old == new
        return
    assert torch.equal(old.emitted, new.emitted), (old.emitted, new.emitted)
    assert torch.equal(old.num_accepted, new.num_accepted)


def compare(p, q, drafts, u, num_draft, validate=True):
    old = outcome(_frozen_rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft, validate=validate)
    new = outcome(rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft, validate=validate)
    assert_same(old, new)
    return new


# (batch, K, V): small and odd vocabularies, several chunks per call (V = 32k: 4 rows a chunk), 128k.
SHAPES = [(1, 1, 1), (1, 1, 2), (3, 2, 3), (5, 4, 7), (2, 8, 32), (17, 3, 50), (64, 8, 32), (9, 1, 1000),
          (33, 5, 257), (9, 2, 32_768), (6, 4, 32_768)]
LARGE_SHAPES = [(3, 2, 131_072), (1, 8, 131_072)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("ragged", [False, True], ids=["full", "ragged"])
def test_same_tokens_as_the_frozen_rule_under_the_same_uniforms(shape, dtype, ragged):
    for repeat in range(1 if shape[-1] >= 32_768 else 3):
        seed = derive_seed("rules-identity", shape, str(dtype), ragged, repeat)
        case = random_case(seed, *shape, dtype, ragged)
        compare(*case)
        compare(*case, validate=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=str)
def test_same_tokens_at_128k(shape, dtype):
    case = random_case(derive_seed("rules-identity-128k", shape, str(dtype)), *shape, dtype, ragged=True)
    compare(*case)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_same_tokens_under_the_same_generator(dtype):
    """The generator path draws the same single ``torch.rand(B, K+1, float64)``: equal outputs, and
    the generators end in the same state."""
    for batch, num_draft_tokens, vocab in [(1, 1, 5), (8, 4, 1000), (64, 8, 64), (5, 3, 32_768)]:
        p, q, drafts, _, num_draft = random_case(derive_seed("rules-identity-gen", batch, str(dtype)),
                                                 batch, num_draft_tokens, vocab, dtype, ragged=True)
        for seed in range(3):
            old_gen, new_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            old = _frozen_rejection_sample(p, q, drafts, old_gen, num_draft=num_draft)
            new = rejection_sample(p, q, drafts, new_gen, num_draft=num_draft)
            assert_same(old, new)
            assert torch.equal(old_gen.get_state(), new_gen.get_state())


def test_chunking_does_not_change_tokens(monkeypatch):
    """One row per chunk, and a chunk size that does not divide the batch, give the same tokens."""
    case = random_case(derive_seed("rules-identity-chunks"), 23, 4, 300, torch.float32, ragged=True)
    reference = compare(*case)
    for elements in (1, 300, 7 * 300 + 5):
        monkeypatch.setattr(rules, "FINAL_ROWS_CHUNK_ELEMENTS", elements)
        assert_same(reference, compare(*case))


def test_all_zero_uniforms_and_uniforms_just_below_one():
    for u_value in (0.0, math.nextafter(1.0, 0.0)):
        p, q, drafts, u, num_draft = random_case(derive_seed("rules-identity-extreme-u"), 12, 3, 40, torch.float32, True)
        compare(p, q, drafts, torch.full_like(u, u_value), num_draft)


def test_rounding_fallback_and_subnormal_residuals():
    """Residual with no mass (p = (1 - 1e-9) q in float64 rejects by rounding) and residual masses
    of ~1e-320 (subnormal), mixed with ordinary rows in one batch."""
    vocab = 6
    q = torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0]], dtype=torch.float64)
    rows = [q * (1 - 1e-9), q, torch.tensor([[0.5 - 1e-320, 0.25, 0.125, 0.0625, 0.0625, 1e-320]], dtype=torch.float64)]
    p = torch.stack([torch.cat([row, torch.full((1, vocab), 1 / vocab, dtype=torch.float64)]) for row in rows])
    q_batch = q.expand(3, 1, vocab).clone()
    drafts = torch.zeros(3, 1, dtype=torch.int64)
    for u0 in (0.0, 0.5, math.nextafter(1.0, 0.0)):
        for u1 in (0.0, 0.3, 0.999999):
            result = compare(p, q_batch, drafts, torch.tensor([[u0, u1]] * 3, dtype=torch.float64), None)
            if u0 > 1 - 1e-9:  # row 0 rejected by rounding: its token comes from the fallback p_0
                assert int(result.num_accepted[0]) == 0


# --------------------------------------------------------------------------------------------
# Validation: the same error (message and first index) for corrupted inputs, nothing for valid ones
# --------------------------------------------------------------------------------------------


def _corruptions(p, q, drafts, u, num_draft):
    """(name, inputs) pairs, each breaking one property the validator checks (or none: -0.0)."""
    batch, positions, vocab = p.shape
    nan = torch.tensor(math.nan, dtype=p.dtype)

    def with_entry(tensor, index, value):
        tensor = tensor.clone()
        tensor[index] = value
        return tensor

    last = (batch - 1, positions - 1, vocab - 1)
    yield "target NaN", (with_entry(p, last, nan), q, drafts, u, num_draft)
    yield "target Inf", (with_entry(p, (0, 0, 0), math.inf), q, drafts, u, num_draft)
    yield "draft NaN", (with_entry(q, (batch - 1, 0, 0), nan), q, drafts, u, num_draft)
    yield "target negative", (with_entry(p, (0, 0, vocab - 1), -1e-30), q, drafts, u, num_draft)
    yield "draft negative", (with_entry(q, (0, 0, vocab - 1), -1e-3), q, drafts, u, num_draft)
    yield "minus zero (valid)", (with_entry(p, last, -0.0) if float(p[last]) == 0 else p, q, drafts, u, num_draft)
    yield "target scaled", (p * 1.5, q, drafts, u, num_draft)
    yield "draft scaled", (p, q * 0.5, drafts, u, num_draft)
    yield "token too large", (p, q, with_entry(drafts, (0, 0), vocab), u, num_draft)
    yield "token negative", (p, q, with_entry(drafts, (batch - 1, 0), -1), u, num_draft)
    yield "draft probability 0", (p, with_entry(q, (0, 0, int(drafts[0, 0].clamp(min=0))), 0.0), drafts, u, num_draft)
    yield "uniform 1", (p, q, drafts, with_entry(u, (0, -1), 1.0), num_draft)
    yield "uniform NaN", (p, q, drafts, with_entry(u, (batch - 1, 0), math.nan), num_draft)
    if num_draft is not None:
        yield "num_draft too large", (p, q, drafts, u, with_entry(num_draft, 0, positions))
        yield "num_draft negative", (p, q, drafts, u, with_entry(num_draft, batch - 1, -1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ragged", [False, True], ids=["full", "ragged"])
def test_same_validation_errors_as_the_frozen_validator(dtype, ragged):
    for shape in [(1, 1, 3), (4, 3, 50), (3, 2, 4096)]:
        case = random_case(derive_seed("rules-identity-validation", shape, str(dtype), ragged), *shape, dtype, ragged)
        for name, corrupted in _corruptions(*case):
            p, q, drafts, u, num_draft = corrupted
            old = outcome(_frozen_rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft)
            new = outcome(rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft)
            assert_same(old, new), name


def test_screen_flags_minus_zero_but_the_detailed_check_accepts_it():
    """-0.0 sets the sign bit: the screen sends the inputs to the detailed checks, which pass them."""
    p = torch.tensor([[[0.5, 0.5, -0.0], [0.5, 0.5, 0.0]]])
    q = torch.tensor([[[0.5, 0.5, 0.0]]])
    drafts = torch.tensor([[1]])
    assert rules._any_problem(p, q, drafts, None, None)
    rules.validate_verify_inputs(p, q, drafts, torch.Generator())


def test_non_contiguous_inputs():
    """Inputs that are slices of larger tensors (advanced-indexing path of the row gather)."""
    p, q, drafts, u, num_draft = random_case(derive_seed("rules-identity-strided"), 6, 3, 200, torch.float32, True)
    wide_p = torch.cat([p, p], dim=1)[:, :4]  # the same values; first two dims not flattenable
    wide_q = torch.cat([q, q], dim=1)[:, :3]
    assert not wide_p.is_contiguous() and wide_p.stride(0) != 4 * wide_p.stride(1)
    assert_same(compare(p, q, drafts, u, num_draft), compare(wide_p, wide_q, drafts, u, num_draft))
    compare(p.transpose(0, 1).contiguous().transpose(0, 1), q, drafts, u, num_draft)


@pytest.mark.gpu
def test_cuda_same_tokens_as_the_frozen_rule_on_cpu():
    for shape in [(64, 8, 32_768), (5, 3, 1000)]:
        p, q, drafts, u, num_draft = random_case(derive_seed("rules-identity-cuda", shape), *shape, torch.float32, True)
        old = _frozen_rejection_sample(p, q, drafts, uniforms=u, num_draft=num_draft)
        new = rejection_sample(p.cuda(), q.cuda(), drafts.cuda(), uniforms=u.cuda(), num_draft=num_draft.cuda())
        assert torch.equal(old.emitted, new.emitted.cpu())
