"""Known-bug catalog: buggy verification rules modelled on mistakes real engines shipped.

Each entry is a :class:`BuggyRule` whose ``fn`` has the SPEC §1 signature plus ``uniforms=``
(``fn(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None)`` returning
``emitted [B, K+1]`` int64, ``-1`` padded).  The entries aim at bug *classes* (acceptance test,
residual, bonus, indexing, randomness, batching, processing mismatch), so that a check which
catches an entry also catches the unpublished implementations that make the same mistake.

The correct rule, for reference (Leviathan et al. 2023 Algorithm 1; Chen et al. 2023
Algorithm 2): accept ``x_i`` iff ``u_i q_i(x_i) < p_i(x_i)``; at the first rejection ``n`` draw the
correction from ``(p_n - q_n)+``; if all ``K`` drafts pass draw the bonus from ``p_K``.  Each
entry below (except the Medusa rule, a different rule altogether) changes one piece of it,
marked ``# BUG`` in its body, and its ``description`` states the resulting mathematical error.

Uniform convention (docs/ARCHITECTURE.md): ``u [B, K+1]``, column ``i < K`` for the accept test of
draft ``i``, column ``K`` for the inverse-CDF draw of the final token (the first ``t`` with
``cumsum(r)[t] > u_K sum(r)``); with a generator the entries draw exactly
``torch.rand(B, K+1, generator=generator, dtype=torch.float64)``.  Every entry with
``integrable=True`` follows it, so its step law can be integrated exactly over the uniforms
(``zero_uniform_accepts`` moves acceptance thresholds by less than 2^-8, which an integrator must
resolve: its breakpoints sit at ``(floor(256 p/q) + 1) / 256``).  The two random-state entries
(``integrable=False``) are about where randomness comes from, so they ignore ``uniforms`` (and the
generator) and can only be caught statistically or by reproducibility.  The ragged-row entries
(``ragged_only``) also take ``num_draft_tokens=`` (docs/spec.md §1) and verify in the flattened
layout of vLLM V1 (:func:`flatten_ragged`, :func:`verify_flattened`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specverify.core.rules import validate_verify_inputs
from specverify.core.sampling import inverse_cdf, search_cdf

__all__ = ["BuggyRule", "CATALOG", "COARSE_UNIFORM_STEP", "DRAFT_TEMPERATURE", "VOCABULARY_TILE", "LAST_TILE",
           "HALF_PRECISION_FROM_VOCAB", "LIBRARY_TOP_K", "SPECIALISED_DRAFTS", "WIDE_SPECIALISED_DRAFTS", "ROW_BLOCK",
           "Flattened", "flatten_ragged", "verify_flattened", "ragged_reference"]

COARSE_UNIFORM_STEP = 2.0**-8  # resolution of the uniforms in `zero_uniform_accepts` (bfloat16-like)
DRAFT_TEMPERATURE = 0.7  # the temperature `draft_temperature_in_acceptance` re-applies to q
VOCABULARY_TILE = 1 << 16  # `vocabulary_tile_drops_high_ids` scans one tile of 65,536 ids
LAST_TILE = 128  # `partial_last_tile_dropped` tiles V by 128 and drops the remainder
HALF_PRECISION_FROM_VOCAB = 32_768  # `half_precision_cdf_at_large_vocab` switches above this V
LIBRARY_TOP_K = 50  # the top-k `bonus_library_top_k` applies to the bonus draw
SPECIALISED_DRAFTS = 8  # `draft_length_specialised_kernel` is right for K <= 8
WIDE_SPECIALISED_DRAFTS = 16  # `draft_length_specialised_to_16` is right for K <= 16
ROW_BLOCK = 256  # `row_block_offset_dropped` launches blocks of 256 rows
BONUS_TEMPERATURE = 1.1  # `bonus_tempered_at_large_vocab` draws the bonus at this temperature
TEMPERED_FROM_VOCAB = 32_768  # ... above this V


@dataclass(frozen=True)
class BuggyRule:
    """One catalog entry.

    name: the key in :data:`CATALOG` (``catalog:<name>`` in ``specverify.auditing.loading``);
    description: the exact mathematical error;
    modelled_on: the real-world bug or pattern it reproduces;
    bug_class: one of ``acceptance``, ``residual``, ``bonus``, ``indexing``, ``randomness``,
    ``batching``, ``processing``, ``lossy-by-design``;
    fn: the rule (SPEC §1 signature plus ``uniforms=``).
    Extensions of the ARCHITECTURE.md contract (all defaulted):
    integrable: ``fn`` follows the uniform convention, so its law can be integrated exactly;
    min_batch_size: the smallest batch on which the bug can show (2 for cross-row bugs, whose
    law on one row depends on the other rows of the call);
    min_vocab_size, min_num_draft, input_dtypes, strided_only: the production-shape bugs show only
    from this vocabulary size or number of drafts, for these input dtypes (None: all), or on inputs
    passed as strided views (:meth:`shows_at`);
    ragged_only: the bug shows only on ragged rows (``fn`` takes ``num_draft_tokens=``, docs/spec.md
    §1, and is exact when every row has all K drafts): only the ragged checks can see it.
    """

    name: str
    description: str
    modelled_on: str
    bug_class: str
    fn: Callable[..., torch.Tensor]
    integrable: bool = True
    min_batch_size: int = 1
    min_vocab_size: int = 1
    min_num_draft: int = 1
    input_dtypes: tuple[str, ...] | None = None
    strided_only: bool = False
    ragged_only: bool = False

    @property
    def production_shaped(self) -> bool:
        """True when the bug cannot show at the toy shapes of the structural checks and the property
        suite (V ≤ 6, K ≤ 8, two rows, contiguous float32) but does on full rows at production
        shapes: only the production checks (``exact-large-vocabulary``, ``production-*``) can see it."""
        return not self.ragged_only and not self.shows_at(vocab_size=6, num_draft=8, batch_size=2)

    def shows_at(self, *, vocab_size: int, num_draft: int, batch_size: int = 1, dtype: str = "float32",
                 strided: bool = False, ragged: bool = False) -> bool:
        """Whether the bug can show on a call of this shape (the production-shape fields; ``ragged``:
        rows with fewer than K drafts, passed as ``num_draft_tokens=``)."""
        return ((ragged or not self.ragged_only) and vocab_size >= self.min_vocab_size
                and num_draft >= self.min_num_draft
                and batch_size >= self.min_batch_size and (self.input_dtypes is None or dtype in self.input_dtypes)
                and (strided or not self.strided_only))


# ------------------------------------------------------------------------------------------------
# The shared skeleton: each piece of modified rejection sampling as one small function
# ------------------------------------------------------------------------------------------------


def _step_inputs(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None,
    uniforms: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validated float64 ``p [B, K+1, V]``, ``q [B, K, V]`` and the step's uniforms ``u [B, K+1]``."""
    validate_verify_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms)
    p, q = target_probs.to(torch.float64), draft_probs.to(torch.float64)
    if uniforms is not None:
        return p, q, uniforms.to(torch.float64)
    batch, positions = target_probs.shape[:2]
    return p, q, torch.rand(batch, positions, generator=generator, dtype=torch.float64, device=p.device)


