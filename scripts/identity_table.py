"""Print the samples the token-level identity test needs against the pooled Pearson χ², for the same
TV, level and power.

Run ``python scripts/identity_table.py`` (about a minute); ``format_identity_table()`` returns
the text.  Columns, at level α = 1e-6 and power 0.99:

- identity: ``core.identity.identity_sample_size``, a rigorous lower bound on the power over EVERY
  alternative at TV ≥ ε (Chernoff + Lagrangian worst case; exact Poissonization, Chernoff
  calibration of the level);
- χ² pooled: ``stats.sample_size_for_tv`` on the cells left after ``stats.pool_cells`` to ≥ 5
  expected (a fixed point in n); its noncentral-χ² statement covers only the TV between the
  pooled laws — a loss inside a pooled cell is not covered — and "cells" is that cell count;
- χ² unpooled: the n at which nothing is pooled (n·min p ≥ 5) and the noncentral-χ² bound on
  all V cells holds, the n at which Pearson's statement covers every TV-ε deviation
  (approximately: the noncentral χ² is an asymptotic approximation, not a bound).
"""

from __future__ import annotations

import numpy as np

from specverify.core.identity import identity_sample_size, pooled_chi2_sample_size

ALPHA = 1e-6
POWER = 0.99
VOCAB_SIZES = (32_768, 131_072)
EPSILONS = (0.1, 0.05, 0.02)


def zipf(vocab_size: int, exponent: float = 1.1) -> np.ndarray:
    p = np.arange(1, vocab_size + 1, dtype=np.float64) ** -exponent
    return p / p.sum()


def laws(vocab_size: int) -> dict[str, np.ndarray]:
    """Zipf p ∝ rank^−1.1, uniform, and peaked (one token of mass 0.9, the rest Zipf)."""
    peaked = zipf(vocab_size) * 0.1
    peaked[0] += 0.9
    return {"zipf-1.1": zipf(vocab_size), "uniform": np.full(vocab_size, 1.0 / vocab_size),
            "peaked-0.9": peaked / peaked.sum()}


def table_rows(vocab_sizes: tuple[int, ...] = VOCAB_SIZES, epsilons: tuple[float, ...] = EPSILONS,
               alpha: float = ALPHA, power: float = POWER) -> list[tuple[int, str, float, int, int, int, int]]:
    """(V, law, ε, identity n, χ² pooled n, its cells, χ² unpooled n) per configuration."""
    rows = []
    for vocab_size in vocab_sizes:
        for name, p in laws(vocab_size).items():
            for epsilon in epsilons:
                n = identity_sample_size(p, epsilon, alpha=alpha, power=power)
                chi2 = pooled_chi2_sample_size(p, epsilon, alpha=alpha, power=power)
                rows.append((vocab_size, name, epsilon, n, chi2.nominal, chi2.cells, chi2.unpooled))
    return rows


def format_identity_table(**kwargs) -> str:
    header = f"{'V':>8} {'law':>11} {'TV ε':>6} {'identity':>11} {'χ² pooled':>11} {'cells':>7} {'χ² unpooled':>12}"
    lines = [f"samples for TV ε at α = {kwargs.get('alpha', ALPHA):g}, power {kwargs.get('power', POWER):g}", header]
    for vocab_size, name, epsilon, n, nominal, cells, unpooled in table_rows(**kwargs):
        lines.append(f"{vocab_size:>8} {name:>11} {epsilon:>6g} {n:>11,} {nominal:>11,} {cells:>7,} {unpooled:>12,}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_identity_table())
