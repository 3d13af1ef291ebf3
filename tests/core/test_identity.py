"""The token-level identity test (specverify.core.identity): its bound, its size, its power at the
planned n, and each part failing on a case made for it.

Default run: ~30 CPU-seconds.  ``-m slow``: the size over 2,000 null runs at V = 32,768 and
131,072 and the power over 200 runs, printed (``-s`` to see them).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from specverify.core import identity
from specverify.core.identity import (
    identity_design,
    identity_detectable_tv,
    identity_joint_sample_size,
    identity_power,
    identity_sample_size,
    identity_test,
    pooled_chi2_sample_size,
)
from specverify.core.seeding import derive_seed

ALPHA = 1e-6
POWER = 0.99


# --------------------------------------------------------------------------------------------
# Laws and planted deviations
# --------------------------------------------------------------------------------------------


def zipf(vocab_size: int, exponent: float = 1.1) -> np.ndarray:
    """p ∝ rank^−s with token id = rank − 1 (the tail lives at high ids)."""
    p = np.arange(1, vocab_size + 1, dtype=np.float64) ** -exponent
    return p / p.sum()


def peaked(vocab_size: int, top: float = 0.9) -> np.ndarray:
    """One token of mass ``top``, the rest Zipf-like."""
    p = zipf(vocab_size) * (1.0 - top)
    p[0] += top
    return p / p.sum()


def ids_lost(p: np.ndarray, first_lost: int, among: np.ndarray | None = None) -> np.ndarray:
    """Tokens with id ≥ ``first_lost`` get 0 mass, redistributed proportionally over the others
    (over ``among`` only, when given: a loss inside the light set that keeps its total)."""
    q = p.copy()
    pool = np.arange(p.size) if among is None else among
    lost, kept = pool[pool >= first_lost], pool[pool < first_lost]
    moved = q[lost].sum()
    q[lost] = 0.0
    q[kept] *= 1.0 + moved / q[kept].sum()
    return q / q.sum()


def tail_scaled(p: np.ndarray, first: int, factor: float) -> np.ndarray:
    """Tokens with id ≥ ``first`` scaled by ``factor``, renormalised (a temperature on the tail)."""
    q = p.copy()
    q[first:] *= factor
    return q / q.sum()


def half_precision_cdf_law(p: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The exact law of inverse-CDF sampling with the CDF cumsummed in ``dtype``: token x is drawn
    for u·c_V in [c_{x−1}, c_x), so its probability is the length of that interval of the inverse
    CDF, (c_x − c_{x−1}) / c_V."""
    cdf = torch.cumsum(torch.from_numpy(p).to(dtype), dim=0).to(torch.float64).numpy()
    cdf = np.maximum.accumulate(cdf)
    return np.diff(np.concatenate([[0.0], cdf])) / cdf[-1]


def tv(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p - q).sum())


def rejections(q: np.ndarray, p: np.ndarray, n: int, runs: int, level: float, tag: str) -> int:
    rng = np.random.default_rng(derive_seed("identity-power", tag, n))
    return sum(identity_test(rng.multinomial(n, q), p, seed=derive_seed(tag, i)).pvalue <= level
               for i in range(runs))


def null_rates(p: np.ndarray, n: int, runs: int, alphas: tuple[float, ...], tag: str) -> dict[float, float]:
    rng = np.random.default_rng(derive_seed("identity-size", tag, n))
    pvalues = np.array([identity_test(rng.multinomial(n, p), p, seed=derive_seed(tag, i)).pvalue
                        for i in range(runs)])
    return {a: float(np.mean(pvalues <= a)) for a in alphas}


def within_noise(rate: float, alpha: float, runs: int) -> bool:
    """rate ≤ α up to three binomial standard deviations."""
    return rate <= alpha + 3.0 * math.sqrt(alpha * (1 - alpha) / runs)


