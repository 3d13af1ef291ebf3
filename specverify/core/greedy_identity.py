"""Whole-sequence greedy identity: every token of a greedy continuation against the target's argmax.

SPEC §2/§4: a lossless speculative decoder's greedy output is the target's own greedy output.
Judged token by token against a separately decoded baseline, the comparison must stop at the first
divergence (after it the two rows condition on different prefixes), so a bug whose first wrong token
happens to be a near-tie hides everything after it.  Here the target scores the candidate's *whole*
continuation by teacher forcing (one pass over prompt + continuation), which gives, at every
position ``t``, the target's logits ``ℓ_t`` given the candidate's *own* prefix, and every token is
judged there:

    gap_t    = ℓ_t[a_t] − ℓ_t[c_t] ≥ 0       a_t = argmax ℓ_t, c_t the candidate's token
    margin_t = ℓ_t[top 1] − ℓ_t[top 2]

(``inf`` where the scoring lists no value for ``c_t``, e.g. outside an endpoint's returned top-n).
``gap_t = 0`` at every position iff the candidate is the greedy decoding of the scoring
(induction over ``t``), so in float32/float64 identity is exactly "no gap > 0" (τ = 0).

In float16/bfloat16 the candidate's verify pass and the scoring pass run different kernels and
shapes, so where the two best logits are closer than the rounding noise the candidate's argmax may
be the scoring's runner-up: ``c_t ≠ a_t`` with ``gap_t ≤ |Δ(ℓ[a_t] − ℓ[c_t])|`` (the change of that
logit difference between the two numeric paths; ``c_t`` is the argmax of the other path).  The
level measures that noise on the same model, dtype and kernels (plain greedy decoding against
itself in other shapes, scored the same way) and passes τ and the noise sample's own gaps to
:func:`judge`, which applies two tests:

1. **Exceedances** (deterministic): a position with ``gap_t > τ`` is an error.  τ is a bound on
   the noise (at the model level twice the largest change measured), so no lossless run reaches it.
2. **Divergent positions** (statistical, Fisher's exact test): the number ``X`` of the ``n``
   candidate positions with ``gap_t > 0`` against the number ``Y`` of the ``m`` noise positions
   with gap > 0.  Under H0 "the candidate's positions are exchangeable with the noise sample's"
   (a lossless decoder is plain greedy along another numeric path), given ``X + Y`` the count ``X``
   is hypergeometric: p = P(X' ≥ X), ``X' ~ Hypergeom(n + m, X + Y, n)``.  A decoder whose wrong
   tokens all hide within τ still diverges far more often than rounding does.  Positions of one
   text are not independent draws, so the level α is nominal.

Power.  A wrong token at a position whose margin exceeds τ is an exceedance: the *explainable
fraction*, the share of compared positions with ``margin_t ≤ τ``, is the share at which a single
runner-up substitution can pass test 1 (any other wrong token has a larger gap); test 2 bounds how
many of those can.  Both are reported with the first divergence of each row (its margin and gap,
explained or not) for the report.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import hypergeom

DEFAULT_ALPHA = 1e-3
"""Nominal level of the divergent-positions test (:func:`judge`)."""


@dataclass(frozen=True)
class ScoredRow:
    """One candidate row scored by the target teacher-forced on the row's own prefix.

    ``positions``: int64 ``[n]``, the indices (in the row) of the positions compared; ``tokens``,
    ``best``: the candidate's token and the target's argmax there; ``gaps``, ``margins``: float64
    ``[n]`` (module docstring; ``inf`` where unknown).
    """

    label: str
    positions: np.ndarray
    tokens: tuple[Hashable, ...]
    best: tuple[Hashable, ...]
    gaps: np.ndarray
    margins: np.ndarray

    @property
    def compared(self) -> int:
        return int(self.positions.size)


def score_logits(label: str, tokens: torch.Tensor, logits: torch.Tensor) -> ScoredRow:
    """:class:`ScoredRow` from dense logits: ``logits [n, V]`` at the positions of ``tokens [n]``
    (teacher-forced: row ``t`` is the law after the prompt and ``tokens[:t]``); float64 math."""
    tokens = tokens.reshape(-1).cpu()
    logits = logits.detach().to(device="cpu", dtype=torch.float64)
    if logits.dim() != 2 or logits.shape[0] != tokens.numel():
        raise ValueError(f"logits: expected [{tokens.numel()}, V] (one row per token), got {tuple(logits.shape)}")
    top = logits.topk(min(2, logits.shape[1]), dim=-1)
    chosen = logits.gather(1, tokens[:, None])[:, 0]
    margins = (top.values[:, 0] - top.values[:, 1]) if logits.shape[1] > 1 else torch.full_like(chosen, math.inf)
    return ScoredRow(label, np.arange(tokens.numel()), tuple(tokens.tolist()), tuple(top.indices[:, 0].tolist()),
                     (top.values[:, 0] - chosen).numpy(), margins.numpy())


def score_laws(label: str, tokens: Sequence[str], laws: Sequence[Mapping[str, float] | None]) -> ScoredRow:
    """:class:`ScoredRow` from sparse laws (an endpoint's top-n logprobs per position, token string
    -> logprob): gap = the law's largest value − the token's (``inf`` when the law omits the
    token); positions whose law is empty or missing are not compared."""
    positions, kept, best, gaps, margins = [], [], [], [], []
    for position, (token, law) in enumerate(zip(tokens, laws)):
        if not law:
            continue
        ranked = sorted(law.items(), key=lambda kv: (-kv[1], kv[0]))
        positions.append(position)
        kept.append(token)
        best.append(ranked[0][0])
        gaps.append(ranked[0][1] - law[token] if token in law else math.inf)
        margins.append(ranked[0][1] - ranked[1][1] if len(ranked) > 1 else math.inf)
    return ScoredRow(label, np.asarray(positions, dtype=np.int64), tuple(kept), tuple(best),
                     np.asarray(gaps, dtype=np.float64), np.asarray(margins, dtype=np.float64))


@dataclass(frozen=True)
class Divergence:
    """The first position where a row's token is not the target's argmax given its own prefix:
    the target's top-2 ``margin`` and the ``gap`` to the row's token there; ``explained`` iff
    ``gap ≤ τ``."""

    row: str
    position: int
    target_token: Hashable
    candidate_token: Hashable
    margin: float
    gap: float
    explained: bool

    def describe(self) -> str:
        gap = "beyond the scored alternatives" if math.isinf(self.gap) else f"{self.gap:.3g}"
        return (f"{self.row}: position {self.position}: target {self.target_token!r} vs candidate "
                f"{self.candidate_token!r}, top-2 margin {self.margin:.3g}, gap {gap}, "
                f"{'explained' if self.explained else 'UNEXPLAINED'}")


@dataclass(frozen=True)
class IdentityResult:
    """:func:`judge`'s verdict on candidate rows scored by one reference.

    ``positions``: positions compared; ``exceedances``: the positions with gap > ``tau`` (as
    :class:`Divergence`, not only the first of each row); ``divergent``: candidate positions with
    gap > 0; ``noise_divergent`` of ``noise_positions``: the same count in the noise sample;
    ``pvalue``: the divergent-positions test (1 without a noise sample); ``explainable_fraction``:
    compared positions with margin ≤ ``tau``; ``first_divergences``: per row, its first gap > 0.
    """

    reference: str
    tau: float
    alpha: float
    rows: int
    positions: int
    exceedances: tuple[Divergence, ...]
    divergent: int
    noise_divergent: int
    noise_positions: int
    pvalue: float
    explainable_fraction: float
    first_divergences: tuple[Divergence, ...]

    @property
    def passed(self) -> bool:
        return not self.exceedances and self.pvalue > self.alpha

    def summary(self) -> str:
        return (f"{self.reference}: {self.rows} rows, {self.positions} positions compared, tau={self.tau:.4g} "
                f"(explains {self.explainable_fraction:.1%} of them), {len(self.exceedances)} exceedance(s), "
                f"{self.divergent} divergent position(s) vs {self.noise_divergent}/{self.noise_positions} in the "
                f"noise (p={self.pvalue:.3g}, alpha {self.alpha:g}): {'PASS' if self.passed else 'FAIL'}")

    def __str__(self) -> str:
        lines = [self.summary()]
        lines += [f"  first divergence {d.describe()}" for d in self.first_divergences]
        lines += [f"  exceedance {d.describe()}" for d in self.exceedances[:8]]
        if len(self.exceedances) > 8:
            lines.append(f"  ... {len(self.exceedances) - 8} more exceedance(s)")
        return "\n".join(lines)


def _divergence(row: ScoredRow, index: int, tau: float) -> Divergence:
    gap = float(row.gaps[index])
    return Divergence(row.label, int(row.positions[index]), row.best[index], row.tokens[index],
                      float(row.margins[index]), gap, gap <= tau)


def divergent_positions_pvalue(divergent: int, positions: int, noise_divergent: int, noise_positions: int) -> float:
    """P(X' ≥ ``divergent``), X' ~ Hypergeom(N = positions + noise_positions, K = divergent +
    noise_divergent, n = positions): Fisher's one-sided exact test (module docstring); 1 without
    a noise sample."""
    if noise_positions == 0 or divergent == 0:
        return 1.0
    total = positions + noise_positions
    return float(hypergeom.sf(divergent - 1, total, divergent + noise_divergent, positions))


def judge(
    rows: Sequence[ScoredRow],
    *,
    tau: float,
    noise_gaps: Sequence[float] | np.ndarray = (),
    alpha: float = DEFAULT_ALPHA,
    reference: str = "teacher-forced target",
) -> IdentityResult:
    """Whole-sequence greedy identity of ``rows`` (module docstring): no position with gap > ``tau``,
    and no more positions with gap > 0 than the noise sample's ``noise_gaps`` (gaps of lossless
    runs scored the same way) explain at level ``alpha``.  ``tau = 0`` with no noise sample is
    exact identity (float32)."""
    if not tau >= 0:
        raise ValueError(f"tau: expected >= 0, got {tau}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: expected a level in (0, 1), got {alpha}")
    noise = np.asarray(noise_gaps, dtype=np.float64).reshape(-1)
    exceedances, firsts = [], []
    positions = divergent = 0
    explainable = 0
    for row in rows:
        positions += row.compared
        divergent += int((row.gaps > 0).sum())
        explainable += int((row.margins <= tau).sum())
        exceedances += [_divergence(row, int(i), tau) for i in np.flatnonzero(row.gaps > tau)]
        first = np.flatnonzero(row.gaps > 0)
        if first.size:
            firsts.append(_divergence(row, int(first[0]), tau))
    noise_divergent = int((noise > 0).sum())
    return IdentityResult(
        reference=reference,
        tau=float(tau),
        alpha=alpha,
        rows=len(rows),
        positions=positions,
        exceedances=tuple(exceedances),
        divergent=divergent,
        noise_divergent=noise_divergent,
        noise_positions=int(noise.size),
        pvalue=divergent_positions_pvalue(divergent, positions, noise_divergent, int(noise.size)),
        explainable_fraction=explainable / positions if positions else 0.0,
        first_divergences=tuple(firsts),
    )

