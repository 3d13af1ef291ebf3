"""Print the sample sizes the statistical checks need, and what a given sample size can detect.

Run ``python scripts/power_table.py``; ``format_power_table()`` returns the same text for tests.

For the Pearson goodness-of-fit test at level α with ``cells − 1`` degrees of freedom, every
deviation of total variation ε is detected with probability ≥ P(χ'²(4nε²) > χ²_{1−α})
(``specverify.core.stats.power_at``).  The table lists the smallest such n, and the smallest
detectable ε for a few n, at α = 1e-4 and power 0.99 (β = 0.01).  The last section gives the
trials the one-sided binomial test of an acceptance rate needs to see it exceed p0 by δ.
"""

from __future__ import annotations

from specverify.core.stats import binomial_sample_size, detectable_tv, sample_size_for_tv

ALPHA = 1e-4
POWER = 0.99
EPSILONS = (0.05, 0.02, 0.01)
CELL_COUNTS = (10, 100, 1000)
SAMPLE_SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
NULL_RATES = (0.5, 0.9)


def sample_size_rows(alpha: float = ALPHA, power: float = POWER) -> list[tuple[int, list[int]]]:
    """(cells, [n needed for each ε in EPSILONS]) for each cell count."""
    return [
        (cells, [sample_size_for_tv(eps, alpha=alpha, power=power, num_cells=cells) for eps in EPSILONS])
        for cells in CELL_COUNTS
    ]


def detectable_rows(alpha: float = ALPHA, power: float = POWER) -> list[tuple[int, list[float]]]:
    """(cells, [detectable ε for each n in SAMPLE_SIZES]) for each cell count."""
    return [
        (cells, [detectable_tv(n, alpha=alpha, power=power, num_cells=cells) for n in SAMPLE_SIZES])
        for cells in CELL_COUNTS
    ]


def binomial_rows(alpha: float = ALPHA, power: float = POWER) -> list[tuple[float, list[int]]]:
    """(p0, [trials needed to detect a rate p0 + δ for each δ in EPSILONS]) for each null rate."""
    return [
        (p0, [binomial_sample_size(delta, p0=p0, alpha=alpha, power=power) for delta in EPSILONS])
        for p0 in NULL_RATES
    ]


def format_power_table(alpha: float = ALPHA, power: float = POWER) -> str:
    """The three tables as aligned plain text."""
    eps_header = "".join(f"{f'ε = {eps:g}':>14}" for eps in EPSILONS)
    lines = [
        f"Goodness of fit (Pearson), alpha = {alpha:g}, power = {power:g}: samples n needed for TV ε",
        f"{'cells':>8}{eps_header}",
    ]
    lines += [f"{cells:>8}" + "".join(f"{n:>14,}" for n in ns) for cells, ns in sample_size_rows(alpha, power)]
    lines += [
        "",
        f"Detectable TV ε with n samples, alpha = {alpha:g}, power = {power:g}",
        f"{'cells':>8}" + "".join(f"{f'n = {n:,}':>16}" for n in SAMPLE_SIZES),
    ]
    lines += [f"{cells:>8}" + "".join(f"{eps:>16.5f}" for eps in epss) for cells, epss in detectable_rows(alpha, power)]
    lines += [
        "",
        f"One-sided exact binomial test (acceptance rate > p0), alpha = {alpha:g}, power = {power:g}: "
        "trials to detect rate p0 + δ",
        f"{'p0':>8}" + "".join(f"{f'δ = {d:g}':>14}" for d in EPSILONS),
    ]
    lines += [f"{p0:>8g}" + "".join(f"{n:>14,}" for n in ns) for p0, ns in binomial_rows(alpha, power)]
    return "\n".join(lines)


def main() -> None:
    print(format_power_table())


if __name__ == "__main__":
    main()