# --------------------------------------------------------------------------------------------
# The calibration bound
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("law", ["zipf", "uniform", "peaked"])
def test_chernoff_bound_dominates_the_poisson_tail(law: str) -> None:
    """The p-value bound is ≥ the Monte-Carlo tail of Z under exact Poisson counts (V = 512,
    20,000 draws) at 1–3 null sd."""
    vocab_size, n = 512, 800
    p = {"zipf": zipf(vocab_size), "uniform": np.full(vocab_size, 1 / vocab_size), "peaked": peaked(vocab_size)}[law]
    design = identity_design(p, n)
    positive = p > 0
    means, weights = design.means[positive], design.weights[positive]
    rng = np.random.default_rng(derive_seed("bound", law))
    draws = rng.poisson(means, size=(20_000, means.size))
    z = (((draws - means) ** 2 - draws) / weights).sum(axis=1)
    sd = design.tokens.null_sd
    assert abs(z.std() / sd - 1) < 0.05  # σ₀² = Σ 2λ²/w² is the null variance
    for k in (1.0, 2.0, 3.0):
        empirical = float(np.mean(z >= k * sd))
        bound = design.tokens.pvalue(k * sd)
        print(f"{law}: z = {k} sd, Monte Carlo tail {empirical:.2e} ≤ bound {bound:.2e}")
        assert empirical <= bound


def test_truncation_and_floor_are_reported() -> None:
    design = identity_design(zipf(4096), 20_000)
    assert 0 < design.tokens.truncation <= identity.TRUNCATION_MASS
    assert design.tokens.pvalue(1e12) <= 2 * identity.TRUNCATION_MASS
    assert design.tokens.critical_value(design.tokens.truncation / 2) == math.inf


# --------------------------------------------------------------------------------------------
# Size
# --------------------------------------------------------------------------------------------


def test_size_at_32k_default() -> None:
    p, n, runs = zipf(32_768), 100_000, 300
    rates = null_rates(p, n, runs, (0.05, 0.01), "default-32k")
    print(f"V=32768 Zipf n={n}: false-positive rate over {runs} null runs: {rates}")
    for alpha, rate in rates.items():
        assert within_noise(rate, alpha, runs)


@pytest.mark.slow
@pytest.mark.parametrize("vocab_size, law, n", [(32_768, "zipf", 100_000), (32_768, "peaked", 30_000),
                                               (131_072, "zipf", 300_000), (131_072, "uniform", 50_000)])
def test_size_over_2000_null_runs(vocab_size: int, law: str, n: int) -> None:
    p = {"zipf": zipf(vocab_size), "peaked": peaked(vocab_size), "uniform": np.full(vocab_size, 1 / vocab_size)}[law]
    runs = 2000
    rates = null_rates(p, n, runs, (0.05, 0.01, 0.001), f"slow-{vocab_size}-{law}")
    print(f"V={vocab_size} {law} n={n}: false-positive rate over {runs} null runs: {rates}")
    for alpha, rate in rates.items():
        assert within_noise(rate, alpha, runs)


# --------------------------------------------------------------------------------------------
# Power at the planned n, against deviations that live only in the tail
# --------------------------------------------------------------------------------------------


def _assert_power_at_plan(p: np.ndarray, q: np.ndarray, runs: int, tag: str) -> None:
    epsilon = tv(p, q)
    n = identity_sample_size(p, epsilon, alpha=ALPHA, power=POWER)
    planned = identity_power(p, n, epsilon, alpha=ALPHA)
    hits = rejections(q, p, n, runs, ALPHA, tag)
    print(f"{tag}: TV {epsilon:.4f}, planned n {n}, planned power {planned:.4f}, measured {hits}/{runs}")
    assert planned >= POWER
    # measured ≥ planned up to binomial noise: P(≤ hits | power = planned) must not be tiny
    from scipy import stats
    assert stats.binom.cdf(hits, runs, planned) > 1e-3


def test_power_ids_past_65535_lost() -> None:
    p = zipf(131_072)
    _assert_power_at_plan(p, ids_lost(p, 65_536), 20, "ids>=65536 lost, V=131072")


