"""Verification rules of speculative decoding: one step, vectorised over a batch of requests.

Shapes (docs/ARCHITECTURE.md): ``target_probs [B, K+1, V]``, ``draft_probs [B, K, V]``,
``draft_tokens [B, K]`` int64; every rule returns ``VerifyResult(emitted [B, K+1] int64 padded
with -1, num_accepted [B] int64)``.

The lossless rule is modified rejection sampling (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding", Algorithm 1 and Theorem 1; Chen et al. 2023,
"Accelerating Large Language Model Decoding with Speculative Sampling", Algorithm 2):

    accept draft x_i  with probability  min(1, p_i(x_i) / q_i(x_i));
    at the first rejected position n emit  t ~ (p_n - q_n)+ / sum((p_n - q_n)+);
    if all drafts are accepted emit the bonus token  t ~ p_K.

Uniform convention (shared by every rule here, by ``specverify.core.exact`` and by the tests): the
randomness of one step is a float tensor ``u [B, K+1]`` with values in ``[0, 1)``.
- column ``i < K``: draft ``i`` is accepted iff ``u_i * q_i(x_i) < p_i(x_i)``;
- column ``K``: the correction-or-bonus token is the first ``t`` with
  ``cumsum(r)[t] > u_K * sum(r)`` where ``r`` is the (unnormalised) final distribution of the row.
With a ``generator`` instead of ``uniforms`` a rule draws exactly
``torch.rand(B, K+1, generator=generator, dtype=torch.float64, device=target_probs.device)``.

Ragged rows: ``num_draft`` (int64 ``[B]``, entries ``0..K``) gives row b ``n_b`` drafts; its
positions ``i >= n_b`` of ``draft_tokens``/``draft_probs`` and ``i > n_b`` of ``target_probs``
are ignored (they may hold padding such as ``-1`` tokens or zero rows), and its bonus
distribution is ``target_probs[b, n_b]``.

Numerics: only the gathered scalars ``p_i(x_i)``, ``q_i(x_i)`` and the one final distribution per
row (``[B, V]``) are upcast to float64; the inverse CDF runs in float64, so a mass of 1e-8 in a
128k vocabulary keeps its probability, and it can never land on a token of zero mass.

Two implementations: the torch code below is the reference; on CPU float32/bfloat16/float16 inputs whose
rows of V entries are contiguous :func:`rejection_sample`, :func:`point_mass_verify` and
:func:`greedy_verify` first try the fused C kernel of :mod:`specverify.core.native_rules` (one
pass over the inputs: screen, accept tests, final draw), which returns bit-identical outputs
(tests/core/test_native_rules.py, tests/core/test_rules_identity.py) and hands any input its
screen flags back to the torch code, so errors keep their wording.  ``SPECVERIFY_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from specverify.core import native_rules
from specverify.core.sampling import inverse_cdf, search_cdf

# --------------------------------------------------------------------------------------------
# Row-sum tolerance.
#
# A probability row is accepted when |sum - 1| <= row_sum_tolerance(dtype, V).  The tolerance has
# three parts:
# - SUM_TOLERANCE_FLOOR = 1e-4: the producer of the probabilities (a softmax in fp32, top-k/top-p
#   renormalisation) accumulates its normaliser over V terms; with fp32 and V = 128k that error is
#   ~1e-6 typical and ~1e-2 only for a naive worst case.  1e-4 admits every real engine's fp32
#   output while still rejecting logits, unnormalised scores or a forgotten renormalisation.
#   It also applies to float64 input: a tighter check would buy nothing, since the rules
#   normalise the final distribution themselves and an error of 1e-4 in the input is an error of
#   at most 1e-4 in total variation of the step.
# - RELATIVE_ROUNDING_SLACK * eps(dtype): casting each entry of an exact distribution to the dtype
#   moves it by at most eps/2 relative, so the sum by at most eps/2; the factor 4 leaves room for
#   a normaliser that was itself computed in that dtype, and for the rounding of the check's own
#   sum, which is taken in the input dtype.  fp16: 3.9e-3, bf16: 3.1e-2.
# - V * smallest_subnormal(dtype) / 2: entries below the dtype's subnormal spacing are flushed
#   or rounded in absolute terms, at most half a subnormal ulp each.  Only fp16 is affected
#   (2^-25 ≈ 3e-8 per entry: 3.9e-3 at V = 128k).
# --------------------------------------------------------------------------------------------
SUM_TOLERANCE_FLOOR = 1e-4
RELATIVE_ROUNDING_SLACK = 4.0


def row_sum_tolerance(dtype: torch.dtype, vocab_size: int) -> float:
    """Largest accepted ``|sum(row) - 1|`` for a probability row of ``dtype`` and ``vocab_size``.

    ``max(SUM_TOLERANCE_FLOOR, RELATIVE_ROUNDING_SLACK * eps) + vocab_size * smallest_subnormal / 2``
    (see the comment above this function for the derivation).  Values: float64 and float32 1e-4
    (+ nothing measurable), float16 3.9e-3 + V * 3.0e-8, bfloat16 3.1e-2.
    """
    info = torch.finfo(dtype)
    smallest_subnormal = info.tiny * info.eps
    return max(SUM_TOLERANCE_FLOOR, RELATIVE_ROUNDING_SLACK * info.eps) + vocab_size * smallest_subnormal / 2


class VerifyResult(NamedTuple):
    """Outcome of one verification step.

    emitted: int64 ``[B, K+1]``: the accepted drafts, then one correction-or-bonus token, then -1.
    num_accepted: int64 ``[B]``: accepted draft tokens per row (``0..n_b``).
    """

    emitted: torch.Tensor
    num_accepted: torch.Tensor


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


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

    Valid inputs cost one screen (:func:`_any_problem`: a row sum and an integer minimum per
    probability row, in cache-sized chunks, one host sync); only flagged inputs go through the
    detailed checks, which word the error (a second host sync).
    """
    _check_structure(target_probs, draft_probs, draft_tokens, generator, uniforms, num_draft, needs_randomness)
    if _any_problem(target_probs, draft_probs, draft_tokens, uniforms, num_draft):
        _raise_first_problem(target_probs, draft_probs, draft_tokens, uniforms, num_draft)


