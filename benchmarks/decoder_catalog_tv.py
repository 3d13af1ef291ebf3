"""The TV ε̄ at which the decoder level's position-law check sees each decoder, by Monte Carlo.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 python3 benchmarks/decoder_catalog_tv.py [--calls 1000] [NAME ...]
    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 python3 benchmarks/decoder_catalog_tv.py --quick-plans 20 reference ...

NAME: a decoder catalog entry (default: all six) or a correct decoder, ``reference``,
``reference-mtp`` or ``prompt-lookup`` (whose ε̄ must come out ≈ 0: the estimator's noise).  Each
decoder decodes ``--calls`` continuations per stratum of
:data:`specverify.auditing.decoder.battery.POSITION_STRATA` (the reference decoder batched: B
requests in one call, each with its own generator, which gives each row the law of a single
call), and the check's own code counts them (:meth:`PositionLawCheck.count`, one transition
test per lag, :meth:`PositionLawCheck.lag_fits`).

What is printed, per lag ℓ.  Under the decoder's law each lag's Pearson X² is ≈ noncentral
χ²_dof(λ_ℓ) with ``λ_ℓ = 4 n L ε̄_ℓ²`` (n calls of L tokens; ε̄_ℓ the root mean square over blocks
of the χ²-distance form of the deviation, ≥ the RMS TV of the module docstring of
:mod:`specverify.auditing.decoder.battery`), so ``E[X²] = dof + λ`` gives the unbiased estimate
``λ̂ = X² − dof`` and ``ε̄_ℓ = √(max(λ̂, 0) / (4 n L))``; beside it, the upper end of its
two-standard-error interval, ``√((λ̂ + 2σ) / (4 n L))`` with ``σ² = 2 dof + 4 λ̂`` (``Var X²``).
ε̄, the largest over the lags, is the TV the plan compares with its budget: the check has power
≥ 0.99 against a decoder whose ε̄ is at least the budget's.  Also printed: the power of the
check at each named budget's n calls, computed from λ̂ scaled to that n (noncentral χ² at the final look's level α / Λ).

``--quick-plans R``: R replicates of the check's ``quick`` plan at α = 1e-3 (its calls, each on a
stratum drawn uniformly, judged by :meth:`PositionLawCheck.judge` at every look's level, as the
audit runs it); prints the replicates that fail and the calls at their first failing look: the
kill of a buggy decoder, and for a correct one the false alarms, Binomial(R, ≤ α).  Each
replicate's outcome is printed as it finishes, so a run stopped early still counts its replicates.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reference.decoder  # noqa: E402
from reference.drafters import ModelDrafter, MTPDrafter, MTPHead, PromptLookupDrafter  # noqa: E402
from specverify.auditing.checks import Tally  # noqa: E402
from specverify.auditing.decoder.battery import (  # noqa: E402
    CONTINUATION_LENGTH,
    DECODER_BUDGETS,
    POSITION_STRATA,
    DecoderModels,
    PositionLawCheck,
    resolve_decoder_budget,
)
from specverify.auditing.decoder.catalog import DECODER_CATALOG  # noqa: E402
from specverify.auditing.endpoint.pit import token_pit_values  # noqa: E402
from specverify.core.seeding import derive_seed  # noqa: E402
from specverify.core.sequential import final_look_alpha  # noqa: E402

ALPHA = 1e-3
POWER = 0.99
CHUNK = 250
"""Requests decoded in one batch."""


def correct_decoder(name: str):
    """A batched correct decoder: ``fn(target, draft, input_ids [B, T], **settings) -> [B, L]``."""

    def decode(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
        drafter = {
            "reference": lambda: ModelDrafter(draft),
            "reference-mtp": lambda: MTPDrafter(MTPHead(target, seed=reference.decoder.MTP_HEAD_SEED)),
            "prompt-lookup": PromptLookupDrafter,
        }[name]()
        return reference.decoder.speculative_generate(
            target,
            drafter,
            list(input_ids),
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
        ).tokens

    return decode


def decoder(name: str):
    if name in DECODER_CATALOG:
        return DECODER_CATALOG[name].fn
    if name in ("reference", "reference-mtp", "prompt-lookup"):
        return correct_decoder(name)
    raise SystemExit(
        f"NAME: {name!r} is neither a catalog entry ({', '.join(DECODER_CATALOG)}) nor a correct "
        "decoder (reference, reference-mtp, prompt-lookup)"
    )


def decode(check: PositionLawCheck, name: str, s: int, calls: int, seed: object) -> np.ndarray:
    """``calls`` continuations ``[calls, L]`` of stratum ``s`` by decoder ``name``, in batches."""
    fn = decoder(name)
    stratum = check.strata[s]
    target, draft = check.models.pair(stratum.models)
    setting = stratum.setting
    rows = []
    for chunk in range(math.ceil(calls / CHUNK)):
        size = min(CHUNK, calls - chunk * CHUNK)
        prompts = torch.tensor([stratum.prompt] * max(size, 2))  # B > 1: the batched form
        with torch.no_grad():
            tokens = fn(
                target,
                draft,
                prompts,
                max_new_tokens=check.length,
                temperature=setting.temperature,
                top_k=setting.top_k,
                top_p=setting.top_p,
                seed=derive_seed("decoder_catalog_tv", seed, chunk),
            )
        rows.append(tokens[:size].cpu().numpy())
    return np.concatenate(rows) if rows else np.zeros((0, check.length), dtype=np.int64)


def pit_values(check: PositionLawCheck, s: int, tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return token_pit_values(check.models.conditional_laws(check.strata[s], tokens), tokens, rng.random(tokens.shape))


def tally(check: PositionLawCheck, name: str, calls: int) -> np.ndarray:
    """The check's counts ``[S, Λ, L, B, B + 1]`` of ``calls`` continuations per stratum."""
    counts = check.empty_counts()
    pit = np.random.default_rng(derive_seed("decoder_catalog_tv pit", name))
    for s in range(len(check.strata)):
        check.count(counts[s], pit_values(check, s, decode(check, name, s, calls, (name, s)), pit))
    return counts


