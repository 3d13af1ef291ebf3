"""3. The audit harness: verification trials per second and the wall time of each budget.

``specverify.auditing.runner.audit`` drives the built-in ``reference`` sampler (``specverify.core.rules``'
vectorised modified rejection sampling) through every check of the sampler battery.  The audit
log counts the rows (trials: one request's verification step) it pushed through the function and
the time spent inside it, so ``extra_info`` records

- ``trials_per_s``: rows / total wall time (harness + function),
- ``trials_per_function_s``: rows / time inside the function (the sampler's own throughput),

for a fixed budget of N samples per check and for the named budgets (``quick`` and ``standard``:
every statistical check sized to detect TV 0.05 / 0.02 with power 0.99).  ``thorough`` (TV 0.01,
about 4x ``standard``) is left out of the default benchmark run for time.
"""

from __future__ import annotations

import pytest

from specverify.auditing.runner import audit

TARGET = "reference"
BUDGETS = ("quick", "standard")
FIXED_SAMPLES = 20_000


def run_audit(benchmark, budget: str | int) -> None:
    reports = []
    # A throughput benchmark, not a gate: a small fixed budget (the smoke test's) may be underpowered.
    benchmark.pedantic(lambda: reports.append(audit(TARGET, budget=budget, allow_underpowered=True)), rounds=1,
                       iterations=1)
    report = reports[-1]
    timings = report.timings
    benchmark.extra_info.update(
        suite="audit", target=TARGET, budget=str(budget), verdict=report.verdict, checks=len(report.checks),
        rows=timings.get("rows"), calls=timings.get("calls"), total_s=timings["total_s"],
        function_s=timings.get("function_s"),
        trials_per_s=timings["rows"] / timings["total_s"],
        trials_per_function_s=timings["rows"] / timings["function_s"],
        slowest_checks=sorted(timings["checks_s"].items(), key=lambda item: -item[1])[:3],
    )


def test_audit_fixed_samples(benchmark, samples: int = FIXED_SAMPLES) -> None:
    benchmark.group = "audit"
    run_audit(benchmark, samples)


@pytest.mark.parametrize("budget", BUDGETS)
def test_audit_budget(benchmark, budget: str) -> None:
    benchmark.group = "audit"
    run_audit(benchmark, budget)
