"""The audit's statistical checks are group-sequential and the audit stops at the first failure.

- A gross loss stops its check at the first look (n/16 of the planned sample), a correct rule
  runs every look to the planned n.
- Fail-fast: the default for ``quick`` and ``standard``, off for ``thorough`` and fixed budgets,
  switchable both ways; skipped checks say why, the diagnosis says it cannot locate the loss from
  an incomplete pattern, and the replay line repeats a non-default choice.
- First looks first: under fail-fast, every statistical check runs its first look before any
  check runs its later looks, so a loss that only a late check sees ends the audit within the
  first sixteenth of its work; a run in parts draws and judges exactly as a run in one.
- Calibration: the false-positive rate of the sequential checks on the lossless reference, over
  all their looks, with seeds drawn from the run's base seed (``--specverify-seed random`` for
  fresh ones), is at most the level they were given (printed with its interval).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import specverify
from specverify.auditing.audited import AuditSession
from specverify.auditing.checks import CheckKind, LooksReached, Plan, SequentialCheck, Tally, Verdict
from specverify.auditing.defaults import FAIL_FAST_SKIP
from specverify.auditing.endpoint import context_law, load
from specverify.auditing.isolation.faults import Fault
from specverify.auditing.runner import plan_checks
from specverify.auditing.sampler.battery import SamplerBattery
from specverify.core import rules, stats
from specverify.core.seeding import derive_seed

WITHOUT_UNIFORMS = str(Path(__file__).resolve().parents[2] / "benchmarks" / "without_uniforms.py")


def test_a_gross_loss_stops_at_the_first_look():
    # residual_is_target (exact TV 0.12 on the catalog's example) without uniforms=: found by sampling.
    report = specverify.audit(f"{WITHOUT_UNIFORMS}:residual_is_target", budget="standard", checks=["step-K1"],
                              isolation="none")
    (check,) = report.checks
    assert check.verdict is Verdict.FAIL and (check.look, check.num_looks) == (1, 3)
    assert check.n * 16 <= check.n_required + 16 and check.pvalue <= check.level < check.alpha
    assert "of look 1/3" in check.message


def test_a_correct_rule_runs_every_look_to_the_planned_size():
    report = specverify.audit("reference", budget="quick", checks=["step-K1", "acceptance-rate"], isolation="none")
    for check in report.checks:
        assert check.verdict is Verdict.PASS and check.look == check.num_looks == 3
        assert check.n == check.n_required
    assert report.exit_code == 0


def test_fail_fast_is_the_default_for_quick_and_standard():
    """Fail-fast stops at the first failure, but the locating checks still run, so the
    first report already says where the loss is."""
    report = specverify.audit("catalog:residual_is_target", budget="quick", isolation="none")
    skipped = [c for c in report.checks if c.verdict is Verdict.SKIPPED]
    first = report.checks.index(report.failed[0])
    assert report.settings.fail_fast and report.exit_code == 1 and report.failed[0].name == "exact-step"
    assert skipped and all(c.message.startswith(FAIL_FAST_SKIP) for c in skipped)
    ran_after = [c.name for c in report.checks[first + 1:] if c.verdict is not Verdict.SKIPPED]
    assert ran_after == ["bonus-position", "correction-position", "disjoint-supports"]  # their loci are locating
    assert "the correction token drawn after a rejection is wrong" in report.diagnosis.lower()
    assert "--no-fail-fast" in report.diagnosis and "--no-fail-fast" not in report.replay_command
    assert "--checks exact-step,correction-position" in report.replay_command  # only what failed


def test_no_fail_fast_runs_every_check_and_the_replay_says_so():
    report = specverify.audit("catalog:residual_is_target", budget="quick", isolation="none", fail_fast=False,
                              checks=["exact-step", "step-K1", "bonus-position", "correction-position"])
    assert not report.settings.fail_fast and not any(c.verdict is Verdict.SKIPPED for c in report.checks)
    assert "the correction token drawn after a rejection is wrong" in report.diagnosis.lower()
    assert report.replay_command.endswith("--no-fail-fast")


@pytest.mark.parametrize(("budget", "expected"),
                         [("quick", True), ("standard", True), ("thorough", False), (300, False)])
def test_default_fail_fast_per_budget(budget, expected):
    report = specverify.audit("reference", budget=budget, checks=["inputs-unchanged"], isolation="none")
    assert report.settings.fail_fast is expected


def test_a_run_in_parts_is_the_run_in_one():
    battery = SamplerBattery()
    session = battery.open_session("reference", device="cpu", timeout_s=60, isolation="none")
    checks = [c for c in battery.checks(session) if c.name in ("step-K2", "production-K12")]
    plans = plan_checks(checks, battery.resolve_budget("quick"), 1e-3, 0, "sampler")[0]
    for check, plan in zip(checks, plans):
        assert isinstance(check, SequentialCheck) and check.runs_in_parts and len(plan.looks) == 3
        whole = check.run(session, plan)
        first = check.run_looks(session, plan, LooksReached(), 1)
        rest = check.run_looks(session, plan, first, len(plan.looks))
        assert first.looks == 1 and rest.looks == 3 and rest.result is not None
        assert (rest.result.n, rest.result.statistic, rest.result.pvalue) == (whole.n, whole.statistic, whole.pvalue)


def test_a_check_judged_while_drawing_gives_the_results_of_the_run_in_turn(monkeypatch):
    """production-K12 judges each look but the last in the work-ahead thread while its next look
    draws: the same looks, verdict, statistic and p-value as judged in turn."""
    battery = SamplerBattery()
    session = battery.open_session("reference", device="cpu", timeout_s=60, isolation="none")
    checks = battery.checks(session)
    plans = dict(zip((c.name for c in checks), plan_checks(checks, battery.resolve_budget("quick"), 1e-3, 0,
                                                           "sampler")[0]))
    check = next(c for c in checks if c.name == "production-K12")
    threads = []
    original = type(check).judge

    def judge(self, *args):
        threads.append(threading.current_thread().name)
        return original(self, *args)

    monkeypatch.setattr(type(check), "judge", judge)
    ahead = check.run(session, plans[check.name])
    assert threads.count("specverify-ahead") == 2 and len(threads) == 3
    monkeypatch.setattr(type(check), "judged_while_drawing", lambda self: False)
    in_turn = check.run(session, plans[check.name])
    assert (ahead.verdict, ahead.look, ahead.n, ahead.statistic, ahead.pvalue) == \
        (in_turn.verdict, in_turn.look, in_turn.n, in_turn.statistic, in_turn.pvalue)


@dataclass
class LooksOfRecord(SequentialCheck):
    """Fails at look ``failing`` (1-based), raises in the draw of look ``raising`` (0-based)."""

    failing: int
    raising: int
    name: str = "looks-of-record"
    description: str = "a check of recorded looks"
    parameters: dict = field(default_factory=dict)
    kind = CheckKind.GOODNESS_OF_FIT

    def judged_while_drawing(self):
        return True

    def draw(self, session, plan, n, look):
        if look == self.raising:
            raise Fault("exception", f"the draw of look {look} raised")
        return Tally(n, {"n": np.array(n)})

    def judge(self, plan, tally, level, look):
        verdict = Verdict.FAIL if look == self.failing else Verdict.PASS
        return self.report(plan, verdict, f"look {look}", n=tally.n, look=look)


@pytest.mark.parametrize(("failing", "raising", "outcome"), [(2, 2, "fail at 2"), (9, 2, "raises"),
                                                              (3, 9, "fail at 3"), (9, 9, "pass at 5")])
def test_a_look_that_fails_ends_the_run_whatever_the_next_draw_made_meanwhile_did(failing, raising, outcome):
    check = LooksOfRecord(failing=failing, raising=raising)
    plan = Plan(1600, 1600, 1e-3, 0.1, 0, (100, 200, 400, 800, 1600), (1e-5, 1e-5, 1e-4, 2e-4, 6e-4))
    session = AuditSession()
    if outcome == "raises":
        with pytest.raises(Fault, match="look 2 raised"):
            check.run(session, plan)
        return
    result = check.run(session, plan)
    assert f"{result.verdict} at {result.look}" == outcome


def test_the_first_looks_find_a_loss_that_only_a_late_check_sees():
    """High vocabulary ids dropped, found by sampling: only production-qwen-K1 (V = 151,936) sees
    it; its first look ends the audit before the earlier checks run in full."""
    report = specverify.audit(f"{WITHOUT_UNIFORMS}:vocabulary_tile_drops_high_ids", budget="standard",
                              isolation="none")
    failed = report.failed[0]
    assert report.exit_code == 1 and failed.name == "production-qwen-K1" and failed.look == 1
    earlier = next(c for c in report.checks if c.name == "step-K2")
    assert earlier.verdict is Verdict.SKIPPED and earlier.message.startswith(FAIL_FAST_SKIP)
    assert "its first look passed" in earlier.message


def test_a_check_whose_run_does_more_than_its_looks_does_not_run_in_parts():
    """A check with work of its own around its looks (a warm-up, counts started afresh) runs whole."""
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    assert context_law.ContextLawCheck in set(subclasses(SequentialCheck))
    assert load.LoadThresholdCheck in set(subclasses(SequentialCheck))
    for cls in subclasses(SequentialCheck):
        assert cls.run is SequentialCheck.run or not cls.runs_in_parts, cls.__name__


def test_fail_fast_must_be_a_bool():
    with pytest.raises(ValueError, match="fail_fast"):
        specverify.audit("reference", budget="quick", fail_fast="yes")


CALIBRATION_LEVEL = 0.05
CALIBRATION_N = 1600
CALIBRATED_CHECKS = ("step-K1", "step-K8-tail", "bonus-position", "tiny-masses", "decoding-loop-order1",
                     "acceptance-rate")


def sequential_false_positives(runs_per_check: int, base_seed: int) -> dict[str, tuple[int, int, list[int]]]:
    """``check -> (rejections, runs, rejections per look)``: each check of :data:`CALIBRATED_CHECKS`
    run ``runs_per_check`` times on the reference rule with n = CALIBRATION_N at level
    CALIBRATION_LEVEL spread over its looks, each run with its own seed."""
    battery = SamplerBattery(batch_rows=400)
    session = battery.open_session(rules.verify, device="cpu", timeout_s=60.0, isolation="none")
    checks = {c.name: c for c in battery.checks(session)}
    counts = {}
    for name in CALIBRATED_CHECKS:
        check = checks[name]
        looks, alphas = check.looks(CALIBRATION_N, CALIBRATION_LEVEL)
        by_look = [0] * len(looks)
        for run in range(runs_per_check):
            seed = derive_seed("sequential-calibration", name, run, base=base_seed)
            result = check.run(session,
                               Plan(CALIBRATION_N, CALIBRATION_N, CALIBRATION_LEVEL, None, seed, looks, alphas))
            if result.verdict is Verdict.FAIL:
                by_look[result.look - 1] += 1
        counts[name] = (sum(by_look), runs_per_check, by_look)
    return counts


def assert_at_most_level(counts: dict[str, tuple[int, int, list[int]]], test_level: float) -> None:
    rejections = sum(r for r, _, _ in counts.values())
    runs = sum(m for _, m, _ in counts.values())
    looks = len(next(iter(counts.values()))[2])
    rows = [("all (pooled)", rejections, runs, [sum(c[2][j] for c in counts.values()) for j in range(looks)])]
    rows += [(name, r, m, looks) for name, (r, m, looks) in counts.items()]
    print(f"\nfalse-positive rate of the sequential checks at level {CALIBRATION_LEVEL} over "
          f"{looks} looks (n = {CALIBRATION_N}):")
    failures = []
    for name, r, m, looks in rows:
        test = stats.binomial_test(r, m, CALIBRATION_LEVEL, "greater")
        interval = stats.binomial_test(r, m, CALIBRATION_LEVEL, "two-sided", confidence_level=0.95)
        print(f"  {name:<22} {r:>4}/{m:<5} = {r / m:.4f} (95% CI [{interval.ci_low:.4f}, {interval.ci_high:.4f}]); "
              f"rejections per look {looks}")
        if test.pvalue <= test_level / len(rows):
            failures.append(f"{name}: {r}/{m}")
    assert not failures, f"false-positive rate above {CALIBRATION_LEVEL}: {failures}"


@pytest.mark.statistical
def test_sequential_checks_keep_their_level(specverify_base_seed, specverify_suite_alpha):
    """6 checks × 25 seeds = 150 runs."""
    assert_at_most_level(sequential_false_positives(25, derive_seed("fast", base=specverify_base_seed)),
                         specverify_suite_alpha)


@pytest.mark.slow
@pytest.mark.statistical
def test_sequential_checks_keep_their_level_thoroughly(specverify_base_seed, specverify_suite_alpha):
    """6 checks × 500 seeds = 3000 runs."""
    assert_at_most_level(sequential_false_positives(500, derive_seed("slow", base=specverify_base_seed)),
                         specverify_suite_alpha)
