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
(induction over ``t``), so in float32/float64 identity is exactly "no gap > 0" (tolerance 0).

In float16/bfloat16 the candidate's verify pass and the scoring pass run different kernels and
shapes, so where the two best logits are closer than the rounding noise the candidate's argmax may
be the scoring's runner-up: ``c_t ≠ a_t`` with ``gap_t ≤ |Δ(ℓ[a_t] − ℓ[c_t])|`` (the change of that
logit difference between the two numeric paths; ``c_t`` is the argmax of the other path).  Each
level measures that noise on the same model, dtype and kernels and :func:`noise_tolerance` turns
it into the tolerance (below), which :func:`judge` applies with the noise sample's own gaps in two
tests:

1. **Exceedances** (deterministic): a position with ``gap_t > max(tolerance, g_max)`` is an
   error, ``g_max`` the largest gap of the noise sample (the reference's own greedy tokens scored
   the same way).  The tolerance bounds the noise, so no lossless run reaches it; where the noise
   sample itself reaches past it (a scoring path that disagrees with the reference's own decoding:
   a server whose batched re-scoring runs another kernel than its decoding, or a reference token
   outside the scored alternatives, ``g_max = inf``), a gap the reference's own decoding reaches
   is no evidence either, and above the tolerance only test 2 judges.
