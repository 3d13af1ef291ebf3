"""Diagnosis: read the pattern of verdicts across an audit's checks as one or two sentences.

Each sampler check declares the piece of modified rejection sampling (Leviathan et al. 2023,
Algorithm 1) it isolates, its :class:`~specverify.auditing.checks.Locus`: ``bonus`` (q = p, so
every draft is accepted and only the bonus token, drawn from p_K, can be wrong), ``correction``
(drafts accepted up to a rejection whose correction comes from (p − q)+), ``residual-is-target``
(disjoint supports: every draft rejected, where (p − q)+ = p, so a residual confused with p passes
there), ``one-row-exact`` (one row alone, integrated exactly), ``single-draft`` / ``multi-draft``,
``context`` (context-dependent laws and whole decoding loops) and ``edge-case``; the
production-shape checks declare :attr:`~specverify.auditing.checks.Check.production_shape` (real
vocabularies, K up to 32, batches of 1,024, bf16/fp16, strided views).  The acceptance counts of
the step checks are compared with the optimal rule's law P(A ≥ a) = Π_{i<a} α_i: a lossless rule
accepts exactly that often.  :func:`diagnose` combines these into a statement of *where* the loss
is, reading loci and never check names.  It is a reading of the evidence, not a further test: the
verdicts stay those of the checks.

Under fail-fast the audit stops at its first failing check, but first runs the checks of its level
whose locus is locating (:attr:`~specverify.auditing.checks.Locus.locating`) that have not run
(checks of the planned battery, with their shares of α, run out of order), so the reading is made
on the first failure plus those; it says so, and that ``--no-fail-fast`` runs the rest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from specverify.auditing.checks import CheckKind, CheckResult, Locus, Verdict

ACCEPTANCE_Z = 6.0
"""A step check's acceptance rate at a draft position counts as off the optimal rule's when it
deviates by more than this many binomial standard errors (descriptive, not a test)."""


def _shape(check: CheckResult) -> str:
    """"V=…, K=…, B=…, dtype, layout" of a production check's parameters (its cases for the exact one)."""
    parameters = dict(check.parameters)
    if "cases" in parameters:
        return f"{len(parameters['cases'])} exact cases"
    return ", ".join(f"{key}={parameters[key]}" if key in ("V", "K", "B") else str(parameters[key])
                     for key in ("V", "K", "B", "dtype", "layout") if key in parameters)


def acceptance_deviations(checks: Sequence[CheckResult]) -> list[str]:
    """Draft positions whose acceptance rate P(A > i) is off the optimal rule's by more than
    :data:`ACCEPTANCE_Z` standard errors, as ``"step-K4 position 2: 0.61 vs 0.48"``."""
    found = []
    for check in checks:
        acceptance = check.acceptance
        if not acceptance:
            continue
        observed = [float(x) for x in acceptance["observed"]]
        expected = [float(x) for x in acceptance["expected"]]
        n = sum(observed)
        if n <= 0:
            continue
        for i in range(1, len(observed)):  # P(A ≥ i): draft i − 1 accepted
            seen, law = sum(observed[i:]) / n, sum(expected[i:])
            error = math.sqrt(max(law * (1 - law), 1e-12) / n)
            if abs(seen - law) > ACCEPTANCE_Z * error:
                found.append(f"{check.name} draft {i - 1}: accepted {seen:.3f} vs {law:.3f}")
                break
    return found


def diagnose(checks: Sequence[CheckResult], level: str = "sampler", *, stopped_early: bool = False) -> str:
    """One or two sentences on where the loss is, from the verdicts of ``checks`` (``""`` when no
    check failed).  Sampler level; other levels get a summary of the failing check kinds.
    ``stopped_early``: fail-fast skipped the checks after the first failure except the locating
    ones; the reading is made on what ran and says so (see the module docstring)."""
    failed = [c for c in checks if c.verdict is Verdict.FAIL]
    if not failed:
        return ""
    reading = _reading(Evidence(checks), level, stopped_early)
    if not stopped_early:
        return reading
    skipped = sum(c.verdict is Verdict.SKIPPED for c in checks)
    ran = [c.name for c in checks if c.locus is not None and c.locus.locating and c.verdict is not Verdict.SKIPPED
           and c.name != failed[0].name]
    located = f" and the locating checks ({', '.join(ran)})" if ran else ""
    return (f"{reading} (Read from the first failure ({failed[0].name}){located}; fail-fast skipped the other "
            f"{skipped} checks: --no-fail-fast (fail_fast=False) runs them.)")