# Integer views that expose a float's sign bit: ``x.view(int) < 0`` iff the sign bit of ``x`` is set
# (negative numbers, -0.0 and NaNs with the sign bit).  A minimum over the integer view is a plain
# integer reduction, several times faster on CPU than a floating-point minimum (bf16: ~6x).
_SIGN_BIT_VIEWS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
                   torch.bfloat16: torch.int16}

SCREEN_CHUNK_BYTES = 1 << 20
"""Bytes of probability rows (1 MiB) that the screen reduces at once on CPU, for tensors of more
than ``4 * SCREEN_CHUNK_BYTES``: the row sum reads a chunk from memory, the sign-bit minimum then
finds it in cache (half the memory traffic of two whole-tensor passes; measured 15-20% faster
than two passes from 8 MB up, and slower below, where the tensor stays in cache anyway)."""


def _any_problem(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_tokens: torch.Tensor,
                 uniforms: torch.Tensor | None, num_draft: torch.Tensor | None, *,
                 layout: tuple[torch.Tensor, torch.Tensor] | None = None,
                 q_at_token: torch.Tensor | None = None) -> bool:
    """Whether :func:`_raise_first_problem` might find a problem: a cheap screen with one host sync.

    It flags every input the detailed checks flag, and a few harmless ones too (a ``-0.0`` entry
    sets the sign bit), so ``False`` proves the inputs valid and ``True`` only sends them to the
    detailed checks, which decide and word the error.  Per probability row it reads each value
    once from memory (:func:`_rows_look_valid`) and otherwise works on ``[B, K+1]`` row summaries.
    ``layout`` (``_draft_layout``'s result) and ``q_at_token`` (``draft_probs`` gathered at
    :func:`_screen_tokens`) may be passed by a rule that needs them too.
    """
    _, positions, vocab = target_probs.shape
    drafts, draft_used = layout if layout is not None else _draft_layout(target_probs, draft_tokens, num_draft)
    tokens_in_range = (draft_tokens >= 0) & (draft_tokens < vocab)
    target_ok = _rows_look_valid(target_probs)
    if num_draft is not None:
        target_ok |= torch.arange(positions, device=target_probs.device) > drafts[:, None]
    if draft_probs is not None:
        if q_at_token is None:
            screen_tokens = _screen_tokens(draft_tokens, draft_used, tokens_in_range)
            q_at_token = draft_probs.gather(-1, screen_tokens[..., None])[..., 0]
        tokens_in_range &= _rows_look_valid(draft_probs) & (q_at_token > 0)
    flags = [~target_ok.all(), ~(tokens_in_range | ~draft_used).all()]
    if num_draft is not None:
        flags.append(((num_draft < 0) | (num_draft > positions - 1)).any())
    if uniforms is not None:
        flags.append(~((uniforms >= 0) & (uniforms < 1)).all())
    return bool(torch.stack(flags).any())


def _screen_tokens(draft_tokens: torch.Tensor, draft_used: torch.Tensor, tokens_in_range: torch.Tensor) -> torch.Tensor:
    """Draft tokens safe to gather with: the token where it is in use and in ``[0, V)``, else 0."""
    return torch.where(draft_used & tokens_in_range, draft_tokens, 0)


