"""A frozen copy of ``specverify.core.rules.rejection_sample`` and its validator as they were at
commit ffae46c (before issue 12), kept only so that ``benchmarks/test_bench_verify.py`` can time
the old and the new rule side by side in one run (variants ``before`` / ``before+validate``).

Not part of the package and never imported by it; do not edit (it is the baseline).  The
structure checks (``_check_structure``: host-only, unchanged), ``row_sum_tolerance`` and
``VerifyResult`` are imported from the live module.
"""

from __future__ import annotations

import torch

from specverify.core.rules import VerifyResult, _check_structure, row_sum_tolerance


def validate_verify_inputs(
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
    drafts, draft_used = _draft_layout(target_probs, draft_tokens, num_draft)
    target_used = torch.arange(positions, device=target_probs.device) <= drafts[:, None]

    problems: list[tuple[str, torch.Tensor]] = []
    if num_draft is not None:
        problems.append(
            (f"num_draft: entries must lie in 0..K = 0..{num_draft_tokens}; pass the number of real "
             "draft tokens of each row", (num_draft < 0) | (num_draft > num_draft_tokens))
        )
    problems += _distribution_problems("target_probs", target_probs, target_used)
    tokens_in_range = (draft_tokens >= 0) & (draft_tokens < vocab)
    problems.append(
        (f"draft_tokens: token ids must lie in [0, V) = [0, {vocab}) within num_draft; "
         "map the draft's ids into the target vocabulary", draft_used & ~tokens_in_range)
    )
    if draft_probs is not None:
        problems += _distribution_problems("draft_probs", draft_probs, draft_used)
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


def _distribution_problems(name: str, probs: torch.Tensor, used: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
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




def _num_drafts(num_draft: torch.Tensor | None, batch: int, num_draft_tokens: int,
                device: torch.device) -> torch.Tensor:
    """``n_b`` per row: ``num_draft`` when given, else ``K`` for every row."""
    if num_draft is None:
        return torch.full((batch,), num_draft_tokens, dtype=torch.int64, device=device)
    return num_draft


def _step_uniforms(
    target_probs: torch.Tensor, generator: torch.Generator | None, uniforms: torch.Tensor | None
) -> torch.Tensor:
    """The step's uniforms ``u [B, K+1]`` in float64: the injected ones, or exactly one draw."""
    if uniforms is not None:
        return uniforms.to(torch.float64)
    batch, positions, _ = target_probs.shape
    return torch.rand(batch, positions, generator=generator, dtype=torch.float64, device=target_probs.device)


def _draft_layout(
    target_probs: torch.Tensor, draft_tokens: torch.Tensor, num_draft: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n_b`` per row (int64 ``[B]``) and the bool ``[B, K]`` mask of real draft positions (``i < n_b``)."""
    batch, positions, _ = target_probs.shape
    drafts = _num_drafts(num_draft, batch, positions - 1, target_probs.device)
    in_draft = torch.arange(draft_tokens.shape[1], device=draft_tokens.device) < drafts[:, None]
    return drafts, in_draft


def _prob_at_tokens(probs: torch.Tensor, tokens: torch.Tensor, in_draft: torch.Tensor) -> torch.Tensor:
    """``probs[b, i, tokens[b, i]]`` as float64 ``[B, K]`` (padding positions read token 0)."""
    safe_tokens = torch.where(in_draft, tokens, 0)
    return probs.gather(-1, safe_tokens.unsqueeze(-1)).squeeze(-1).to(torch.float64)


def _leading_accepts(accept: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of ``True`` per row: the number of accepted drafts, int64 ``[B]``."""
    return accept.to(torch.int64).cumprod(-1).sum(-1)


def _rows_at(probs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``probs[b, positions[b]]`` for every row: ``[B, V]`` (positions beyond the end are clamped)."""
    rows = torch.arange(probs.shape[0], device=probs.device)
    return probs[rows, positions.clamp(max=probs.shape[1] - 1)]


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
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


def _emit(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, final_token: torch.Tensor) -> torch.Tensor:
    """``emitted [B, K+1]``: accepted drafts, the final token at column ``num_accepted``, then -1."""
    batch, num_draft_tokens = draft_tokens.shape
    columns = torch.arange(num_draft_tokens + 1, device=draft_tokens.device)
    drafts = torch.cat([draft_tokens, draft_tokens.new_zeros(batch, 1)], dim=1)
    emitted = torch.where(columns < num_accepted[:, None], drafts, -1)
    return torch.where(columns == num_accepted[:, None], final_token[:, None], emitted)


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------


def rejection_sample(
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
        validate_verify_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms,
                               num_draft=num_draft)
    u = _step_uniforms(target_probs, generator, uniforms)
    drafts, in_draft = _draft_layout(target_probs, draft_tokens, num_draft)

    p_at_draft = _prob_at_tokens(target_probs[:, :-1], draft_tokens, in_draft)
    q_at_draft = _prob_at_tokens(draft_probs, draft_tokens, in_draft)
    accept = in_draft & (u[:, :-1] * q_at_draft < p_at_draft)
    num_accepted = _leading_accepts(accept)

    rejected = num_accepted < drafts
    # Few fresh [B, V] buffers (the first touch of new memory costs more than the arithmetic): the
    # two gathered rows in the input dtype and two float64 rows, all later updates in place.
    # Rejected rows: (p - q)+ in float64; accepted rows: p - 0 = p exactly (the clamp is then a
    # no-op); rows whose residual rounds to all zeros (the fallback) get p added back: 0 + p = p.
    p_final = _rows_at(target_probs, num_accepted)
    q_final = _rows_at(draft_probs, num_accepted)
    weights = p_final.to(torch.float64, copy=True)  # p_final is read again below
    scratch = q_final.to(torch.float64)
    weights.sub_(scratch.mul_(rejected[:, None])).clamp_(min=0)
    fallback = rejected & (weights.sum(-1) <= 0)
    weights.add_(scratch.copy_(p_final).mul_(fallback[:, None]))
    final_token = _inverse_cdf(weights, u[:, -1])
    return VerifyResult(_emit(draft_tokens, num_accepted, final_token), num_accepted)