2. **Divergent positions** (statistical, Fisher's exact test): the number ``X`` of the ``n``
   candidate positions with ``gap_t > 0`` against the number ``Y`` of the ``m`` noise positions
   with gap > 0.  Under H0 "the candidate's positions are exchangeable with the noise sample's"
   (a lossless decoder is plain greedy along another numeric path), given ``X + Y`` the count ``X``
   is hypergeometric: p = P(X' ≥ X), ``X' ~ Hypergeom(n + m, X + Y, n)``.  A decoder whose wrong
   tokens all hide within the tolerance still diverges far more often than rounding does.
   Positions of one text are not independent draws, so the level α is nominal.

Tolerance (:func:`noise_tolerance`), one rule at every level.  The noise comes in two kinds:

- *trusted* values ``t_1 … t_m``: the reference's own numeric paths measured against each other
  (a model's margin changes and flip gaps, plain greedy against its teacher-forced re-scoring; an
  endpoint baseline's deviations between its repeats, alone and under load, and between its
  decoding and its ``echo`` re-scoring).  The audit trusts the reference, so every one of them is
  a value a lossless run can reach: they enter by their **maximum**.
- *candidate* values ``c_1 … c_n``: deviations the untrusted candidate supplies (an endpoint
  candidate's logprobs against the baseline's on the tokens both emitted), admitted only after a
  same-law test accepted them as the baseline's law.  They enter by their **upper decile**
  ``Q₀.₉(c)`` (:data:`UPPER_QUANTILE`, linear interpolation of the order statistics), which
  ignores the largest ``⌊0.1 (n − 1)⌋`` of them: a few outlying positions cannot move it.

    τ = max( max_i t_i ,  Q₀.₉(c) )          tolerance = max( s · τ ,  floor )

``s`` = :data:`SAFETY_FACTOR` = 2: the judged paths' shapes are not exactly the calibration's,
and the largest of a few hundred noise draws understates the tail.  ``floor``: the resolution of
the scores (an endpoint's logprobs travel as decimal text; dense float logits need none).  With
no noise measured the tolerance is the floor: ``τ = 0`` in float32/float64 is exact identity.

Power.  A wrong token at a position whose margin exceeds the tolerance is an exceedance: the
*explainable fraction*, the share of compared positions with ``margin_t ≤ tolerance``, is the
share at which a single runner-up substitution can pass test 1 (any other wrong token has a
larger gap); test 2 bounds how many of those can.  Both are reported with the first divergence
of each row (its margin and gap, explained or not) for the report.
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

SAFETY_FACTOR = 2.0
"""``s``: the tolerance is ``s`` times the noise level τ (module docstring)."""

UPPER_QUANTILE = 0.9
"""The quantile by which the candidate's deviations enter τ (module docstring)."""


def upper_quantile(values: Sequence[float] | np.ndarray) -> float:
    """``Q₀.₉`` of ``values`` (:data:`UPPER_QUANTILE`, linear interpolation); 0 for none."""
    return float(np.quantile(np.asarray(values, dtype=np.float64), UPPER_QUANTILE)) if len(values) else 0.0


@dataclass(frozen=True)
class NoiseTolerance:
    """:func:`noise_tolerance`'s result: the noise level ``tau`` = max(``trusted_max``,
    ``candidate_quantile``) and the ``tolerance`` = max(``safety_factor`` · ``tau``, ``floor``)
    (module docstring); ``trusted_positions``, ``candidate_positions``: the sample sizes."""

    tau: float
    tolerance: float
    trusted_max: float
    candidate_quantile: float
    trusted_positions: int
    candidate_positions: int
    safety_factor: float
    floor: float

    @property
    def set_by(self) -> str:
        """What sets the tolerance: ``"floor"``, ``"trusted noise"`` (its maximum) or
        ``"candidate deviations"`` (their upper decile)."""
        if self.safety_factor * self.tau <= self.floor:
            return "floor"
        return "trusted noise" if self.trusted_max >= self.candidate_quantile else "candidate deviations"


def _noise_values(name: str, values: Sequence[float] | np.ndarray) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if not bool(np.all(np.isfinite(array) & (array >= 0))):
        bad = array[~(np.isfinite(array) & (array >= 0))][:4].tolist()
        raise ValueError(f"{name}: expected finite noise values >= 0 (absolute logit or logprob differences), "
                         f"got {bad}")
    return array


def noise_tolerance(
    trusted: Sequence[float] | np.ndarray = (),
    candidate: Sequence[float] | np.ndarray = (),
    *,
    floor: float = 0.0,
    safety_factor: float = SAFETY_FACTOR,
) -> NoiseTolerance:
    """The greedy-identity tolerance from measured noise (module docstring):

        τ = max( max(trusted), Q₀.₉(candidate) )     tolerance = max( safety_factor · τ, floor )

    ``trusted``: the reference's own noise (every value one a lossless run can reach);
    ``candidate``: deviations the untrusted candidate supplied, only once a same-law test accepted
    them; ``floor``: the scores' resolution (0 for dense float logits)."""
    if not safety_factor >= 1:
        raise ValueError(f"safety_factor: expected >= 1 (it widens the measured noise), got {safety_factor}")
    if not (math.isfinite(floor) and floor >= 0):
        raise ValueError(f"floor: expected a finite value >= 0 (the scores' resolution), got {floor}")
    trusted_values, candidate_values = _noise_values("trusted", trusted), _noise_values("candidate", candidate)
    trusted_max = float(trusted_values.max(initial=0.0))
    candidate_quantile = upper_quantile(candidate_values)
    tau = max(trusted_max, candidate_quantile)
    return NoiseTolerance(tau, max(safety_factor * tau, floor), trusted_max, candidate_quantile,
                          int(trusted_values.size), int(candidate_values.size), safety_factor, floor)


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
    ``gap ≤ tolerance``."""

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

    ``positions``: positions compared; ``exceedances``: the positions with gap > ``tolerance`` (as
    :class:`Divergence`, not only the first of each row); ``divergent``: candidate positions with
    gap > 0; ``noise_divergent`` of ``noise_positions``: the same count in the noise sample;
    ``pvalue``: the divergent-positions test (1 without a noise sample); ``noise_max_gap``: the
    noise sample's largest gap (0 without one), which widens the exceedance ``threshold`` past the
    tolerance; ``explainable_fraction``: compared positions with margin ≤ ``threshold``;
    ``first_divergences``: per row, its first gap > 0.
    """

    reference: str
    tolerance: float
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
    noise_max_gap: float = 0.0

    @property
    def threshold(self) -> float:
        """The gap above which a position is an exceedance: max(tolerance, the noise's largest gap)."""
        return max(self.tolerance, self.noise_max_gap)

    @property
    def passed(self) -> bool:
        return not self.exceedances and self.pvalue > self.alpha

    def threshold_note(self) -> str:
        """Where the noise sample's own gaps widen the exceedance threshold past the tolerance, that
        (with a leading space); else nothing."""
        if self.noise_max_gap <= self.tolerance:
            return ""
        if math.isinf(self.noise_max_gap):
            return (" (the reference's own tokens reach a token outside the scored alternatives under the same "
                    "scoring: above the tolerance only the divergent-positions test judges)")
        return (f" (the reference's own tokens reach a gap of {self.noise_max_gap:.3g} under the same scoring: "
                "exceedances are judged above that)")

    def summary(self) -> str:
        return (f"{self.reference}: {self.rows} rows, {self.positions} positions compared, "
                f"tolerance={self.tolerance:.4g}{self.threshold_note()} "
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


def _divergence(row: ScoredRow, index: int, tolerance: float) -> Divergence:
    gap = float(row.gaps[index])
    return Divergence(row.label, int(row.positions[index]), row.best[index], row.tokens[index],
                      float(row.margins[index]), gap, gap <= tolerance)


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
    tolerance: float,
    noise_gaps: Sequence[float] | np.ndarray = (),
    alpha: float = DEFAULT_ALPHA,
    reference: str = "teacher-forced target",
) -> IdentityResult:
    """Whole-sequence greedy identity of ``rows`` (module docstring): no position with gap >
    max(``tolerance`` (:func:`noise_tolerance`), the largest of ``noise_gaps``), and no more
    positions with gap > 0 than the noise sample's ``noise_gaps`` (gaps of lossless runs scored the
    same way) explain at level ``alpha``.  ``tolerance = 0`` with no noise sample is exact
    identity (float32)."""
    if not tolerance >= 0:
        raise ValueError(f"tolerance: expected >= 0 (noise_tolerance(...).tolerance), got {tolerance}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: expected a level in (0, 1), got {alpha}")
    noise = np.asarray(noise_gaps, dtype=np.float64).reshape(-1)
    noise_max_gap = float(noise.max(initial=0.0))
    threshold = max(float(tolerance), noise_max_gap)
    exceedances, firsts = [], []
    positions = divergent = 0
    explainable = 0
    for row in rows:
        positions += row.compared
        divergent += int((row.gaps > 0).sum())
        explainable += int((row.margins <= threshold).sum())
        exceedances += [_divergence(row, int(i), threshold) for i in np.flatnonzero(row.gaps > threshold)]
        first = np.flatnonzero(row.gaps > 0)
        if first.size:
            firsts.append(_divergence(row, int(first[0]), threshold))
    noise_divergent = int((noise > 0).sum())
    return IdentityResult(
        reference=reference,
        tolerance=float(tolerance),
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
        noise_max_gap=noise_max_gap,
    )