class Evidence:
    """The verdicts of an audit's checks, read by locus (:class:`~specverify.auditing.checks.Locus`)."""

    def __init__(self, checks: Sequence[CheckResult]) -> None:
        self.checks = list(checks)
        self.failed = [c for c in self.checks if c.verdict is Verdict.FAIL]
        self.lossy = [c for c in self.failed if c.kind is not CheckKind.CONTRACT]

    def of(self, locus: Locus) -> list[CheckResult]:
        return [c for c in self.checks if c.locus is locus]

    def passed(self, locus: Locus) -> bool:
        """Some check of ``locus`` ran and every one that ran passed."""
        ran = [c for c in self.of(locus) if c.verdict is not Verdict.SKIPPED]
        return bool(ran) and all(c.verdict is Verdict.PASS for c in ran)

    def fails(self, locus: Locus) -> bool:
        """A check of ``locus`` detected a loss."""
        return any(c.locus is locus for c in self.lossy)

    def contract_failed(self, locus: Locus) -> bool:
        return any(c.locus is locus and c.kind is CheckKind.CONTRACT for c in self.failed)

    def names(self, locus: Locus) -> str:
        """The names of the checks of ``locus``, as the report names them."""
        return ", ".join(c.name for c in self.of(locus))


def _reading(evidence: Evidence, level: str, stopped_early: bool) -> str:
    sentences = []
    if evidence.contract_failed(Locus.RANDOMNESS_SOURCE):
        source = evidence.names(Locus.RANDOMNESS_SOURCE)
        sentences.append(f"The randomness does not come from the generator alone ({source} failed), so seeded runs "
                         "are not reproducible or successive calls share random numbers.")
    if evidence.contract_failed(Locus.INPUTS_UNCHANGED):
        sentences.append(f"The function modifies the tensors it is given ({evidence.names(Locus.INPUTS_UNCHANGED)} "
                         "failed).")
    lossy = evidence.lossy
    if level != "sampler":
        handling = sorted(c.name for c in lossy if c.kind is CheckKind.REQUEST_HANDLING)
        if handling:
            sentences.append(f"The server's stop / length handling is wrong ({', '.join(handling)}): it returns tokens "
                             "that the request's max_tokens, stop strings or end token rule out.")
        other = sorted(c.name for c in lossy if c.kind is not CheckKind.REQUEST_HANDLING)
        if other:
            sentences.append(f"The generated tokens do not follow the target's law ({', '.join(other)}).")
        return " ".join(sentences)
    if not lossy:
        return " ".join(sentences)
    sentences.append(_where(evidence, stopped_early))
    return " ".join(sentences)


