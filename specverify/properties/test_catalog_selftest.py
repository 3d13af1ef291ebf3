"""Self-test: the property suite catches every entry of the known-bug catalog.

For each entry of ``specverify.auditing.sampler.catalog.CATALOG`` that can show at the suite's toy shapes
(``not BuggyRule.production_shaped``; the production-shape entries — vocabulary tiles, K > 8,
row blocks, dtypes, strides — are killed by the audit's production checks, tests/auditing):

(a) exact loss: for entries that follow the uniform convention (``BuggyRule.integrable``), the TV
    between one completed step and ``K+1`` target tokens, integrated exactly by
    ``specverify.core.exact``, on two fixed cases: MAIN (one request, V = 4, K = 2, partial acceptance,
    residuals on several tokens, a token with p = 0 < q, different laws per position) and PAIR
    (B = 2: a MAIN row next to a row of the mirrored chain, the batched probe of
    ``sampled_checks``); the larger is reported.  Bugs with classes not seen by these cases
    (position, batching, zero-probability) are covered by the choice of the cases.
(b) statistical kill: the suite's statistical checks run against the entry on their probe cases at
    the suite's per-execution level α.  First at the sample size the suite uses (detectable TV of
    ``budget.DETECTABLE_TV``); if none rejects there, each check whose tested law the entry
    moves (exact deviation > 0) runs with the ``n`` that detects that exact deviation with power
    ``budget.POWER`` (capped at :data:`MAX_SAMPLES`).  The table reports the killing check, the
    ``n`` it used, its p-value, and ``n_required``: the power formula's ``n`` for the exact
    deviation of the killing check's tested law.
(c) sure-event laws of ``test_laws``: the generator contract (same seed reproduces under other
    global RNG states; two seeds differ) and "a token of target probability 0 is never emitted".

An entry is killed when (a) finds a loss above ``EXACT_TOLERANCE``, (b) rejects, or (c) is
violated; every entry must be killed, and every entry with an exact loss must also be killed
statistically.  The table is printed and, when ``SPECVERIFY_SELFTEST_JSON`` names a path, written
there as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch

from specverify.auditing.isolation.faults import Fault
from specverify.auditing.sampler.catalog import CATALOG, BuggyRule
from specverify.core import exact
from specverify.core.seeding import derive_seed
from specverify.properties import budget
from specverify.properties.sampled_checks import (
    MAIN_P,
    MAIN_Q,
    Check,
    CheckOutcome,
    StepCase,
    all_checks,
    probe_cases,
    step_rule_law,
    step_target_law,
    total_variation,
)
from specverify.properties.test_laws import (
    different_seeds_differ,
    global_rngs_seeded,
    same_seed_reproduces,
    zero_probability_emissions,
)

EXACT_TOLERANCE = 1e-9
MAX_SAMPLES = 400_000
"""Cap on the samples per tested law in the escalation pass."""

TOY_SHAPED = [entry for entry in CATALOG.values() if not entry.production_shaped and not entry.ragged_only]
"""The entries the suite's toy-shaped cases can see (the ragged-row entries need ``num_draft_tokens=``)."""

ZERO_MASS_ROWS = 4096
"""Rows of the zero-probability law, every one drafting token 3 (p_0 = 0 < q_0 = 0.3) first."""


@dataclass
class EntryReport:
    """One row of the self-test table."""

    name: str
    bug_class: str
    exact_tv: float | None
    exact_case: str
    killed_by: str | None
    n: int | None
    n_required: int | None
    pvalue: float | None
    alpha: float
    at_suite_n: bool
    laws_violated: list[str]

    @property
    def killed(self) -> bool:
        exact_kill = self.exact_tv is not None and self.exact_tv > EXACT_TOLERANCE
        return exact_kill or self.killed_by is not None or bool(self.laws_violated)


def exact_loss(entry: BuggyRule) -> tuple[float, str]:
    """The larger exact one-step TV of ``entry`` on MAIN and on PAIR (both slots)."""
    cases = probe_cases()
    step_joint, pair = cases["step_joint"], cases["batched_rows"]
    assert isinstance(step_joint, StepCase) and isinstance(pair, StepCase)
    main = step_joint.chains[0]
    losses = {"MAIN": exact.exact_step_tv(entry.fn, main, main.num_draft)}
    losses["PAIR"] = max(
        total_variation(step_rule_law(pair, r, entry.fn), step_target_law(pair, r)) for r in range(len(pair.chains))
    )
    case = max(losses, key=losses.__getitem__)
    return losses[case], case


def statistical_kill(
    entry: BuggyRule, checks: tuple[Check, ...], alpha: float, base_seed: int
) -> tuple[Check | None, CheckOutcome | None, int | None, bool]:
    """(killing check, its outcome, n_required, killed at the suite's n) — see the module docstring."""
    deviations = {check.name: check.exact_deviation(entry.fn) if entry.integrable else None for check in checks}

    def required(check: Check) -> int | None:
        deviation = deviations[check.name]
        return check.sample_size_for(deviation, alpha) if deviation and deviation > EXACT_TOLERANCE else None

    def seed(check: Check, n: int) -> int:
        return derive_seed("selftest", entry.name, check.name, n, base=base_seed)

    for check in checks:
        n = check.default_n(alpha)
        outcome = check(entry.fn, alpha=alpha, seed=seed(check, n), n=n)
        if outcome.rejected:
            return check, outcome, required(check), True
    escalation = [(size, check) for check in checks if (size := required(check))]
    for size, check in sorted(escalation, key=lambda sized: sized[0]):
        n = min(MAX_SAMPLES, size)
        outcome = check(entry.fn, alpha=alpha, seed=seed(check, n), n=n)
        if outcome.rejected:
            return check, outcome, size, False
    return None, None, None, False