def test_power_tail_scaled() -> None:
    p = zipf(32_768)
    _assert_power_at_plan(p, tail_scaled(p, 4096, 1.25), 20, "tail x1.25, V=32768")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_power_half_precision_cdf(dtype: torch.dtype) -> None:
    p = zipf(32_768)
    q = half_precision_cdf_law(p, dtype)
    assert tv(p, q) > 0.05
    _assert_power_at_plan(p, q, 20, f"{dtype} cdf, V=32768")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ids", "tail", "bf16", "fp16"])
def test_power_over_200_runs(case: str) -> None:
    if case == "ids":
        p = zipf(131_072)
        q = ids_lost(p, 65_536)
    else:
        p = zipf(32_768)
        q = {"tail": lambda: tail_scaled(p, 4096, 1.25),
             "bf16": lambda: half_precision_cdf_law(p, torch.bfloat16),
             "fp16": lambda: half_precision_cdf_law(p, torch.float16)}[case]()
    _assert_power_at_plan(p, q, 200, f"slow {case}")


# --------------------------------------------------------------------------------------------
# Each part fails on a case made for it
# --------------------------------------------------------------------------------------------


def _part_pvalues(p: np.ndarray, q: np.ndarray, n: int, tag: str) -> dict[str, tuple[float, float]]:
    rng = np.random.default_rng(derive_seed("parts", tag))
    result = identity_test(rng.multinomial(n, q), p, seed=derive_seed("parts-test", tag))
    print(tag, result)
    return {part.name: (part.pvalue, part.share) for part in result.parts}


def test_tokens_part_fails_on_a_half_precision_cdf() -> None:
    p = zipf(32_768)
    parts = _part_pvalues(p, half_precision_cdf_law(p, torch.bfloat16), 2_000, "tokens")
    pvalue, share = parts["tokens"]
    assert pvalue <= ALPHA * share


def test_light_mass_part_fails_on_a_scaled_tail() -> None:
    p = zipf(131_072)
    n = 200_000
    light = identity_design(p, n).light
    q = p.copy()
    q[light] *= 1.1
    q /= q.sum()
    pvalue, share = _part_pvalues(p, q, n, "light-mass")["light-mass"]
    assert pvalue <= ALPHA * share


def test_light_ids_part_fails_on_ids_lost_inside_the_tail() -> None:
    """Light tokens past id 65,535 lose their mass to the other light tokens: the light mass is
    unchanged (light-mass passes), the id blocks see it."""
    p = zipf(131_072)
    n = 200_000
    q = ids_lost(p, 65_536, among=identity_design(p, n).light)
    parts = _part_pvalues(p, q, n, "light-ids")
    assert parts["light-mass"][0] > 1e-3
    assert parts["light-ids"][0] <= ALPHA * parts["light-ids"][1]


def test_light_levels_part_fails_on_a_probability_floor() -> None:
    """Ids shuffled, so id blocks mix all levels; the light tokens below a probability floor lose
    their mass to the heavier light tokens (fp16 underflow, min-p on the tail)."""
    vocab_size, n = 131_072, 200_000
    p = zipf(vocab_size)[np.random.default_rng(3).permutation(vocab_size)]
    light = identity_design(p, n).light
    floor = np.quantile(p[light], 0.5)
    q = p.copy()
    lost, kept = light[p[light] < floor], light[p[light] >= floor]
    moved = q[lost].sum()
    q[lost] = 0.0
    q[kept] *= 1.0 + moved / q[kept].sum()
    parts = _part_pvalues(p, q / q.sum(), n, "light-levels")
    assert parts["light-mass"][0] > 1e-3
    assert parts["light-ids"][0] > 1e-3
    assert parts["light-levels"][0] <= ALPHA * parts["light-levels"][1]


def test_zeros_part_fails_on_one_impossible_sample() -> None:
    p = zipf(32_768)
    p[1000] = 0.0
    p /= p.sum()
    counts = np.random.default_rng(0).multinomial(10_000, p)
    counts[1000] = 1
    result = identity_test(counts, p)
    assert result.pvalue == 0.0 and result.impossible_count == 1 and result.part("zeros").pvalue == 0.0
    counts[1000] = 0
    assert identity_test(counts, p).impossible_count == 0