def _where(evidence: Evidence, stopped_early: bool) -> str:
    """The sentence on where a loss is, from the first pattern of verdicts that fits."""
    passed, fails, names = evidence.passed, evidence.fails, evidence.names
    acceptance = acceptance_deviations(evidence.checks)
    statistical = [c for c in evidence.lossy if c.locus is not Locus.ONE_ROW_EXACT]
    production = [c for c in statistical if c.production_shape]
    toy_shapes = [c for c in statistical if not c.production_shape]
    lossy_names = ", ".join(sorted(c.name for c in evidence.lossy))
    if production and not toy_shapes:
        shapes = "; ".join(f"{c.name} ({_shape(c)})" for c in sorted(production, key=lambda c: c.name))
        return ("Right at toy shapes, wrong at production shapes only: a bug of the vocabulary size (tiles, "
                "precision of the CDF), the number of drafts, the batch size, the input dtype or the layout "
                f"of the inputs. Failing: {shapes}.")
    if passed(Locus.ONE_ROW_EXACT) and toy_shapes:
        return (f"One request alone is exactly right ({names(Locus.ONE_ROW_EXACT)} passed) but batches mixing "
                "different requests are not: rows of a batch influence each other (a batch-indexing bug).")
    if acceptance:
        return ("The acceptance test is wrong: drafts are accepted at another rate than min(1, p/q) gives ("
                + "; ".join(acceptance[:2]) + ").")
    if fails(Locus.CORRECTION) and passed(Locus.BONUS):
        where = ("the correction token drawn after a rejection is wrong; accepted drafts and the bonus token are "
                 f"right ({names(Locus.BONUS)} passed, acceptance rates match the optimal rule)")
        if passed(Locus.RESIDUAL_IS_TARGET):
            where += (f". It is right when draft and target do not overlap ({names(Locus.RESIDUAL_IS_TARGET)} "
                      "passed), where (p − q)+ = p: the residual is not norm(max(0, p − q)) (e.g. p itself)")
        return where[0].upper() + where[1:] + "."
    if fails(Locus.BONUS) and not fails(Locus.CORRECTION):
        evidence_said = (f"; accepted drafts and the correction after a rejection are right ({names(Locus.CORRECTION)} "
                         "passed)" if passed(Locus.CORRECTION)
                         else f" ({names(Locus.BONUS)} failed, where every draft is accepted)")
        return f"The bonus token (drawn when all K drafts are accepted) is wrong{evidence_said}."
    if fails(Locus.BONUS) and fails(Locus.CORRECTION):
        return ("Both the correction and the bonus token are wrong while the acceptance rates match the "
                "optimal rule: the final token is drawn from the wrong distribution or position.")
    if passed(Locus.SINGLE_DRAFT) and fails(Locus.MULTI_DRAFT):
        return (f"Single-draft steps are right ({names(Locus.SINGLE_DRAFT)} passed) but steps with several drafts "
                "are not: a position index is off for drafts after the first.")
    if statistical and all(c.locus is Locus.CONTEXT for c in statistical):
        return ("Context-free single steps are right, but context-dependent targets or whole decoding "
                f"loops are not ({', '.join(sorted(c.name for c in statistical))}): state carried between positions "
                "or calls is wrong.")
    if statistical and all(c.locus is Locus.EDGE_CASE for c in statistical):
        return f"The common case is right; only edge cases fail ({', '.join(sorted(c.name for c in statistical))})."
    if fails(Locus.SINGLE_DRAFT) and len(evidence.lossy) >= 3:
        return (f"{len(evidence.lossy)} loss checks failed, including single steps with one draft: the step's "
                "output law is wrong across positions.")
    if stopped_early:
        return (f"The output law is wrong in {lossy_names}; the locating checks do not single out one piece of the "
                "rule.")
    return f"The output law is wrong in {lossy_names}; run the whole battery for a diagnosis of where."


CLOSE_TV = 0.03
"""The least TV :func:`separation` allows between a law the tokens follow and one they do not."""

CATALOG_ROWS = 5_000
"""Rows each catalog entry is run on by :func:`closest_catalog_entry` (26 entries)."""


def separation(cells: int, rows: int) -> float:
    """The TV within which an empirical distribution of ``rows`` draws over ``cells`` counts as
    following a law, and beyond which it counts as not following it: max(CLOSE_TV, 2·√((c − 1)/n)).
    Sampling noise alone is smaller: E TV(empirical, law) = ½ Σ E|p̂_j − p_j| ≤ ½ Σ √(p_j(1 − p_j)/n)
    ≤ ½ √((c − 1)/n) (Cauchy–Schwarz), a quarter of the bound (a difference of two samples:
    √2 times that), so a correct rule is not read as following a wrong law (descriptive, not a test)."""
    return max(CLOSE_TV, 2.0 * math.sqrt(max(cells - 1, 1) / max(rows, 1)))

MIN_ROWS_READ = 200
"""Rows a position needs (corrections after a rejection, bonus tokens) for its law to be read."""