def violated_laws(entry: BuggyRule, base_seed: int) -> list[str]:
    """The sure-event laws of ``test_laws`` that ``entry`` breaks on fixed inputs."""
    seed = derive_seed("selftest-laws", entry.name, base=base_seed)
    violated = []
    try:
        if not same_seed_reproduces(entry.fn, seed):
            violated.append("same generator seed reproduces")
        if not different_seeds_differ(entry.fn, seed):
            violated.append("output depends on the generator")
        target_probs = torch.from_numpy(MAIN_P).float().repeat(ZERO_MASS_ROWS, 1, 1)
        draft_probs = torch.from_numpy(MAIN_Q).float().repeat(ZERO_MASS_ROWS, 1, 1)
        draft_tokens = torch.tensor([[3, 0]]).repeat(ZERO_MASS_ROWS, 1)
        generator = torch.Generator().manual_seed(seed)
        if zero_probability_emissions(entry.fn, target_probs, draft_probs, draft_tokens, generator):
            violated.append("token of target probability 0 never emitted")
    except (AssertionError, Fault) as error:  # malformed output: the format law of test_laws
        violated.append(f"output format ({error})")
    return violated


def examine(entry: BuggyRule, checks: tuple[Check, ...], alpha: float, base_seed: int) -> EntryReport:
    with global_rngs_seeded(derive_seed("selftest-global-rng", entry.name, base=base_seed)):
        exact_tv, exact_case = exact_loss(entry) if entry.integrable else (None, "-")
        check, outcome, n_required, at_suite_n = statistical_kill(entry, checks, alpha, base_seed)
        laws = violated_laws(entry, base_seed)
    return EntryReport(
        name=entry.name, bug_class=entry.bug_class, exact_tv=exact_tv, exact_case=exact_case,
        killed_by=check.name if check else None, n=outcome.n if outcome else None, n_required=n_required,
        pvalue=outcome.pvalue if outcome else None, alpha=alpha, at_suite_n=at_suite_n, laws_violated=laws,
    )


def format_table(reports: list[EntryReport]) -> str:
    header = (f"{'entry':<34} {'class':<16} {'exact TV':>9} {'case':<5} {'killed by':<24} {'n':>7} {'n_req':>8} "
              f"{'p-value':>9}  laws violated")
    lines = [header, "-" * len(header)]
    for r in reports:
        exact_tv = f"{r.exact_tv:.4g}" if r.exact_tv is not None else "n/a"  # ignores uniforms: not integrable
        killed = (r.killed_by or "-") + ("" if r.at_suite_n or not r.killed_by else " (+n)")
        lines.append(
            f"{r.name:<34} {r.bug_class:<16} {exact_tv:>9} {r.exact_case:<5} {killed:<24} "
            f"{r.n if r.n else '-':>7} {r.n_required if r.n_required else '-':>8} "
            f"{f'{r.pvalue:.2g}' if r.pvalue is not None else '-':>9}  {', '.join(r.laws_violated) or '-'}"
        )
    return "\n".join(lines)


def test_every_catalog_entry_is_killed(specverify_base_seed, specverify_suite_alpha):
    alpha = budget.alpha_per_execution(specverify_suite_alpha)
    checks = all_checks()
    reports = [examine(entry, checks, alpha, specverify_base_seed) for entry in TOY_SHAPED]
    print(f"\ncatalog self-test at alpha={alpha:.3g} per check ({budget.describe(specverify_suite_alpha)}); "
          "'(+n)': killed only with n_required samples\n" + format_table(reports))
    path = os.environ.get("SPECVERIFY_SELFTEST_JSON")
    if path:
        Path(path).write_text(json.dumps([asdict(r) | {"killed": r.killed} for r in reports], indent=2))

    survivors = [r.name for r in reports if not r.killed]
    assert not survivors, f"catalog entries the suite does not catch: {survivors}"
    unseen = [r.name for r in reports if r.exact_tv is not None and r.exact_tv <= EXACT_TOLERANCE]
    assert not unseen, f"integrable entries with no exact loss on the self-test cases: {unseen}"
    missed = [r.name for r in reports if r.exact_tv is not None and r.killed_by is None]
    assert not missed, f"entries with an exact loss that no statistical check rejects: {missed}"


SUITE_FILES = ("test_exact_properties.py", "test_laws.py", "test_statistical.py")


def run_suite(impl: str) -> subprocess.CompletedProcess:
    """``pytest <suite files> -m "uses_impl and not slow" -x --specverify-impl <impl>``: only the tests that
    exercise the implementation, so that a failure is the implementation's."""
    here = Path(__file__).resolve().parent
    command = [sys.executable, "-m", "pytest", *(str(here / f) for f in SUITE_FILES), "-x", "-q",
               "-p", "no:cacheprovider", "-m", "uses_impl and not slow", f"--specverify-impl={impl}"]
    return subprocess.run(command, capture_output=True, text=True, cwd=here.parents[1], timeout=1800)


def _explain(completed: subprocess.CompletedProcess) -> str:
    return f"exit status {completed.returncode}:\n{completed.stdout[-3000:]}\n{completed.stderr[-2000:]}"


@pytest.mark.slow
def test_suite_run_passes_on_the_reference():
    """The control: the same command with ``--specverify-impl reference`` exits 0."""
    completed = run_suite("reference")
    assert completed.returncode == 0, _explain(completed)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(entry.name for entry in TOY_SHAPED))
def test_suite_run_fails_on_catalog_entry(name):
    """The same command with ``--specverify-impl catalog:<name>`` exits 1 (tests failed) for every entry."""
    completed = run_suite(f"catalog:{name}")
    assert completed.returncode == 1, _explain(completed)