# --------------------------------------------------------------------------------------------
# The API
# --------------------------------------------------------------------------------------------


def test_result_object_and_shares() -> None:
    p = zipf(32_768)
    counts = np.random.default_rng(1).multinomial(50_000, p)
    result = identity_test(counts, p, seed=7)
    assert [part.name for part in result.parts] == ["zeros", "tokens", "light-mass", "light-ids", "light-levels"]
    assert math.isclose(sum(part.share for part in result.parts), 1.0)
    assert result.pvalue == min(1.0, min(part.pvalue / part.share for part in result.parts[1:]))
    assert result.heavy_size == identity_design(p, 50_000).heavy.size
    assert result.n == 50_000 and 0.9 * 50_000 < result.n_used <= 50_000
    assert "Poissonization" in result.calibration and "no Monte Carlo" in result.calibration
    assert "id blocks" in result.pooled
    assert identity_test(counts, p, seed=7).pvalue == result.pvalue
    with pytest.raises(ValueError, match="no part"):
        result.part("heavy")
    str(result)


def test_the_designs_of_permuted_laws_share_their_token_and_level_bounds() -> None:
    p = zipf(4_099)
    other = p[np.random.default_rng(5).permutation(p.size)]  # the same masses on other ids
    first, second = identity_design(p, 3_000), identity_design(other, 3_000)
    assert first.tokens is second.tokens and first.levels_bound is second.levels_bound
    assert np.array_equal(first.level_block_means, second.level_block_means)
    for design in (first, second):  # the cells of each block test are its blocks' expected counts
        for labels, block_means in ((design.id_labels, design.id_block_means),
                                    (design.level_labels, design.level_block_means)):
            inside = labels >= 0
            assert np.allclose(np.bincount(labels[inside], weights=design.means[inside]), block_means, rtol=1e-12)
    assert identity_design(p, 3_001).tokens is not first.tokens