def _tv(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return 0.5 * float(np.abs(a / max(a.sum(), 1e-300) - b / max(b.sum(), 1e-300)).sum())


def followed_law(p: Any, q: Any, drafts: Sequence[int], tokens: Any, column: int) -> str:
    """Which law the tokens in ``column`` of a minimal case follow, when it is a known wrong one.

    ``p [K+1, V]``, ``q [K, V]`` (float64), ``drafts`` fixed, ``tokens [rows, K+1]`` as emitted.
    Column K (every draft accepted): the bonus token, whose law is p_K; the candidates are p_K,
    q_{K−1} and p_{K−1}.  Column i < K: the tokens other than the draft x_i (so the corrections
    after a rejection, the only non-draft tokens modified rejection sampling emits there), whose law
    is norm(max(0, p_i − q_i)) restricted to t ≠ x_i; the candidates are that, p_i, q_i,
    norm(|p_i − q_i|) and the next position's residual.  The closest candidate (TV) is named when it
    is within :func:`separation` and the right law is not; "" otherwise (and with fewer than
    :data:`MIN_ROWS_READ` such tokens)."""
    import numpy as np

    p, q, tokens = np.asarray(p, dtype=float), np.asarray(q, dtype=float), np.asarray(tokens)
    k, v = q.shape
    values = tokens[:, column]
    if column == k:
        keep = np.ones(v, dtype=bool)
        what, right = "the bonus token", (f"p_{k}", p[k])
        candidates = [right, (f"q_{k - 1}", q[k - 1]), (f"p_{k - 1}", p[k - 1])]
    else:
        keep = np.arange(v) != drafts[column]
        what, right = f"the correction at position {column}", (f"norm(max(0, p_{column} − q_{column}))",
                                                               np.maximum(p[column] - q[column], 0.0))
        candidates = [right, (f"p_{column}", p[column]), (f"q_{column}", q[column]),
                      (f"norm(|p_{column} − q_{column}|)", np.abs(p[column] - q[column]))]
        if column + 1 < k:
            candidates.append((f"norm(max(0, p_{column + 1} − q_{column + 1}))",
                               np.maximum(p[column + 1] - q[column + 1], 0.0)))
    read = values[(values >= 0) & (values < v)]
    read = read[keep[read]]
    if len(read) < MIN_ROWS_READ:
        return ""
    observed = np.bincount(read, minlength=v)[keep]
    laws = [(name, law[keep] / law[keep].sum()) for name, law in candidates if law[keep].sum() > 0]
    distances = [_tv(observed, law) for _, law in laws]
    best = int(np.argmin(distances))
    right_tv = distances[0] if laws[0][0] == right[0] else 1.0
    apart = separation(int(keep.sum()), len(read))
    right_law = right[1][keep] / right[1][keep].sum()
    if np.allclose(laws[best][1], right_law) or distances[best] > apart or right_tv <= apart:
        return ""
    same = " = ".join(name for name, law in laws if np.allclose(law, laws[best][1]))  # equal laws on this step
    return (f"{what} follows {same}, not {right[0]} (TV {distances[best]:.3f} vs {right_tv:.3f} over {len(read):,} "
            "tokens)")


def closest_catalog_entry(p: Any, q: Any, drafts: Sequence[int], tokens: Any, seed: int,
                          deadline: float | None = None) -> str:
    """The known bug (:mod:`specverify.auditing.sampler.catalog`) whose output on the same step,
    and seed is closest to the function's: the entry whose per-position token distributions are
    all within :func:`separation` of the function's, with the smallest largest TV, when the correct
    rule's are not; "" otherwise.  The entries run in this process on :data:`CATALOG_ROWS` rows of
    the case's inputs (float32, as the function got them), with the global RNG forked.
    ``deadline`` (a ``time.perf_counter()`` reading): no entry starts after it
    (:class:`~specverify.auditing.isolation.faults.CutOff` then)."""
    import numpy as np
    import torch

    from specverify.auditing.isolation.faults import CutOff
    from specverify.auditing.sampler.catalog import CATALOG
    from specverify.core.rules import verify

    tokens = np.asarray(tokens)
    width = tokens.shape[1]
    rows = min(len(tokens), CATALOG_ROWS)
    v = np.asarray(p).shape[1]
    inputs = (torch.tensor(np.asarray(p), dtype=torch.float32).repeat(rows, 1, 1),
              torch.tensor(np.asarray(q), dtype=torch.float32).repeat(rows, 1, 1),
              torch.tensor([list(drafts)]).repeat(rows, 1))

    def histogram(emitted: Any) -> Any:
        clipped = np.where(emitted < 0, v, emitted)
        return np.stack([np.bincount(clipped[:, c], minlength=v + 1)[:v + 1] for c in range(width)])

    def distance(rule: Any) -> float:
        with torch.random.fork_rng():
            emitted = rule(*inputs, torch.Generator().manual_seed(seed)).numpy()
        if emitted.shape != (rows, width) or emitted.min() < -1 or emitted.max() >= v:
            return 1.0
        theirs = histogram(emitted)
        return max(_tv(mine[c], theirs[c]) for c in range(width))

    mine = histogram(tokens)
    found = []
    for name, entry in CATALOG.items():
        if deadline is not None and time.perf_counter() >= deadline:
            raise CutOff(f"the closest catalog entry: {name} and the entries after it not run, the deadline has passed")
        try:
            found.append((distance(entry.fn), name))
        except Exception:  # an entry that cannot take this step (a production shape) is not a candidate
            continue
    if not found:
        return ""
    best, name = min(found)
    right = distance(verify)
    apart = separation(v + 1, rows)
    if best > apart or right <= apart:
        return ""
    return (f"closest known bug: catalog:{name.replace('_', '-')} (on this step its tokens are within TV {best:.3f} "
            f"of the function's at every position, the correct rule's {right:.3f}; `specverify audit --list`)")