def _rows_look_valid(probs: torch.Tensor) -> torch.Tensor:
    """Bool per row ``[B, P]``: no entry with its sign bit set, and the row sum within tolerance of 1.

    That implies the row is finite and non-negative: every entry is then ``+0``, positive, ``+Inf``
    or a NaN without the sign bit; an ``+Inf`` or a NaN makes the floating-point sum ``+Inf`` or NaN
    (in any summation order and precision), which is not within tolerance of 1.  The sum is the
    detailed check's (``probs.sum(-1)``, input dtype); the minimum is an integer minimum over the
    sign-bit view (:data:`_SIGN_BIT_VIEWS`).  On CPU, contiguous inputs go through in chunks of
    :data:`SCREEN_CHUNK_BYTES`, the sum and the minimum of a chunk back to back, so that the second
    pass reads from cache; each row is reduced whole, so the sums are those of one pass.
    """
    batch, positions, vocab = probs.shape
    view = _SIGN_BIT_VIEWS.get(probs.dtype)
    rows_per_chunk = max(1, SCREEN_CHUNK_BYTES // max(1, vocab * probs.element_size()))
    if (view is None or probs.device.type != "cpu" or not probs.is_contiguous()
            or 4 * rows_per_chunk >= batch * positions):
        sums = probs.sum(-1)
        no_sign_bit = probs.view(view).amin(-1) >= 0 if view is not None else probs.amin(-1) >= 0
    else:
        flat = probs.view(batch * positions, vocab)
        bits = flat.view(view)
        sums = torch.empty(batch * positions, dtype=probs.dtype)
        minima = torch.empty(batch * positions, dtype=view)
        for start in range(0, batch * positions, rows_per_chunk):
            chunk = slice(start, start + rows_per_chunk)
            torch.sum(flat[chunk], -1, out=sums[chunk])
            torch.amin(bits[chunk], -1, out=minima[chunk])
        sums, no_sign_bit = sums.view(batch, positions), minima.view(batch, positions) >= 0
    within = (sums.to(torch.float64) - 1).abs() <= row_sum_tolerance(probs.dtype, vocab)
    return within & no_sign_bit


def _raise_first_problem(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_tokens: torch.Tensor,
                         uniforms: torch.Tensor | None, num_draft: torch.Tensor | None) -> None:
    """The detailed value checks: raise ``ValueError`` for the first problem found, in a fixed
    order (``num_draft``, target rows, draft tokens, draft rows, draft probability at the
    token, uniforms), naming the first offending index."""
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


def _check_structure(target_probs: Any, draft_probs: Any, draft_tokens: Any, generator: Any, uniforms: Any,
                     num_draft: Any, needs_randomness: bool) -> None:
    """Types, dtypes, shapes, devices and the generator/uniforms choice (no device reads)."""
    for name, tensor in (("target_probs", target_probs), ("draft_tokens", draft_tokens)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
    if not target_probs.is_floating_point():
        raise ValueError(f"target_probs: expected a floating-point tensor of probabilities, got {target_probs.dtype}")
    if target_probs.dim() != 3:
        raise ValueError(f"target_probs: expected shape [B, K+1, V], got {tuple(target_probs.shape)}")
    batch, positions, vocab = target_probs.shape
    if positions < 2:
        raise ValueError(
            f"target_probs: K = {positions - 1} draft positions; speculative verification needs K >= 1 "
            "(target_probs [B, K+1, V] with K+1 >= 2)"
        )
    if vocab < 1:
        raise ValueError("target_probs: the vocabulary dimension V is empty")
    num_draft_tokens = positions - 1
    device = target_probs.device
    if draft_tokens.dtype != torch.int64:
        raise ValueError(f"draft_tokens: expected dtype torch.int64, got {draft_tokens.dtype}; use .long()")
    if tuple(draft_tokens.shape) != (batch, num_draft_tokens):
        raise ValueError(
            f"draft_tokens: expected shape [B, K] = {[batch, num_draft_tokens]} to match target_probs "
            f"{list(target_probs.shape)}, got {list(draft_tokens.shape)}"
        )
    _check_device("draft_tokens", draft_tokens.device, device)
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor) or not draft_probs.is_floating_point():
            raise ValueError("draft_probs: expected a floating-point torch.Tensor of probabilities")
        if draft_probs.dim() != 3 or draft_probs.shape[0] != batch:
            raise ValueError(
                f"draft_probs: expected shape [B, K, V] with B = {batch}, got {list(draft_probs.shape)}"
            )
        if draft_probs.shape[1] != num_draft_tokens:
            raise ValueError(
                f"draft_probs: K = {draft_probs.shape[1]} positions but target_probs has K+1 = {positions}; "
                "target_probs needs one more position (the bonus) than draft_probs"
            )
        if draft_probs.shape[2] != vocab:
            raise ValueError(
                f"draft_probs: vocabulary size {draft_probs.shape[2]} differs from target_probs' {vocab}; "
                "draft and target must share one vocabulary"
            )
        _check_device("draft_probs", draft_probs.device, device)
    if num_draft is not None:
        if not isinstance(num_draft, torch.Tensor) or num_draft.dtype != torch.int64:
            raise ValueError("num_draft: expected an int64 torch.Tensor of shape [B]")
        if tuple(num_draft.shape) != (batch,):
            raise ValueError(f"num_draft: expected shape [B] = [{batch}], got {list(num_draft.shape)}")
        _check_device("num_draft", num_draft.device, device)
    if needs_randomness:
        check_randomness_source(generator, uniforms, (batch, positions), device, "[B, K+1]")


def check_randomness_source(generator: torch.Generator | None, uniforms: torch.Tensor | None,
                            shape: tuple[int, int], device: torch.device, shape_name: str) -> None:
    """``ValueError`` unless exactly one of ``generator`` (a ``torch.Generator`` on ``device``) and
    ``uniforms`` (a float tensor of ``shape``, named ``shape_name`` in messages, on ``device``) is given.
    Shared by the chain rules (``[B, K+1]``) and the tree rules (``[B, N+1]``)."""
    if (generator is None) == (uniforms is None):
        raise ValueError(
            "generator/uniforms: pass exactly one source of randomness: a torch.Generator, or "
            f"uniforms {shape_name} (to drive the rule exactly)"
        )
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise ValueError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
        _check_device("generator", generator.device, device)
    if uniforms is not None:
        if not isinstance(uniforms, torch.Tensor) or not uniforms.is_floating_point():
            raise ValueError(f"uniforms: expected a floating-point torch.Tensor of shape {shape_name}")
        if tuple(uniforms.shape) != shape:
            raise ValueError(f"uniforms: expected shape {shape_name} = {list(shape)}, got {list(uniforms.shape)}")
        _check_device("uniforms", uniforms.device, device)


def _check_device(name: str, actual: torch.device, expected: torch.device) -> None:
    same = actual.type == expected.type and (
        actual.index is None or expected.index is None or actual.index == expected.index
    )
    if not same:
        raise ValueError(f"{name}: on device {actual} but target_probs is on {expected}; move "
                         f"it with .to({str(expected)!r})")


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


# --------------------------------------------------------------------------------------------
# Shared steps of every rule
# --------------------------------------------------------------------------------------------


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


def _emit(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, final_token: torch.Tensor) -> torch.Tensor:
    """``emitted [B, K+1]``: accepted drafts, the final token at column ``num_accepted``, then -1."""
    batch, num_draft_tokens = draft_tokens.shape
    columns = torch.arange(num_draft_tokens + 1, device=draft_tokens.device)
    drafts = torch.cat([draft_tokens, draft_tokens.new_zeros(batch, 1)], dim=1)
    emitted = torch.where(columns < num_accepted[:, None], drafts, -1)
    return torch.where(columns == num_accepted[:, None], final_token[:, None], emitted)


@functools.lru_cache(maxsize=256)
def _native_screen_limit(dtype: torch.dtype, vocab_size: int) -> float:
    """The native screen's bound on ``|sum - 1|`` (:data:`native_rules.SCREEN_MARGIN_FRACTION`)."""
    return (1 - native_rules.SCREEN_MARGIN_FRACTION) * row_sum_tolerance(dtype, vocab_size)


def _kernel_input(tensor: Any) -> Any:
    """``tensor`` as the kernel reads it (CPU tensors only): laws ``[B, K+1, V]`` in place when
    each row of V entries is contiguous (strided and expanded views included), else copied
    contiguous; tokens contiguous."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        return tensor
    if tensor.is_floating_point() and tensor.dim() == 3 and native_rules.rows_contiguous(tensor):
        return tensor
    return tensor.contiguous()


def _native(rule: str, target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_tokens: torch.Tensor,
            generator: torch.Generator | None, uniforms: torch.Tensor | None, num_draft: torch.Tensor | None,
            validate: bool) -> VerifyResult | None:
    """The rule's result from the fused kernel (:mod:`specverify.core.native_rules`), or ``None``
    when it does not apply or flagged the inputs (the caller then runs its torch code).

    Engines pass strided views and half-precision laws: the kernel reads float32, bfloat16 and
    float16 views whose rows of V entries are contiguous in place (any batch and position
    strides); other CPU views are copied to a contiguous tensor first, one pass that costs far
    less than the torch code; the kernel only reads its inputs, so the copies change nothing
    else."""
    target_probs, draft_probs, draft_tokens = (_kernel_input(t) for t in (target_probs, draft_probs, draft_tokens))
    if not native_rules.applies(target_probs, draft_probs, draft_tokens, num_draft, uniforms, generator):
        return None
    limit = _native_screen_limit(target_probs.dtype, target_probs.shape[-1])
    outcome = native_rules.verify(rule, target_probs, draft_probs, draft_tokens, generator, uniforms, num_draft,
                                  validate, target_limit=limit, draft_limit=limit)
    return None if outcome is None else VerifyResult(outcome.emitted, outcome.num_accepted)


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

    Cost: the acceptance is decided on ``[B, K]`` gathered scalars; only two length-V rows per
    request (``p_n``, ``q_n``) are read and upcast to float64, in cache-sized chunks of rows on CPU
    (:func:`_draw_final_tokens`).  Validation (:func:`validate_verify_inputs`, the same checks and
    messages) reads every input value twice, a row sum and a sign-bit minimum
    (:func:`_rows_look_valid`), and shares the draft-token gathers with the rule.  No loop over
    positions; no host sync on CUDA besides validation's one.  Bit-identical on every fast path
    (tests/core/test_rules_identity.py).  On CPU float32/bfloat16/float16 inputs with contiguous rows the
    fused kernel (:mod:`specverify.core.native_rules`) does all of this in one call, with the same
    outputs: one read of each input value, the final rows read twice from cache.
    """
    if validate:
        _check_structure(target_probs, draft_probs, draft_tokens, generator, uniforms, num_draft, True)
    fused = _native("rejection", target_probs, draft_probs, draft_tokens, generator, uniforms, num_draft, validate)
    if fused is not None:
        return fused
    layout = drafts, in_draft = _draft_layout(target_probs, draft_tokens, num_draft)
    if validate:  # the screen and the rule share the gathers (one read of each draft token's entry)
        in_range = (draft_tokens >= 0) & (draft_tokens < target_probs.shape[-1])
        safe_tokens = _screen_tokens(draft_tokens, in_draft, in_range)[..., None]
        q_at_token = draft_probs.gather(-1, safe_tokens)[..., 0]
        if _any_problem(target_probs, draft_probs, draft_tokens, uniforms, num_draft, layout=layout,
                        q_at_token=q_at_token):
            _raise_first_problem(target_probs, draft_probs, draft_tokens, uniforms, num_draft)
    else:
        safe_tokens = torch.where(in_draft, draft_tokens, 0)[..., None]
        q_at_token = draft_probs.gather(-1, safe_tokens)[..., 0]
    u = _step_uniforms(target_probs, generator, uniforms)
    p_at_draft = target_probs[:, :-1].gather(-1, safe_tokens)[..., 0].to(torch.float64)
    accept = in_draft & (u[:, :-1] * q_at_token.to(torch.float64) < p_at_draft)
    num_accepted = _leading_accepts(accept)

    rejected = num_accepted < drafts
    final_token = _draw_final_tokens(target_probs, draft_probs, num_accepted, rejected, u[:, -1])
    return VerifyResult(_emit(draft_tokens, num_accepted, final_token), num_accepted)


FINAL_ROWS_CHUNK_ELEMENTS = 1 << 17
"""Float64 entries (1 MiB) of final-distribution rows that :func:`rejection_sample` builds at once on CPU."""

ROW_BY_ROW_MIN_VOCAB = 1 << 13
"""Vocabulary size from which the CPU path copies each final row straight into its float64 buffer
(:func:`_draw_final_tokens_by_row`) instead of gathering a chunk of rows first."""


def _draw_final_tokens(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    num_accepted: torch.Tensor,
    rejected: torch.Tensor,
    u_final: torch.Tensor,
) -> torch.Tensor:
    """The correction-or-bonus token of every row (int64 ``[B]``): inverse CDF with ``u_final`` of
    the row's final distribution, built from two length-V rows per request, ``p_n`` and ``q_n``
    with ``n = num_accepted`` (:func:`_final_cdf`).

    On CPU the rows go through in chunks of about ``FINAL_ROWS_CHUNK_ELEMENTS`` float64 entries:
    a chunk's two temporaries stay in cache and are recycled by the allocator, where one
    ``[B, V]`` float64 pass maps fresh memory on every call (its first touch costs more than the
    arithmetic: ~5x the chunked time at B = 64, V = 128k).  Each row's arithmetic does not depend
    on the chunking, so the tokens are bit-identical to a single pass.  Large vocabularies
    (``V >= ROW_BY_ROW_MIN_VOCAB``) take :func:`_draw_final_tokens_by_row`, the same arithmetic
    with fewer passes.
    """
    batch, positions, vocab = target_probs.shape
    if batch == 0:
        return torch.empty(0, dtype=torch.int64, device=target_probs.device)
    on_cpu = target_probs.device.type == "cpu"
    if on_cpu and vocab >= ROW_BY_ROW_MIN_VOCAB:
        return _draw_final_tokens_by_row(target_probs, draft_probs, num_accepted, rejected, u_final)
    target_rows = _row_picker(target_probs, num_accepted.clamp(max=positions - 1))
    draft_rows = _row_picker(draft_probs, num_accepted.clamp(max=positions - 2))
    rows_per_chunk = max(1, FINAL_ROWS_CHUNK_ELEMENTS // vocab) if on_cpu else batch
    tokens = []
    for start in range(0, batch, rows_per_chunk):
        chunk = slice(start, start + rows_per_chunk)
        cumulative = _final_cdf(target_rows(chunk), draft_rows(chunk), rejected[chunk])
        tokens.append(search_cdf(cumulative, u_final[chunk]))
    return tokens[0] if len(tokens) == 1 else torch.cat(tokens)


def _draw_final_tokens_by_row(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    num_accepted: torch.Tensor,
    rejected: torch.Tensor,
    u_final: torch.Tensor,
) -> torch.Tensor:
    """:func:`_draw_final_tokens` on CPU for large vocabularies, with the same arithmetic per row.

    The row indices, rejection flags and uniforms are read to the host once (free on CPU); each
    final row is then copied straight from the input into a float64 chunk buffer kept between
    calls (:func:`_final_row_buffers`: no gather, no fresh memory to fault in).  Rejected rows
    subtract their draft row, ``fl(p - q)``, the same rounding as :func:`_final_cdf`'s
    ``p + q * (-1)``, and a chunk with a rejected row is clamped at 0; accepted rows keep ``p``
    exactly (the ``p + q * (-0)`` of :func:`_final_cdf` for every finite ``q``; here a padding
    row of ``q`` is never read).  Then the in-place cumulative sum (sequential float64, as
    ``torch.cumsum``), the rounding fallback (a rejected row of zero total takes ``cumsum(p_n)``)
    and :func:`search_cdf`'s threshold ``min(u * total, total - 1 ulp)``, formed in Python's
    IEEE float64 arithmetic (the same roundings as the tensor ops).
    """
    batch, _, vocab = target_probs.shape
    positions, flags, uniforms = num_accepted.tolist(), rejected.tolist(), u_final.to(torch.float64).tolist()
    rows_per_chunk = max(1, min(batch, FINAL_ROWS_CHUNK_ELEMENTS // vocab))
    weights, draft_weights = _final_row_buffers(rows_per_chunk, vocab)
    tokens: list[int] = []
    for start in range(0, batch, rows_per_chunk):
        rows = range(start, min(start + rows_per_chunk, batch))
        chunk = weights[: len(rows)]
        for slot, row in enumerate(rows):
            chunk[slot].copy_(target_probs[row, positions[row]])
            if flags[row]:
                chunk[slot].sub_(draft_weights[slot].copy_(draft_probs[row, positions[row]]))
        if any(flags[row] for row in rows):
            chunk.clamp_(min=0)
        chunk.cumsum_(-1)
        totals = chunk[:, -1].tolist()
        for slot, row in enumerate(rows):
            if flags[row] and totals[slot] <= 0:  # the rounding fallback: the residual has no mass
                chunk[slot].copy_(target_probs[row, positions[row]]).cumsum_(-1)
                totals[slot] = float(chunk[slot, -1])
        thresholds = [min(uniforms[row] * total, math.nextafter(total, 0.0)) for row, total in zip(rows, totals)]
        found = torch.searchsorted(chunk, torch.tensor(thresholds, dtype=torch.float64)[:, None], right=True)
        tokens += found.view(-1).tolist()
    return torch.tensor(tokens, dtype=torch.int64)


_BUFFERS = threading.local()


def _final_row_buffers(rows: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two float64 ``[rows, vocab]`` CPU buffers, kept per thread between calls and grown on demand.

    Fresh buffers of this size are mapped anew on every call (the allocator returns them to the
    system), and on this VM faulting the pages in costs more than the arithmetic done in them."""
    cached = getattr(_BUFFERS, "final_rows", None)
    if cached is None or cached.shape[1] < rows * vocab:
        cached = _BUFFERS.final_rows = torch.empty(2, rows * vocab, dtype=torch.float64)
    return cached[0, : rows * vocab].view(rows, vocab), cached[1, : rows * vocab].view(rows, vocab)


def _row_picker(probs: torch.Tensor, positions: torch.Tensor) -> Callable[[slice], torch.Tensor]:
    """``chunk -> probs[b, positions[b]]`` for the rows ``b`` of a slice ``chunk`` (a copy, ``[R, V]``).

    Reads only the selected rows: an ``index_select`` on the ``[B*P, V]`` view when the first
    two dimensions flatten without a copy (contiguous inputs), advanced indexing otherwise.
    """
    batch, width, _ = probs.shape
    rows = torch.arange(batch, device=probs.device)
    if probs.stride(0) == width * probs.stride(1):
        flat, flat_rows = probs.flatten(0, 1), rows * width + positions
        return lambda chunk: flat.index_select(0, flat_rows[chunk])
    return lambda chunk: probs[rows[chunk], positions[chunk]]


def _final_cdf(p_final: torch.Tensor, q_final: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Cumulative sums (float64 ``[R, V]``) of each row's unnormalised final distribution.

    Rejected rows: ``(p_n - q_n)+``, computed as ``max(p + q * (-1), 0)`` (``q * (-1)`` is exact,
    so this is ``p - q`` rounded once); accepted rows: ``p + q * (-0) = p`` exactly (the clamp is
    then a no-op).  Rejected rows whose float64 residual rounds to all zeros (the rounding
    fallback of :func:`rejection_sample`, detected as a zero total) take the cumulative sums of
    ``p_n`` instead.  Two float64 buffers, every update in place; the fallback rows are copied
    only when there are any (one host read of a ``[R]`` flag; none on CUDA, where every row's
    ``p_n`` sums are formed with ``torch.where``).
    """
    p = p_final.to(torch.float64, copy=True)  # kept for the fallback
    weights = q_final.to(torch.float64)
    minus_rejected = rejected.to(torch.float64).neg_()[:, None]
    torch.addcmul(p, weights, minus_rejected, out=weights).clamp_(min=0)
    cumulative = weights.cumsum_(-1)
    fallback = rejected & (cumulative[:, -1] <= 0)
    if cumulative.device.type != "cpu":
        return torch.where(fallback[:, None], p.cumsum_(-1), cumulative)
    if fallback.any():
        cumulative[fallback] = p[fallback].cumsum_(-1)
    return cumulative


def point_mass_verify(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    num_draft: torch.Tensor | None = None,
    validate: bool = True,
) -> VerifyResult:
    """Rejection sampling for deterministic drafts (n-gram / prompt lookup, draft top-1): lossless.

    A deterministic draft is a draw from the point mass ``q_i = onehot(x_i)``; modified rejection
    sampling (Leviathan et al. 2023 Algorithm 1) with that ``q`` accepts ``x_i`` iff
    ``u_i < p_i(x_i)`` and, at the first rejection ``n``, samples from
    ``(p_n - onehot(x_n))+ / sum(...)``, i.e. ``p_n`` with ``x_n`` zeroed and renormalised; the bonus
    is drawn from ``p_K``.  Then ``P(first token = t) = p(x)[t = x] + (1 - p(x)) p(t)/(1 - p(x))[t != x]
    = p(t)``.  The law is exact conditionally on every draft path, so the rule is lossless for any
    drafts chosen independently of the step's uniforms (sampled ones too, at a lower acceptance
    rate than :func:`rejection_sample`).  Same uniform convention, ragged rows and numerics as
    :func:`rejection_sample`; the rounding fallback (residual with no mass while ``p_n(x_n) < 1``
    by rounding) draws from ``p_n``.
    """
    if validate:
        _check_structure(target_probs, None, draft_tokens, generator, uniforms, num_draft, True)
    fused = _native("point_mass", target_probs, None, draft_tokens, generator, uniforms, num_draft, validate)
    if fused is not None:
        return fused
    if validate:
        validate_verify_inputs(target_probs, None, draft_tokens, generator, uniforms=uniforms, num_draft=num_draft)
    u = _step_uniforms(target_probs, generator, uniforms)
    drafts, in_draft = _draft_layout(target_probs, draft_tokens, num_draft)

    p_at_draft = _prob_at_tokens(target_probs[:, :-1], draft_tokens, in_draft)
    accept = in_draft & (u[:, :-1] < p_at_draft)
    num_accepted = _leading_accepts(accept)

    rejected = num_accepted < drafts
    p_final = _rows_at(target_probs, num_accepted).to(torch.float64)
    safe_tokens = torch.where(in_draft, draft_tokens, 0)
    rejected_token = safe_tokens.gather(-1, num_accepted.clamp(max=draft_tokens.shape[1] - 1).unsqueeze(-1))
    residual = p_final.scatter(-1, rejected_token, 0.0)
    use_residual = rejected & (residual.sum(-1) > 0)
    final_weights = torch.where(use_residual[:, None], residual, p_final)
    final_token = inverse_cdf(final_weights, u[:, -1], in_place=True)
    return VerifyResult(_emit(draft_tokens, num_accepted, final_token), num_accepted)


def greedy_verify(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    num_draft: torch.Tensor | None = None,
    validate: bool = True,
) -> VerifyResult:
    """Greedy verification: accept ``x_i`` while ``x_i == argmax p_i``, then emit ``argmax p_n``.

    ``argmax`` is ``torch.argmax`` (the first maximal index on ties).  The emitted tokens are
    always a prefix of the target's own greedy decoding (the temperature-0 limit of Leviathan et
    al. 2023 Algorithm 1, where ``p`` is a point mass).  Uses no randomness.
    """
    if validate:
        _check_structure(target_probs, None, draft_tokens, None, None, num_draft, False)
    fused = _native("greedy", target_probs, None, draft_tokens, None, None, num_draft, validate)
    if fused is not None:
        return fused
    if validate:
        validate_verify_inputs(target_probs, None, draft_tokens, num_draft=num_draft, needs_randomness=False)
    drafts, in_draft = _draft_layout(target_probs, draft_tokens, num_draft)

    greedy_tokens = target_probs.argmax(-1)  # [B, K+1]
    accept = in_draft & (draft_tokens == greedy_tokens[:, :-1])
    num_accepted = _leading_accepts(accept)
    final_token = greedy_tokens.gather(-1, num_accepted.unsqueeze(-1)).squeeze(-1)
    return VerifyResult(_emit(draft_tokens, num_accepted, final_token), num_accepted)


def typical_acceptance_verify(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    threshold: float = 0.09,
    alpha: float = 0.3,
    num_draft: torch.Tensor | None = None,
    validate: bool = True,
) -> VerifyResult:
    """Medusa typical acceptance (Cai et al. 2024, "Medusa", §2.3.1). **LOSSY: it does not sample
    from the target.**  It exists so that users and tests can watch a lossy rule being caught.

    Accept ``x_i`` while ``p_i(x_i) > min(threshold, alpha * exp(-H(p_i)))`` with
    ``H(p) = -sum p log p`` (natural log, ``0 log 0 = 0``); the acceptance is deterministic, so the
    uniform columns ``i < K`` are unused.  At the first rejection ``n`` emit a token drawn from
    ``p_n`` (not from a residual), or the bonus from ``p_{n_b}`` when all drafts pass, by inverse
    CDF with ``u_K``.  With ``A`` the set of tokens that pass, the first token has the law
    ``P(t) = q(t) [t in A] + q(not A) p(t)``, not ``p``: e.g. ``p = [0.5, 0.5]``, ``q = [0.9, 0.1]``
    passes both tokens and emits token 0 with probability 0.9 (total variation 0.4).
    """
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold: expected a finite number >= 0 (Medusa uses 0.09), got {threshold!r}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha: expected a finite number >= 0 (Medusa uses 0.3), got {alpha!r}")
    if validate:
        validate_verify_inputs(target_probs, None, draft_tokens, generator, uniforms=uniforms, num_draft=num_draft)
    u = _step_uniforms(target_probs, generator, uniforms)
    drafts, in_draft = _draft_layout(target_probs, draft_tokens, num_draft)

    draft_positions = target_probs[:, :-1]
    entropy_input = draft_positions if draft_positions.dtype in (torch.float32,
                                                                 torch.float64) else draft_positions.float()
    entropy = torch.special.entr(entropy_input).sum(-1, dtype=torch.float64)  # [B, K]
    bar = torch.clamp(alpha * torch.exp(-entropy), max=threshold)
    p_at_draft = _prob_at_tokens(draft_positions, draft_tokens, in_draft)
    accept = in_draft & (p_at_draft > bar)
    num_accepted = _leading_accepts(accept)

    p_final = _rows_at(target_probs, num_accepted).to(torch.float64)
    final_token = inverse_cdf(p_final, u[:, -1], in_place=True)
    return VerifyResult(_emit(draft_tokens, num_accepted, final_token), num_accepted)


# --------------------------------------------------------------------------------------------
# SPEC §1 adapters: (target_probs, draft_probs, draft_tokens, generator) -> emitted [B, K+1].
# Each also takes ``uniforms=`` so that specverify.core.exact can drive it exactly, and
# ``num_draft_tokens=`` (ragged rows, docs/spec.md §1).
# --------------------------------------------------------------------------------------------


def verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    num_draft_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The built-in ``reference`` sampler (SPEC §1): :func:`rejection_sample`'s emitted tokens
    (``num_draft_tokens``: the ragged rows of docs/spec.md §1, passed as ``num_draft``)."""
    return rejection_sample(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms,
                            num_draft=num_draft_tokens).emitted


def point_mass_as_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    num_draft_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """SPEC §1 adapter of :func:`point_mass_verify`; ``draft_probs`` is ignored (each draft is
    treated as a point mass; lossless for any drafts independent of the step's randomness)."""
    return point_mass_verify(target_probs, draft_tokens, generator, uniforms=uniforms,
                             num_draft=num_draft_tokens).emitted


def greedy_as_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    num_draft_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """SPEC §1 adapter of :func:`greedy_verify`; ``draft_probs``, ``generator`` and ``uniforms`` are
    accepted and ignored (greedy verification uses no randomness)."""
    return greedy_verify(target_probs, draft_tokens, num_draft=num_draft_tokens).emitted


def typical_acceptance_as_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    num_draft_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """SPEC §1 adapter of :func:`typical_acceptance_verify` (LOSSY, Medusa defaults
    ``threshold=0.09``, ``alpha=0.3``); ``draft_probs`` is ignored."""
    return typical_acceptance_verify(target_probs, draft_tokens, generator, uniforms=uniforms,
                                     num_draft=num_draft_tokens).emitted


# The rules compute in float64 whatever their inputs' dtype (module docstring), so the exact check
# holds them to the float64 bound (specverify.core.rounding).
for _rule in (verify, point_mass_as_verify, greedy_as_verify, typical_acceptance_as_verify):
    _rule.arithmetic = "float64"  # type: ignore[attr-defined]  # declared on the function (rounding.py)
del _rule


def accepts_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn``'s signature has a parameter ``name`` (False when it cannot be read): how the
    audit learns which optional keywords of docs/spec.md §1 a function takes."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def accepts_uniforms(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes ``uniforms=``: the uniform convention of the rules above
    (docs/ARCHITECTURE.md), which lets :mod:`specverify.core.exact` integrate it exactly."""
    return accepts_keyword(fn, "uniforms")


def accepts_num_draft_tokens(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes ``num_draft_tokens=`` (int64 ``[B]``): row b uses only its first ``k_b``
    drafts (docs/spec.md §1), so the audit can call it on ragged batches."""
    return accepts_keyword(fn, "num_draft_tokens")