def test_a_law_without_light_tokens_has_only_the_tokens_part() -> None:
    p = np.full(64, 1 / 64)
    result = identity_test(np.random.default_rng(2).multinomial(10_000, p), p)
    assert [part.name for part in result.parts] == ["zeros", "tokens"]
    assert result.part("tokens").share == 1.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(counts=[1, 2], probs=[0.5, 0.25, 0.25]), "length mismatch"),
    (dict(counts=[0, 0], probs=[0.5, 0.5]), "no samples"),
    (dict(counts=[1, -1], probs=[0.5, 0.5]), "non-negative"),
    (dict(counts=[1, 1], probs=[0.5, 0.6]), "sum to"),
    (dict(counts=[1, 1], probs=[0.5, 0.5], flatten=0.0), "flatten"),
    (dict(counts=[1, 1], probs=[0.5, 0.5], shares={"tokens": 0.0}), "shares"),
])
def test_errors_name_the_argument(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        identity_test(**kwargs)


def test_planner_inverse_and_comparison() -> None:
    p = zipf(32_768)
    n = identity_sample_size(p, 0.1, alpha=ALPHA, power=POWER)
    assert identity_power(p, n, 0.1, alpha=ALPHA) >= POWER
    assert identity_detectable_tv(p, n, alpha=ALPHA, power=POWER) <= 0.1 * 1.01  # bisection to 0.1%, search heuristic
    assert identity_power(p, n // 4, 0.1, alpha=ALPHA) < POWER
    chi2 = pooled_chi2_sample_size(p, 0.1, alpha=ALPHA, power=POWER)
    assert chi2.cells < p.size and chi2.unpooled > n  # Pearson must pool; unpooled it needs far more
    with pytest.raises(ValueError, match="epsilon"):
        identity_sample_size(p, 0.0, alpha=ALPHA, power=POWER)
    with pytest.raises(ValueError, match="power"):
        identity_sample_size(p, 0.1, alpha=ALPHA, power=1.0)


def test_joint_planner_verifies_every_law_at_the_common_n() -> None:
    """Laws tested at one shared n (chains at a common per-chain n, steps of L tokens): the joint
    size is a multiple of the step, at least each law's own size, and the power bound at ε holds
    for every law at exactly that n; one law alone in steps of 1 gives its own size."""
    laws = [zipf(4_096), peaked(4_096), zipf(4_096, exponent=1.5)]
    own = [identity_sample_size(p, 0.2, alpha=ALPHA, power=POWER) for p in laws]
    n = identity_joint_sample_size(laws, 0.2, alpha=ALPHA, power=POWER, step=7)
    assert n % 7 == 0 and n >= max(own)
    assert all(identity_power(p, n, 0.2, alpha=ALPHA) >= POWER for p in laws)
    assert identity_joint_sample_size(laws[:1], 0.2, alpha=ALPHA, power=POWER) == own[0]
    with pytest.raises(ValueError, match="step"):
        identity_joint_sample_size(laws, 0.2, alpha=ALPHA, power=POWER, step=0)
    with pytest.raises(ValueError, match="laws"):
        identity_joint_sample_size([], 0.2, alpha=ALPHA, power=POWER)


@pytest.mark.parametrize("support", [1, 50, 2_000])
def test_planner_on_a_law_with_many_zeros(support: int) -> None:
    """A top-k-truncated law (V = 151,936, ``support`` tokens of positive probability).  The early-stopping
    search of the zeros part once judged each η-cell [η_i, η_i+1] against a goal loosened by e^{n'(η_i+1 − η_i)}:
    at n' ε / 20 ≳ 5 every cell stopped at the trivial bound, the power bound was 0 at every n and the
    sample-size search doubled n until the Poisson windows no longer fitted in memory (MemoryError after
    ~6 min at V = 151,936, support 50, ε = 0.2)."""
    p = np.zeros(151_936)
    rng = np.random.default_rng(support)
    p[rng.choice(p.size, support, replace=False)] = rng.dirichlet(np.ones(support))
    start = time.perf_counter()
    n = identity_sample_size(p, 0.2, alpha=ALPHA, power=POWER)
    seconds = time.perf_counter() - start
    print(f"support {support} of V = {p.size}: n = {n} for TV 0.2 in {seconds:.2f} s")
    assert identity_power(p, n, 0.2, alpha=ALPHA) >= POWER  # the full search agrees with the early-stopping one
    design = identity_design(p, n)
    assert identity._power_of_design(design, 0.2, ALPHA, goal=POWER) >= POWER
    assert n < 20_000 and seconds < 30.0
    impossible = np.zeros(p.size)  # the zeros part: one sample on a token of probability 0 rejects
    impossible[np.flatnonzero(p)[0]] = n - 1
    impossible[np.flatnonzero(p == 0)[0]] = 1
    assert identity_test(impossible.astype(np.int64), p, seed=0).pvalue < ALPHA


@pytest.mark.parametrize("vocab_size, n", [(32_768, 200_000), (131_072, 500_000), (262_144, 1_000_000)])
def test_one_test_takes_well_under_a_second(vocab_size: int, n: int) -> None:
    p = zipf(vocab_size)
    counts = np.random.default_rng(0).multinomial(n, p)
    start = time.perf_counter()
    identity_test(counts, p, seed=1)  # builds the design at this n
    fresh = time.perf_counter() - start
    start = time.perf_counter()
    identity_test(counts, p, seed=2)
    cached = time.perf_counter() - start
    print(f"V={vocab_size} n={n}: first test (with its design) {fresh:.3f} s, next test {cached:.3f} s")
    assert cached < 0.5 and fresh < 3.0  # generous: shared CI cores


def test_identity_table_script_prints_the_table() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "identity_table.py"
    spec = importlib.util.spec_from_file_location("identity_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.format_identity_table(vocab_sizes=(1024,), epsilons=(0.2,))
    print(text)
    assert "identity" in text and "χ² unpooled" in text and len(text.splitlines()) == 2 + 3