def quick_plan(check: PositionLawCheck, name: str, replicate: int) -> tuple[int | None, float]:
    """One replicate of the ``quick`` plan: the calls at the first look that fails (None: none
    fails), and the smallest p-value / level over the looks."""
    plan = check.plan(resolve_decoder_budget("quick"), ALPHA, derive_seed("decoder_catalog_tv plan", replicate))
    rng = np.random.default_rng(derive_seed("decoder_catalog_tv false alarm", name, replicate))
    strata = rng.integers(len(check.strata), size=plan.n)
    counts = np.stack([check.empty_counts() for _ in plan.looks])
    for s in range(len(check.strata)):
        calls = np.flatnonzero(strata == s)
        values = pit_values(check, s, decode(check, name, s, len(calls), (name, replicate, s)), rng)
        for look, size in enumerate(plan.looks):
            check.count(counts[look, s], values[calls < size])
    ratio, failed_at = math.inf, None
    for look, (size, level) in enumerate(zip(plan.looks, plan.look_alphas)):
        result = check.judge(plan, Tally(size, {"blocks": counts[look]}), level, look + 1)
        ratio = min(ratio, result.pvalue / level)
        if failed_at is None and result.pvalue <= level:
            failed_at = size
    return failed_at, ratio


def report(check: PositionLawCheck, name: str, counts: np.ndarray, seconds: float) -> str:
    n = int(counts[:, 0].sum()) // check.length
    tokens = n * check.length
    lines = [f"{name}: {n} calls ({n // len(check.strata)} per stratum), {seconds:.0f} s"]
    estimates = []
    for lag, fit in zip(check.lags, check.lag_fits(counts)):
        if fit.impossible_count:
            lines.append(f"  lag {lag}: {fit.impossible_count} token(s) of probability 0 (certain loss)")
            estimates.append((math.inf, 0.0, math.inf))
            continue
        excess = max(fit.statistic - fit.dof, 0.0)
        epsilon = math.sqrt(excess / (4 * tokens))
        upper = math.sqrt((excess + 2 * math.sqrt(2 * fit.dof + 4 * excess)) / (4 * tokens))
        estimates.append((epsilon, upper, excess / n))
        lines.append(
            f"  lag {lag}: X² = {fit.statistic:.0f}, dof {fit.dof}, p = {fit.pvalue:.3g}; "
            f"ε̄ = {epsilon:.4f} (≤ {upper:.4f})"
        )
    worst = max(range(len(estimates)), key=lambda i: estimates[i][0])
    epsilon, upper, per_call = estimates[worst]
    if math.isfinite(epsilon):
        lines.append(f"  ε̄ = {epsilon:.4f} (≤ {upper:.4f}; lag {check.lags[worst]})")
    else:
        impossible = int(counts[:, 0, ..., check.bins].sum())
        lines.append(f"  certain loss: {impossible} tokens of probability 0 in {n} calls")
    if math.isfinite(per_call):
        powers = []
        for budget, target_tv in DECODER_BUDGETS.items():
            level = final_look_alpha(ALPHA) / len(check.lags)
            planned = check.required_samples(target_tv, alpha=final_look_alpha(ALPHA), power=POWER)
            dof = check.num_cells - 1
            critical = sps.chi2.isf(level, dof)
            lags_power = [float(sps.ncx2.sf(critical, dof, max(e[2], 1e-12) * planned)) for e in estimates]
            powers.append(f"{budget} ({planned} calls) {max(lags_power):.3f}")
        lines.append("  power at " + ", ".join(powers))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="catalog entries or correct decoders (default: the catalog)")
    parser.add_argument("--calls", type=int, default=1000, help="continuations per stratum (default 1000)")
    parser.add_argument("--quick-plans", type=int, metavar="R", help="R replicates of the quick plan instead")
    args = parser.parse_args()
    models = DecoderModels()
    check = PositionLawCheck("position-laws", "Monte Carlo", POSITION_STRATA, CONTINUATION_LENGTH, models)
    for name in args.names or sorted(DECODER_CATALOG):
        started = time.perf_counter()
        if args.quick_plans:
            outcomes = []
            for replicate in range(args.quick_plans):
                failed_at, ratio = quick_plan(check, name, replicate)
                outcomes.append((failed_at, ratio))
                verdict = "passes" if failed_at is None else f"fails at {failed_at} calls"
                print(
                    f"{name}: replicate {replicate}: {verdict}, smallest p-value / level {ratio:.3g} "
                    f"({time.perf_counter() - started:.0f} s so far)",
                    flush=True,
                )
            failed = [calls for calls, _ in outcomes if calls is not None]
            ratios = ", ".join(f"{ratio:.3g}" for _, ratio in outcomes)
            print(
                f"{name}: quick plan, {args.quick_plans} replicates: {len(failed)} fail, at calls {failed} "
                f"({time.perf_counter() - started:.0f} s); smallest p-value / level per replicate: {ratios}",
                flush=True,
            )
            continue
        counts = tally(check, name, args.calls)
        print(report(check, name, counts, time.perf_counter() - started), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