def _at(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``probs[b, i, tokens[b, i]]``: ``[B, K]``."""
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _ratio_test(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Correct accept test ``u_i q_i(x_i) < p_i(x_i)``, i.e. probability ``min(1, p/q)``: bool ``[B, K]``."""
    return u[:, :-1] * _at(q, tokens) < _at(p[:, :-1], tokens)


def _leading_run(accepted: torch.Tensor) -> torch.Tensor:
    """Number of accepted drafts: the length of the leading run of passed tests, ``[B]``."""
    return accepted.to(torch.int64).cumprod(-1).sum(-1)


def _residuals(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``(p_i - q_i)+`` for ``i < K``: ``[B, K, V]`` (unnormalised)."""
    return (p[:, :-1] - q).clamp(min=0)


def _with_bonus(corrections: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """Final-distribution table ``[B, K+1, V]``: row ``n < K`` after a rejection at ``n``, row ``K`` the bonus."""
    return torch.cat([corrections, bonus.unsqueeze(1)], dim=1)


def _row(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[b, index[b]]``: ``[B, V]``."""
    return table[torch.arange(table.shape[0], device=table.device), index]


def _finish(
    p: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_accepted: torch.Tensor,
    weights: torch.Tensor,
    u_final: torch.Tensor,
) -> torch.Tensor:
    """``emitted [B, K+1]``: the first ``num_accepted`` drafts, a token drawn from ``weights``, then -1.

    A weights row without mass falls back to ``p`` at position ``num_accepted`` (what engines do to
    avoid a division by zero); the correct rule never needs it except through rounding.
    """
    fallback = _row(p, num_accepted)
    weights = torch.where(weights.sum(-1, keepdim=True) > 0, weights, fallback)
    return _emit_final(draft_tokens, num_accepted, inverse_cdf(weights, u_final))


def _emit_final(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, final_token: torch.Tensor) -> torch.Tensor:
    """``emitted [B, K+1]``: the first ``num_accepted`` drafts, ``final_token``, then -1."""
    batch, num_draft = draft_tokens.shape
    columns = torch.arange(num_draft + 1, device=draft_tokens.device)
    drafts = torch.cat([draft_tokens, draft_tokens.new_full((batch, 1), -1)], dim=1)
    emitted = torch.where(columns < num_accepted.unsqueeze(-1), drafts, -1)
    return torch.where(columns == num_accepted.unsqueeze(-1), final_token.unsqueeze(-1), emitted)


def _correct_step(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Modified rejection sampling on float64 inputs and given uniforms (no bug)."""
    num_accepted = _leading_run(_ratio_test(p, q, draft_tokens, u))
    table = _with_bonus(_residuals(p, q), p[:, -1])
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


# ------------------------------------------------------------------------------------------------
# Acceptance-test bugs
# ------------------------------------------------------------------------------------------------


def zero_uniform_accepts(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """Accept iff ``floor_8(u) q(x) <= p(x)``: coarse uniforms that can be 0, and ``<=``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    coarse = torch.floor(u[:, :-1] / COARSE_UNIFORM_STEP) * COARSE_UNIFORM_STEP  # BUG: 8-bit uniforms, 0 included
    accepted = coarse * _at(q, draft_tokens) <= _at(p[:, :-1], draft_tokens)  # BUG: <= accepts p(x) = 0 at u = 0
    num_accepted = _leading_run(accepted)
    table = _with_bonus(_residuals(p, q), p[:, -1])
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


def inverted_ratio(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """Accept with probability ``min(1, q/p)`` instead of ``min(1, p/q)``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    accepted = u[:, :-1] * _at(p[:, :-1], draft_tokens) < _at(q, draft_tokens)  # BUG: ratio upside down
    num_accepted = _leading_run(accepted)
    table = _with_bonus(_residuals(p, q), p[:, -1])
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


def greedy_acceptance_when_sampling(
    target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None
) -> torch.Tensor:
    """Accept iff the draft is ``argmax p``; on rejection sample from ``p``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    accepted = draft_tokens == p[:, :-1].argmax(-1)  # BUG: greedy acceptance for a sampled request
    num_accepted = _leading_run(accepted)
    return _finish(p, draft_tokens, num_accepted, _row(p, num_accepted), u[:, -1])


def counts_every_passing_test(
    target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None
) -> torch.Tensor:
    """Number accepted = how many tests passed anywhere, not the leading run of passes."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    accepted = _ratio_test(p, q, draft_tokens, u)
    num_accepted = accepted.to(torch.int64).sum(-1)  # BUG: keeps counting after the first rejection
    table = _with_bonus(_residuals(p, q), p[:, -1])
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


# ------------------------------------------------------------------------------------------------
# Residual (correction distribution) bugs
# ------------------------------------------------------------------------------------------------


def residual_is_target(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """Correction drawn from ``p_n`` instead of ``(p_n - q_n)+``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    num_accepted = _leading_run(_ratio_test(p, q, draft_tokens, u))
    table = p  # BUG: rows n < K are p_n, not (p_n - q_n)+
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


def residual_softmax(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """Correction drawn from ``softmax((p_n - q_n)+)`` instead of ``(p_n - q_n)+ / Σ``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    num_accepted = _leading_run(_ratio_test(p, q, draft_tokens, u))
    table = _with_bonus(torch.softmax(_residuals(p, q), dim=-1), p[:, -1])  # BUG: softmax normalisation
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


def residual_absolute(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """Correction drawn from ``|p_n - q_n|`` instead of ``max(0, p_n - q_n)``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    num_accepted = _leading_run(_ratio_test(p, q, draft_tokens, u))
    table = _with_bonus((p[:, :-1] - q).abs(), p[:, -1])  # BUG: abs instead of clamp at 0
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


# ------------------------------------------------------------------------------------------------
# Bonus and position-indexing bugs
# ------------------------------------------------------------------------------------------------


def bonus_from_draft(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """Bonus token drawn from the last draft distribution ``q_{K-1}`` instead of ``p_K``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    num_accepted = _leading_run(_ratio_test(p, q, draft_tokens, u))
    table = _with_bonus(_residuals(p, q), q[:, -1])  # BUG: bonus from q_{K-1}
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


def bonus_from_previous_position(
    target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None
) -> torch.Tensor:
    """Bonus token drawn from ``p_{K-1}`` (the last draft's position) instead of ``p_K``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    num_accepted = _leading_run(_ratio_test(p, q, draft_tokens, u))
    table = _with_bonus(_residuals(p, q), p[:, -2])  # BUG: bonus from p_{K-1}
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


def target_off_by_one(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """Draft ``i`` scored (test and residual) against ``p_{i+1}`` instead of ``p_i``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    shifted = torch.cat([p[:, 1:], p[:, -1:]], dim=1)  # BUG: position i reads p_{i+1}; the bonus stays p_K
    num_accepted = _leading_run(_ratio_test(shifted, q, draft_tokens, u))
    table = _with_bonus(_residuals(shifted, q), p[:, -1])
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


def correction_one_position_late(
    target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None
) -> torch.Tensor:
    """After a rejection at ``n`` the final token comes from table row ``n + 1``, not ``n``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    num_accepted = _leading_run(_ratio_test(p, q, draft_tokens, u))
    table = _with_bonus(_residuals(p, q), p[:, -1])
    late = (num_accepted + 1).clamp(max=draft_tokens.shape[1])  # BUG: index shifted by one
    return _finish(p, draft_tokens, num_accepted, _row(table, late), u[:, -1])


# ------------------------------------------------------------------------------------------------
# Randomness bugs
# ------------------------------------------------------------------------------------------------


def shared_accept_uniform(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """One uniform ``u_0`` reused for every accept test of the row."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    shared = torch.cat([u[:, :1].expand(-1, draft_tokens.shape[1]), u[:, -1:]], dim=1)  # BUG: u_i = u_0
    num_accepted = _leading_run(_ratio_test(p, q, draft_tokens, shared))
    table = _with_bonus(_residuals(p, q), p[:, -1])
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


def correction_reuses_accept_uniform(
    target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None
) -> torch.Tensor:
    """After a rejection at ``n`` the correction is drawn with ``u_n``, the uniform that rejected."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    num_accepted = _leading_run(_ratio_test(p, q, draft_tokens, u))
    table = _with_bonus(_residuals(p, q), p[:, -1])
    reused = u.gather(1, num_accepted.unsqueeze(1)).squeeze(1)  # BUG: u_n (>= p/q given the rejection), not u_K
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), reused)


def global_torch_rng(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """Correct rule, but its uniforms come from the global torch RNG (statistical-only)."""
    validate_verify_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms)
    batch, positions = target_probs.shape[:2]
    u = torch.rand(batch, positions, dtype=torch.float64, device=target_probs.device)  # BUG: generator ignored
    return _correct_step(target_probs.to(torch.float64), draft_probs.to(torch.float64), draft_tokens, u)


def reseeded_every_call(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """Correct rule, but every call draws its uniforms from a fresh generator seeded 0 (statistical-only)."""
    validate_verify_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms)
    batch, positions = target_probs.shape[:2]
    fixed = torch.Generator(device=target_probs.device).manual_seed(0)  # BUG: same stream on every step
    u = torch.rand(batch, positions, generator=fixed, dtype=torch.float64, device=target_probs.device)
    return _correct_step(target_probs.to(torch.float64), draft_probs.to(torch.float64), draft_tokens, u)


# ------------------------------------------------------------------------------------------------
# Processing and batching bugs
# ------------------------------------------------------------------------------------------------


def draft_temperature_in_acceptance(
    target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None
) -> torch.Tensor:
    """Test and residual use ``q' ∝ q^(1/0.7)`` although the drafts were drawn from ``q``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    sharpened = q ** (1.0 / DRAFT_TEMPERATURE)  # BUG: q re-processed on the verification side only
    sharpened = sharpened / sharpened.sum(-1, keepdim=True)
    num_accepted = _leading_run(_ratio_test(p, sharpened, draft_tokens, u))
    table = _with_bonus(_residuals(p, sharpened), p[:, -1])
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


def batch_rows_rolled(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """Row ``b``'s correction uses row ``(b+1) % B``'s target: ``(p^{b+1}_n - q^b_n)+``."""
    p, q, u = _step_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms)
    num_accepted = _leading_run(_ratio_test(p, q, draft_tokens, u))
    neighbour = p.roll(-1, dims=0)  # BUG: per-request index mapping off by one row
    table = _with_bonus(_residuals(neighbour, q), p[:, -1])
    return _finish(p, draft_tokens, num_accepted, _row(table, num_accepted), u[:, -1])


def typical_acceptance(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """Medusa typical acceptance (``specverify.core.rules.typical_acceptance_as_verify``): lossy by design."""
    from specverify.core.rules import typical_acceptance_as_verify

    return typical_acceptance_as_verify(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms)


# ------------------------------------------------------------------------------------------------
# Production-shape bugs: right at toy shapes, wrong at the vocabularies, draft lengths, batch
# sizes, dtypes and layouts engines serve.  Each corrupts one piece and keeps the rest
# of modified rejection sampling exact (float64), so each declares ``arithmetic = "float64"``.
# ------------------------------------------------------------------------------------------------


def _production_step(target_probs, draft_probs, draft_tokens, generator, uniforms, *, validate=True):
    """Validated inputs of a production-shape entry and the correct accept decisions, touching
    only the entries the rule needs (large V): the step's uniforms ``u [B, K+1]`` (drawn as
    :func:`_step_inputs` draws them) and ``n`` the accepted drafts (``u_i q_i(x_i) < p_i(x_i)``
    on the float64 values)."""
    if validate:
        validate_verify_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms)
    batch, positions = target_probs.shape[:2]
    if uniforms is not None:
        u = uniforms.to(torch.float64)
    else:
        u = torch.rand(batch, positions, generator=generator, dtype=torch.float64, device=target_probs.device)
    tokens = draft_tokens.unsqueeze(-1)
    p_at = target_probs[:, :-1].gather(-1, tokens).squeeze(-1).to(torch.float64)
    q_at = draft_probs.gather(-1, tokens).squeeze(-1).to(torch.float64)
    return u, _leading_run(u[:, :-1] * q_at < p_at)


def _final_laws(target_probs, draft_probs, num_accepted, target_row=None, rows=None):
    """float64 ``p [B, V]`` (target row ``target_row``, default ``num_accepted``) and ``q [B, V]``
    (draft row ``num_accepted``, zero after every draft passed) of each row's final draw, read
    from rows ``rows`` of the batch (default: the row itself)."""
    batch, num_draft = draft_probs.shape[:2]
    rows = torch.arange(batch, device=target_probs.device) if rows is None else rows
    target_row = num_accepted if target_row is None else target_row
    p = target_probs[rows, target_row].to(torch.float64)
    q = draft_probs[rows, num_accepted.clamp(max=num_draft - 1)].to(torch.float64)
    return p, torch.where((num_accepted < num_draft).unsqueeze(-1), q, 0.0)


def _draw_final(draft_tokens, num_accepted, p, weights, u_final, cumulative_dtype=None):
    """The emitted rows with the final token drawn from ``weights`` (``p`` where they have no
    mass), by inverse CDF; ``cumulative_dtype`` keeps the cumulative sums in that precision."""
    weights = torch.where(weights.sum(-1, keepdim=True) > 0, weights, p)
    cumulative = weights.cumsum(-1)
    if cumulative_dtype is not None:
        cumulative = cumulative.to(cumulative_dtype).to(torch.float64)
    return _emit_final(draft_tokens, num_accepted, search_cdf(cumulative, u_final))


def vocabulary_tile_drops_high_ids(target_probs, draft_probs, draft_tokens, generator=None, *,
                                   uniforms=None) -> torch.Tensor:
    """The final draw scans only the first tile of 65,536 ids: tokens past id 65,535 get no mass."""
    u, n = _production_step(target_probs, draft_probs, draft_tokens, generator, uniforms)
    p, q = _final_laws(target_probs, draft_probs, n)
    weights = (p - q).clamp(min=0)
    weights[:, VOCABULARY_TILE:] = 0.0  # BUG: one tile of 2^16 ids (16-bit in-tile index)
    return _draw_final(draft_tokens, n, p, weights, u[:, -1])


def partial_last_tile_dropped(target_probs, draft_probs, draft_tokens, generator=None, *,
                              uniforms=None) -> torch.Tensor:
    """The final draw runs over whole tiles of 128 ids: for V > 128 the last ``V mod 128`` ids get no mass."""
    u, n = _production_step(target_probs, draft_probs, draft_tokens, generator, uniforms)
    p, q = _final_laws(target_probs, draft_probs, n)
    weights = (p - q).clamp(min=0)
    vocab = weights.shape[-1]
    if vocab > LAST_TILE:
        weights[:, vocab - vocab % LAST_TILE:] = 0.0  # BUG: V // 128 full tiles; the partial one is skipped
    return _draw_final(draft_tokens, n, p, weights, u[:, -1])


def half_precision_cdf_at_large_vocab(target_probs, draft_probs, draft_tokens, generator=None, *,
                                      uniforms=None) -> torch.Tensor:
    """Above V = 32,768 the final draw inverts a cumulative sum stored in float16."""
    u, n = _production_step(target_probs, draft_probs, draft_tokens, generator, uniforms)
    p, q = _final_laws(target_probs, draft_probs, n)
    large = p.shape[-1] > HALF_PRECISION_FROM_VOCAB
    # BUG: the large-vocabulary path keeps its CDF in float16
    return _draw_final(draft_tokens, n, p, (p - q).clamp(min=0), u[:, -1], torch.float16 if large else None)


def bonus_library_top_k(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """The bonus token is drawn from ``p_K`` cut to its 50 most likely tokens (a library default)."""
    u, n = _production_step(target_probs, draft_probs, draft_tokens, generator, uniforms)
    p, q = _final_laws(target_probs, draft_probs, n)
    weights = (p - q).clamp(min=0)
    bonus = n == draft_tokens.shape[1]
    if weights.shape[-1] > LIBRARY_TOP_K and bool(bonus.any()):  # BUG: top_k=50 on the bonus path only
        order = torch.sort(weights[bonus], dim=-1, descending=True, stable=True).indices
        cut = torch.zeros_like(weights[bonus]).scatter(-1, order[:, LIBRARY_TOP_K:], 1.0)
        weights[bonus] = weights[bonus].masked_fill(cut.bool(), 0.0)
    return _draw_final(draft_tokens, n, p, weights, u[:, -1])


def bonus_tempered_at_large_vocab(target_probs, draft_probs, draft_tokens, generator=None, *,
                                  uniforms=None) -> torch.Tensor:
    """Above V = 32,768 the bonus token is drawn from ``p_K^(1/1.1)`` renormalised: a temperature
    of 1.1 applied a second time on the bonus path; corrections and acceptance are correct."""
    u, n = _production_step(target_probs, draft_probs, draft_tokens, generator, uniforms)
    p, q = _final_laws(target_probs, draft_probs, n)
    weights = (p - q).clamp(min=0)
    bonus = n == draft_tokens.shape[1]
    if weights.shape[-1] > TEMPERED_FROM_VOCAB and bool(bonus.any()):  # BUG: the bonus re-tempered
        weights[bonus] = weights[bonus] ** (1.0 / BONUS_TEMPERATURE)
    return _draw_final(draft_tokens, n, p, weights, u[:, -1])


def _final_row_clamped(limit, target_probs, draft_probs, draft_tokens, generator, uniforms) -> torch.Tensor:
    """The step whose final draw reads target row ``min(n, limit)``: corrections at ``n > limit``
    use ``(p_limit − q_n)_+`` and the bonus ``p_limit``."""
    u, n = _production_step(target_probs, draft_probs, draft_tokens, generator, uniforms)
    read = n.clamp(max=limit)  # BUG: `limit` target rows in the kernel's registers
    p, q = _final_laws(target_probs, draft_probs, n, target_row=read)
    return _draw_final(draft_tokens, n, p, (p - q).clamp(min=0), u[:, -1])


def draft_length_specialised_kernel(target_probs, draft_probs, draft_tokens, generator=None, *,
                                    uniforms=None) -> torch.Tensor:
    """For K > 8 the final draw reads target row ``min(n, 8)``."""
    return _final_row_clamped(SPECIALISED_DRAFTS, target_probs, draft_probs, draft_tokens, generator, uniforms)


def draft_length_specialised_to_16(target_probs, draft_probs, draft_tokens, generator=None, *,
                                   uniforms=None) -> torch.Tensor:
    """For K > 16 the final draw reads target row ``min(n, 16)``."""
    return _final_row_clamped(WIDE_SPECIALISED_DRAFTS, target_probs, draft_probs, draft_tokens, generator, uniforms)


def row_block_offset_dropped(target_probs, draft_probs, draft_tokens, generator=None, *,
                             uniforms=None) -> torch.Tensor:
    """Rows are processed in blocks of 256 whose offset is dropped in the final draw: row ``b``
    draws its correction or bonus from the laws of row ``b mod 256``."""
    u, n = _production_step(target_probs, draft_probs, draft_tokens, generator, uniforms)
    source = torch.arange(target_probs.shape[0], device=target_probs.device) % ROW_BLOCK  # BUG: no block offset
    p, q = _final_laws(target_probs, draft_probs, n, rows=source)
    return _draw_final(draft_tokens, n, p, (p - q).clamp(min=0), u[:, -1])


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= size
    return tuple(reversed(strides))


def contiguous_stride_reads(target_probs, draft_probs, draft_tokens, generator=None, *,
                            uniforms=None) -> torch.Tensor:
    """Reads the probability tensors as if contiguous (``row * V + token`` offsets), whatever their strides."""
    validate_verify_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms)
    target_probs, draft_probs = (torch.as_strided(t, t.shape, _contiguous_strides(t.shape), t.storage_offset())
                                 for t in (target_probs, draft_probs))  # BUG: the real strides are ignored
    u, n = _production_step(target_probs, draft_probs, draft_tokens, generator, uniforms, validate=False)
    p, q = _final_laws(target_probs, draft_probs, n)
    return _draw_final(draft_tokens, n, p, (p - q).clamp(min=0), u[:, -1])


def bfloat16_cdf_path(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None) -> torch.Tensor:
    """For bfloat16 inputs the final draw inverts a cumulative sum stored in bfloat16."""
    u, n = _production_step(target_probs, draft_probs, draft_tokens, generator, uniforms)
    p, q = _final_laws(target_probs, draft_probs, n)
    in_bfloat16 = target_probs.dtype == torch.bfloat16
    # BUG: the bf16 instantiation accumulates its CDF in the input dtype
    return _draw_final(draft_tokens, n, p, (p - q).clamp(min=0), u[:, -1], torch.bfloat16 if in_bfloat16 else None)


for _production_bug in (vocabulary_tile_drops_high_ids, partial_last_tile_dropped, half_precision_cdf_at_large_vocab,
                        bonus_library_top_k, bonus_tempered_at_large_vocab, draft_length_specialised_kernel,
                        draft_length_specialised_to_16,
                        row_block_offset_dropped,
                        contiguous_stride_reads, bfloat16_cdf_path):
    # exact apart from the one corrupted piece
    _production_bug.arithmetic = "float64"  # type: ignore[attr-defined]  # declared on the function (rounding.py)


# ------------------------------------------------------------------------------------------------
# Ragged-batch bugs: the indexing of the flattened layout in which vLLM V1, SGLang and EAGLE verify
# requests with their own draft counts k_b (docs/spec.md §1, ``num_draft_tokens=``).  Each entry
# flattens the batch, verifies it there with one index corrupted, and is exact when every row has
# all K drafts (so only the ragged checks can see it).
# ------------------------------------------------------------------------------------------------


class Flattened(NamedTuple):
    """A ragged batch in the flattened layout: request b's drafts are rows ``cu[b] - k_b .. cu[b] - 1``
    of the ``[T + 1, V]`` tensors (``T = Σ k_b``, ``cu = cumsum(k)`` inclusive, as vLLM's
    ``cu_num_draft_tokens``); row T is slack after the drafts (a uniform law, token 0)."""

    target: torch.Tensor              # float64 [T+1, V]: p_i at each draft position
    draft: torch.Tensor               # float64 [T+1, V]: q_i
    tokens: torch.Tensor              # int64 [T+1]
    bonus: torch.Tensor               # float64 [B, V]: p_{k_b}, request b's bonus law
    num_draft_tokens: torch.Tensor    # int64 [B]
    cu_num_draft_tokens: torch.Tensor  # int64 [B]


def flatten_ragged(target_probs, draft_probs, draft_tokens, generator, uniforms, num_draft_tokens):
    """Validated inputs in the flattened layout, and the step's uniforms ``u [B, K+1]`` (drawn as
    :func:`_step_inputs` draws them); ``num_draft_tokens=None`` means K drafts in every row."""
    validate_verify_inputs(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms,
                           num_draft=num_draft_tokens)
    batch, positions, vocab = target_probs.shape
    p, q = target_probs.to(torch.float64), draft_probs.to(torch.float64)
    u = uniforms.to(torch.float64) if uniforms is not None else torch.rand(
        batch, positions, generator=generator, dtype=torch.float64, device=p.device)
    k = num_draft_tokens if num_draft_tokens is not None else torch.full((batch,), positions - 1, device=p.device)
    in_draft = torch.arange(positions - 1, device=p.device) < k[:, None]
    slack = torch.full((1, vocab), 1.0 / vocab, dtype=torch.float64, device=p.device)
    flat = Flattened(torch.cat([p[:, :-1][in_draft], slack]), torch.cat([q[in_draft], slack]),
                     torch.cat([draft_tokens[in_draft], draft_tokens.new_zeros(1)]),
                     p[torch.arange(batch, device=p.device), k], k, k.cumsum(0))
    return flat, u


def verify_flattened(flat: Flattened, u: torch.Tensor, first_draft: torch.Tensor, bonus: torch.Tensor,
                     num_draft_tokens: torch.Tensor) -> torch.Tensor:
    """Modified rejection sampling on the flattened layout: request b's draft i is flat row
    ``first_draft[b] + i`` for ``i < num_draft_tokens[b]``, tested with ``u[b, i]``; its final
    token is drawn with ``u[b, K]`` from the residual of the rejecting row or from ``bonus[b]``.
    The emitted rows repeat the flat tokens tested (``emitted [B, K+1]``)."""
    num_draft = u.shape[1] - 1
    last_row = flat.tokens.shape[0] - 1
    in_draft = torch.arange(num_draft, device=u.device) < num_draft_tokens[:, None]
    index = (first_draft[:, None] + torch.arange(num_draft, device=u.device)).clamp(0, last_row)
    index = torch.where(in_draft, index, last_row)
    tokens = flat.tokens[index]
    tested = tokens.unsqueeze(-1)
    accepted = in_draft & (u[:, :-1] * flat.draft[index].gather(-1, tested)[..., 0]
                           < flat.target[index].gather(-1, tested)[..., 0])
    num_accepted = _leading_run(accepted)
    rejected = (num_accepted < num_draft_tokens).unsqueeze(-1)
    at = index.gather(1, num_accepted.clamp(max=num_draft - 1).unsqueeze(-1))[:, 0]
    residual = (flat.target[at] - flat.draft[at]).clamp(min=0)
    weights = torch.where(rejected, residual, bonus)
    weights = torch.where(weights.sum(-1, keepdim=True) > 0, weights, torch.where(rejected, flat.target[at], bonus))
    return _emit_final(tokens, num_accepted, inverse_cdf(weights, u[:, -1]))


def ragged_reference(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None,
                     num_draft_tokens=None) -> torch.Tensor:
    """The flattened skeleton without a bug (lossless; the control of the ragged entries)."""
    flat, u = flatten_ragged(target_probs, draft_probs, draft_tokens, generator, uniforms, num_draft_tokens)
    first = flat.cu_num_draft_tokens - flat.num_draft_tokens
    return verify_flattened(flat, u, first, flat.bonus, flat.num_draft_tokens)


def ragged_bonus_at_padded_position(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None,
                                    num_draft_tokens=None) -> torch.Tensor:
    """The bonus law is read at the padded position K, ``target_probs[b, K]``, not at ``k_b``."""
    flat, u = flatten_ragged(target_probs, draft_probs, draft_tokens, generator, uniforms, num_draft_tokens)
    first = flat.cu_num_draft_tokens - flat.num_draft_tokens
    bonus = target_probs[:, -1].to(torch.float64)  # BUG: position K of the padded layout, not k_b
    return verify_flattened(flat, u, first, bonus, flat.num_draft_tokens)


def ragged_offsets_from_padded_width(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None,
                                     num_draft_tokens=None) -> torch.Tensor:
    """Request b's drafts are read from flat row ``cu[b] - K`` instead of ``cu[b] - k_b``."""
    flat, u = flatten_ragged(target_probs, draft_probs, draft_tokens, generator, uniforms, num_draft_tokens)
    first = flat.cu_num_draft_tokens - (u.shape[1] - 1)  # BUG: inclusive cumsum less the padded width K
    return verify_flattened(flat, u, first, flat.bonus, flat.num_draft_tokens)


def ragged_empty_row_takes_next_bonus(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None,
                                      num_draft_tokens=None) -> torch.Tensor:
    """Bonus laws gathered for the requests with drafts only, then handed out by batch index."""
    flat, u = flatten_ragged(target_probs, draft_probs, draft_tokens, generator, uniforms, num_draft_tokens)
    first = flat.cu_num_draft_tokens - flat.num_draft_tokens
    with_drafts = (flat.num_draft_tokens > 0).nonzero()[:, 0]  # BUG: empty requests dropped from the bonus rows
    rows = torch.arange(len(u), device=u.device)
    source = with_drafts[rows.clamp(max=len(with_drafts) - 1)] if len(with_drafts) else rows
    return verify_flattened(flat, u, first, flat.bonus[source], flat.num_draft_tokens)


def ragged_last_row_padding_read(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None,
                                 num_draft_tokens=None) -> torch.Tensor:
    """The last request is verified as if it had all K drafts: its padding is read as drafts."""
    batch, positions = target_probs.shape[:2]
    counts = num_draft_tokens.clone() if num_draft_tokens is not None else None
    if counts is not None and batch:
        counts[-1] = positions - 1  # BUG: the last request's count taken from the padded width
    flat, u = flatten_ragged(target_probs, draft_probs, draft_tokens, generator, uniforms, counts)
    first = flat.cu_num_draft_tokens - flat.num_draft_tokens
    return verify_flattened(flat, u, first, flat.bonus, flat.num_draft_tokens)


for _ragged_rule in (ragged_reference, ragged_bonus_at_padded_position, ragged_offsets_from_padded_width,
                     ragged_empty_row_takes_next_bonus, ragged_last_row_padding_read):
    _ragged_rule.arithmetic = "float64"  # type: ignore[attr-defined]  # declared on the function (rounding.py)


# ------------------------------------------------------------------------------------------------
# The catalog
# ------------------------------------------------------------------------------------------------

_ENTRIES = [
    BuggyRule(
        name="zero_uniform_accepts",
        description=(
            "Accept test `floor_8(u) * q(x) <= p(x)` where floor_8 rounds u down to a multiple of 2^-8 "
            "(uniforms with 8 significant bits, as when drawn in bfloat16), instead of `u * q(x) < p(x)`. "
            "The acceptance probability becomes min(1, (floor(256 p/q) + 1) / 256) instead of min(1, p/q): "
            "in particular a draft with p(x) = 0 is accepted with probability 2^-8 (u = 0 and 0 <= 0), "
            "emitting a token the target can never produce."
        ),
        modelled_on=(
            "inclusive acceptance `coin <= p/q` with coins from torch.rand, which can return exactly 0 "
            "(sgl-project/sglang issue 35771: a top-k/top-p-filtered token of target probability 0 accepted "
            "at the RNG boundary); low-precision uniforms make the zero coin frequent"
        ),
        bug_class="acceptance",
        fn=zero_uniform_accepts,
    ),
    BuggyRule(
        name="residual_is_target",
        description=(
            "After a rejection at position n the correction is drawn from p_n instead of "
            "norm(max(0, p_n - q_n)); the first token then has law min(p(t), q(t)) + (1 - α) p(t) with "
            "α = Σ min(p, q), instead of p(t): tokens with q > p are over-weighted."
        ),
        modelled_on="the most common tutorial mistake: 'on rejection just sample from the target'",
        bug_class="residual",
        fn=residual_is_target,
    ),
    BuggyRule(
        name="residual_softmax",
        description=(
            "Correction drawn from softmax(max(0, p_n - q_n)) instead of max(0, p_n - q_n) / Σ: softmax of "
            "a probability-like vector is close to uniform and gives positive mass (exp(0) = 1) to every "
            "token, including tokens with p_n = 0."
        ),
        modelled_on="normalising the residual with a softmax as if it were logits (a recurring code-review finding)",
        bug_class="residual",
        fn=residual_softmax,
    ),
    BuggyRule(
        name="residual_absolute",
        description=(
            "Correction drawn from norm(|p_n - q_n|) instead of norm(max(0, p_n - q_n)): tokens the draft "
            "over-proposed (q_n > p_n) receive correction mass q_n - p_n, although they were already "
            "emitted too often through acceptance."
        ),
        modelled_on="residual computed as an absolute difference (a distance) instead of the positive part",
        bug_class="residual",
        fn=residual_absolute,
    ),
    BuggyRule(
        name="bonus_from_draft",
        description=(
            "When all K drafts are accepted the bonus token is drawn from the draft's last distribution "
            "q_{K-1} instead of the target's p_K: the (K+1)-th token has law q_{K-1}."
        ),
        modelled_on="bonus token taken from the draft model's next sample instead of the target's extra logits row",
        bug_class="bonus",
        fn=bonus_from_draft,
    ),
    BuggyRule(
        name="bonus_from_previous_position",
        description=(
            "When all K drafts are accepted the bonus token is drawn from p_{K-1} (the target's row for the "
            "last draft) instead of p_K: the (K+1)-th token has the law of the K-th position."
        ),
        modelled_on="bonus logits row indexed with the number of draft tokens minus one (off by one row)",
        bug_class="bonus",
        fn=bonus_from_previous_position,
    ),
    BuggyRule(
        name="target_off_by_one",
        description=(
            "Draft token i is tested and corrected against p_{i+1} instead of p_i: accept with probability "
            "min(1, p_{i+1}(x_i) / q_i(x_i)), correct from max(0, p_{i+1} - q_i); modified rejection "
            "sampling then faithfully produces the wrong row: the first emitted token has law p_1, not p_0."
        ),
        modelled_on=(
            "target logits sliced one position late (logits[:, 1:] instead of logits[:, :-1]) when the "
            "verification forward pass includes the last accepted token"
        ),
        bug_class="indexing",
        fn=target_off_by_one,
    ),
    BuggyRule(
        name="inverted_ratio",
        description=(
            "Accept with probability min(1, q(x) / p(x)) instead of min(1, p(x) / q(x)): tokens the draft "
            "over-proposes are always accepted, tokens it under-proposes are thinned."
        ),
        modelled_on="acceptance ratio written as draft/target (swapped arguments)",
        bug_class="acceptance",
        fn=inverted_ratio,
    ),
    BuggyRule(
        name="correction_one_position_late",
        description=(
            "After a rejection at position n the final token is drawn from row n + 1 of the final-distribution "
            "table, i.e. from max(0, p_{n+1} - q_{n+1}) (or from p_K when n = K - 1), instead of "
            "max(0, p_n - q_n); acceptance is correct (min(1, p/q))."
        ),
        modelled_on="recovered-token index computed as num_accepted + 1 (counting the accepted token's own slot)",
        bug_class="indexing",
        fn=correction_one_position_late,
    ),
    BuggyRule(
        name="shared_accept_uniform",
        description=(
            "The same uniform u_0 is used for the accept tests of all K positions: the tests are comonotone "
            "instead of independent, so P(accept 0 and 1) = min(a_0, a_1) instead of a_0 a_1."
        ),
        modelled_on="one random number drawn per request (shape [B, 1]) and broadcast over the draft positions",
        bug_class="randomness",
        fn=shared_accept_uniform,
    ),
    BuggyRule(
        name="correction_reuses_accept_uniform",
        description=(
            "After a rejection at position n the correction token is drawn by inverse CDF with u_n, the "
            "uniform that was just rejected, instead of a fresh u_K; given the rejection u_n is uniform on "
            "[p/q, 1), not [0, 1), so the correction is biased towards the end of the vocabulary."
        ),
        modelled_on="one uniform per position reused for both the accept test and the recovered-token sample",
        bug_class="randomness",
        fn=correction_reuses_accept_uniform,
    ),
    BuggyRule(
        name="draft_temperature_in_acceptance",
        description=(
            f"The drafts were drawn from q but the accept test and residual use q' ∝ q^(1/{DRAFT_TEMPERATURE}) "
            "(the draft distribution processed a second time on the verification side): acceptance "
            "min(1, p/q') and correction max(0, p - q') are computed for a proposal that was not used."
        ),
        modelled_on=(
            "q passed to the acceptance differs from the law the draft was sampled from "
            "(huggingface/transformers issue 47932: raw vs top-k-processed q; deepseek-ai/DeepSpec issue 31: "
            "bfloat16 sampling path vs float32 acceptance)"
        ),
        bug_class="processing",
        fn=draft_temperature_in_acceptance,
    ),
    BuggyRule(
        name="batch_rows_rolled",
        description=(
            "Row b's correction after a rejection at n is drawn from max(0, p^{(b+1) mod B}_n - q^b_n), using "
            "the next request's target row; acceptance and bonus are correct.  Invisible with B = 1 or with "
            "identical rows."
        ),
        modelled_on=(
            "per-request vs per-token index mappings mixed up in a batched sampler (cf. the review of "
            "vllm-project/vllm PR 35398)"
        ),
        bug_class="batching",
        fn=batch_rows_rolled,
        min_batch_size=2,
    ),
    BuggyRule(
        name="greedy_acceptance_when_sampling",
        description=(
            "Accept draft x_i iff x_i == argmax p_i (greedy verification), and on rejection sample from p_n, "
            "for drafts that were sampled from q: the first token has law q(m) 1[t = m] + (1 - q(m)) p(t) "
            "with m = argmax p, instead of p(t)."
        ),
        modelled_on="the greedy/strict verification path reused for requests with temperature > 0",
        bug_class="acceptance",
        fn=greedy_acceptance_when_sampling,
    ),
    BuggyRule(
        name="counts_every_passing_test",
        description=(
            "The number of accepted drafts is the count of passed tests (sum) instead of the length of the "
            "leading run (cumprod then sum): after a rejection at position j, a later pass still lengthens "
            "the accepted prefix, emitting the rejected draft x_j and drawing the correction at the wrong row."
        ),
        modelled_on="`num_accepted = accepted.sum(-1)` in place of `accepted.cumprod(-1).sum(-1)`",
        bug_class="acceptance",
        fn=counts_every_passing_test,
    ),
    BuggyRule(
        name="global_torch_rng",
        description=(
            "Correct modified rejection sampling, but the uniforms come from the global torch RNG "
            "(torch.rand without generator=): the per-step law is right, but the output is not a function "
            "of the supplied generator, so seeded runs do not reproduce and requests share one stream. "
            "Statistical-only: ignores `uniforms`."
        ),
        modelled_on="spec decode not respecting the per-request seed (vllm-project/vllm issue 6038)",
        bug_class="randomness",
        fn=global_torch_rng,
        integrable=False,
    ),
    BuggyRule(
        name="reseeded_every_call",
        description=(
            "Correct modified rejection sampling, but every call draws its uniforms from a new generator "
            "seeded 0: each step of a run uses the same uniforms, so successive steps are dependent "
            "(identical steps repeat exactly) and the sequence law is not the target's. "
            "Statistical-only: ignores `uniforms` and `generator`."
        ),
        modelled_on=(
            "per-step seeding from a constant or near-constant seed (kekzl/imp PR 1143: every token drew "
            "the same quantile)"
        ),
        bug_class="randomness",
        fn=reseeded_every_call,
        integrable=False,
    ),
    BuggyRule(
        name="typical_acceptance",
        description=(
            "Medusa typical acceptance (Cai et al. 2024): accept x_i iff p_i(x_i) > min(0.09, 0.3 exp(-H(p_i))), "
            "then sample from p_n; the acceptance ignores q, so the first token has law "
            "q(t) 1[t in A] + (1 - q(A)) p(t) with A the set of accepted tokens, not p(t).  Lossy by design."
        ),
        modelled_on="Medusa typical acceptance as shipped by engines (e.g. vllm-project/vllm PR 5131)",
        bug_class="lossy-by-design",
        fn=typical_acceptance,
    ),
    BuggyRule(
        name="vocabulary_tile_drops_high_ids",
        description=(
            "The correction/bonus draw scans only the first tile of 2^16 = 65,536 ids: tokens past id 65,535 "
            "get weight 0, so after a rejection the correction follows (p_n - q_n)+ restricted to ids < 65,536 "
            "and the bonus p_K restricted likewise (renormalised).  Exact for V <= 65,536; at Llama-3's "
            "V = 128,256 the draw loses the whole mass above id 65,535."
        ),
        modelled_on=(
            "sampling kernels that tile the vocabulary and keep the in-tile index in 16 bits, or launch a "
            "single tile of 65,536 entries (the grid-size / uint16 pitfalls of top-k/top-p kernels)"
        ),
        bug_class="vocabulary",
        fn=vocabulary_tile_drops_high_ids,
        min_vocab_size=VOCABULARY_TILE + 1,
    ),
    BuggyRule(
        name="partial_last_tile_dropped",
        description=(
            "The correction/bonus draw runs over whole tiles of 128 ids and drops the remainder: the last "
            "V mod 128 ids get weight 0 (81 ids at GPT-2's V = 50,257).  Exact whenever V is a multiple of 128."
        ),
        modelled_on="a tiled kernel whose last, partial block is skipped instead of masked (BLOCK_SIZE = 128)",
        bug_class="vocabulary",
        fn=partial_last_tile_dropped,
        min_vocab_size=LAST_TILE + 1,
    ),
    BuggyRule(
        name="half_precision_cdf_at_large_vocab",
        description=(
            "Above V = 32,768 the correction/bonus draw inverts cumsum(weights) stored in float16: every "
            "cumulative sum is rounded to 11 significant bits, so a token's interval [C(t-1), C(t)) has the "
            "length of the rounded sums' difference (0 for most tokens of mass below ulp(C)/2, a multiple of "
            "ulp(C) for the others) instead of its mass."
        ),
        modelled_on=(
            "large-vocabulary paths that keep the CDF in half precision to save shared memory or bandwidth "
            "(float16 prefix sums over 32k+ entries)"
        ),
        bug_class="precision",
        fn=half_precision_cdf_at_large_vocab,
        min_vocab_size=HALF_PRECISION_FROM_VOCAB + 1,
    ),
    BuggyRule(
        name="bonus_library_top_k",
        description=(
            "The bonus token is drawn from p_K cut to its 50 most likely tokens and renormalised (a library "
            "default top_k = 50 applied on the bonus path only); corrections and acceptance are correct.  "
            "TV of the bonus = the mass of p_K outside its top 50, for any V > 50."
        ),
        modelled_on=(
            "the bonus token sampled through a generation utility whose defaults include top_k=50 "
            "(Hugging Face transformers' GenerationConfig default) while the verification path uses none"
        ),
        bug_class="processing",
        fn=bonus_library_top_k,
        min_vocab_size=LIBRARY_TOP_K + 1,
    ),
    BuggyRule(
        name="bonus_tempered_at_large_vocab",
        description=(
            "Above V = 32,768 the bonus token is drawn from p_K^(1/1.1) renormalised (temperature 1.1 applied "
            "again on the bonus path); corrections and acceptance are correct.  At Qwen2.5's 151,936 tokens the "
            "bonus law is at TV 0.14 from p_K, spread over the whole vocabulary (every token's probability "
            "moves by a factor that depends on its level): far below what a token-level test detects at "
            "~8,000 rows, and almost all of it between probability levels."
        ),
        modelled_on=(
            "a fused final-draw kernel for large vocabularies that applies the request's temperature to "
            "probabilities the sampler already tempered (the bonus logits take a separate path from the "
            "target's verification logits)"
        ),
        bug_class="processing",
        fn=bonus_tempered_at_large_vocab,
        min_vocab_size=TEMPERED_FROM_VOCAB + 1,
    ),
    BuggyRule(
        name="draft_length_specialised_kernel",
        description=(
            "Right for K <= 8; for K > 8 the final draw reads target row min(n, 8): a correction after a "
            "rejection at n >= 8 follows (p_8 - q_n)+ instead of (p_n - q_n)+, and the bonus follows p_8 "
            "instead of p_K."
        ),
        modelled_on=(
            "kernels specialised (templated / unrolled) for up to 8 speculative tokens whose generic K > 8 "
            "path clamps the target row index; n-gram and suffix drafting use K up to 32"
        ),
        bug_class="draft-length",
        fn=draft_length_specialised_kernel,
        min_num_draft=SPECIALISED_DRAFTS + 1,
    ),
    BuggyRule(
        name="draft_length_specialised_to_16",
        description=(
            "Right for K <= 16; for K > 16 the final draw reads target row min(n, 16): a correction after a "
            "rejection at n > 16 follows (p_16 - q_n)+ instead of (p_n - q_n)+, and the bonus follows p_16 "
            "instead of p_K."
        ),
        modelled_on=(
            "kernels specialised (templated / unrolled) for up to 16 speculative tokens whose generic K > 16 "
            "path clamps the target row index; suffix decoding and n-gram drafting propose up to 32 tokens per "
            "step (vLLM's num_speculative_tokens)"
        ),
        bug_class="draft-length",
        fn=draft_length_specialised_to_16,
        min_num_draft=WIDE_SPECIALISED_DRAFTS + 1,
    ),
    BuggyRule(
        name="row_block_offset_dropped",
        description=(
            "Rows are processed in blocks of 256 and the final draw forgets the block offset: row b draws its "
            "correction or bonus from the laws of row b mod 256, (p^{b mod 256}_n - q^{b mod 256}_n)+ or "
            "p^{b mod 256}_K.  Exact for batches of at most 256 rows, or when all rows share their laws."
        ),
        modelled_on="a row-block launch grid whose blockIdx offset is dropped from the probability pointer",
        bug_class="batching",
        fn=row_block_offset_dropped,
        min_batch_size=ROW_BLOCK + 1,
    ),
    BuggyRule(
        name="contiguous_stride_reads",
        description=(
            "Reads target_probs and draft_probs with the strides of a contiguous tensor (offset "
            "(b (K+1) + i) V + t) whatever their real strides: exact on contiguous inputs; on a view of a "
            "wider buffer (logits[:, :K+1, :V] of a padded buffer) it tests and corrects with entries of other "
            "rows, positions and the padding."
        ),
        modelled_on="pointer arithmetic in a custom kernel that assumes contiguous inputs (no stride arguments)",
        bug_class="layout",
        fn=contiguous_stride_reads,
        strided_only=True,
    ),
    BuggyRule(
        name="bfloat16_cdf_path",
        description=(
            "For bfloat16 inputs the correction/bonus draw inverts cumsum(weights) stored in bfloat16 (8 "
            "significant bits: each interval's length is a difference of rounded sums); float32 and float16 "
            "inputs take the exact path."
        ),
        modelled_on="a dtype-specialised kernel instantiation whose accumulator type follows the input dtype",
        bug_class="dtype",
        fn=bfloat16_cdf_path,
        input_dtypes=("bfloat16",),
    ),
]

_ENTRIES += [
    BuggyRule(
        name="ragged_bonus_at_padded_position",
        description=(
            "Ragged rows: the bonus token of a request that accepted all its k_b drafts is drawn from "
            "target_probs[b, K], the padded position, instead of target_probs[b, k_b]: for k_b < K it follows the "
            "padding (or another position's law), not p_{k_b}.  Exact when every row has K drafts."
        ),
        modelled_on=(
            "flattened verify kernels that locate the bonus logits with the batch's max draft count instead of "
            "the request's own (bonus_logits_indices from K rather than cu_num_sampled_tokens)"
        ),
        bug_class="indexing",
        fn=ragged_bonus_at_padded_position,
        ragged_only=True,
    ),
    BuggyRule(
        name="ragged_offsets_from_padded_width",
        description=(
            "Ragged rows: the exclusive offsets are formed from the inclusive cumsum cu of the draft counts as "
            "cu[b] - K instead of cu[b] - k_b, so a request with k_b < K starts K - k_b rows early and tests the "
            "previous request's drafts and laws (the first row clamps at flat row 0): it accepts and emits tokens "
            "that are not its own drafts.  Exact when every row has K drafts."
        ),
        modelled_on=("start offsets from cu_num_draft_tokens (inclusive) minus the padded width instead of the "
                     "request's own count"),
        bug_class="indexing",
        fn=ragged_offsets_from_padded_width,
        ragged_only=True,
    ),
    BuggyRule(
        name="ragged_empty_row_takes_next_bonus",
        description=(
            "Ragged rows: the bonus laws are gathered for the requests with k_b > 0 only and handed out by batch "
            "index, so from the first request with k_b = 0 on every request draws its correction-free token from "
            "a later request's bonus law p^{b'}_{k_b'} (an empty request is verified with the next request's target "
            "law).  Exact when no request has 0 drafts."
        ),
        modelled_on=(
            "requests without drafts dropped from the spec-decode metadata while the bonus rows are still indexed "
            "by position in the batch"
        ),
        bug_class="indexing",
        fn=ragged_empty_row_takes_next_bonus,
        ragged_only=True,
    ),
    BuggyRule(
        name="ragged_last_row_padding_read",
        description=(
            "Ragged rows: the last request of the call is verified with K drafts whatever its k_b, so its padding "
            "columns are tested as drafts (the decoy padding passes) and it emits up to K+1 tokens, more than "
            "k_b + 1.  Exact when the last row has K drafts."
        ),
        modelled_on=(
            "the total of the flattened draft tokens computed as B·K minus the padding of the first B-1 requests "
            "(an off-by-one over the requests' padding)"
        ),
        bug_class="indexing",
        fn=ragged_last_row_padding_read,
        ragged_only=True,
    ),
]

CATALOG: dict[str, BuggyRule] = {entry.name: entry for entry in _ENTRIES}
