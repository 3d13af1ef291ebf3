"""False alarms of the request-space checks on the correct endpoint toy, over seeds.

Run: ``PYTHONPATH=$PWD python3 benchmarks/endpoint_space_false_alarms.py [--seeds 20] [--first-seed 0]
[--budget quick] [--out seeds.jsonl]``.

Seed s: a batching speculative toy server and a plain baseline over toy LM s, and
``audit(..., checks=SPACE_CHECKS, budget=B, seed=s, fail_fast=False)``.  Every check's verdict
other than "pass" is a false alarm (the server is correct).  Each audit runs at α = 1e-3
family-wise, so N correct audits raise an alarm with probability ≤ N · 1e-3.  One line per seed
(wall time, non-passing checks), then the count.  With ``--out`` each seed's record is appended
to that file as a JSON line the moment its audit ends (a partial run keeps the seeds it
finished): the audit's verdict, every check's verdict, p-value and the level of the look that
decided it, the smallest ratio p / level over the statistical checks (below 1: the check
rejected), the completion requests both servers answered, the process's CPU seconds (user +
sys; the servers run as threads of this process) and the 1-minute load average at the start
and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specverify.auditing.runner import AuditReport, audit
from specverify.testing.toy_server import ToyConfig, ToyServer

SPACE_CHECKS = ("space-sampling-fields", "space-prompt-lengths", "space-prefixes", "space-load", "choices-joint",
                "space-penalties", "stop-handling")


@dataclass(frozen=True)
class SeedAudit:
    """One seed's audit of the correct toy, as measured."""

    seed: int
    verdict: str
    checks: list[dict[str, object]]
    smallest_p_over_level: float | None
    candidate_requests: int
    baseline_requests: int
    wall_s: float
    cpu_s: float
    load_start: float
    load_end: float

    @property
    def alarms(self) -> list[str]:
        """The checks that did not pass, each with its p-value."""
        return [f"{c['name']} {c['verdict']} (p {c['pvalue']})" for c in self.checks if c["verdict"] != "pass"]


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def _smallest_p_over_level(report: AuditReport) -> float | None:
    ratios = [c.pvalue / c.level for c in report.checks if c.pvalue is not None and c.level]
    return min(ratios, default=None)


def audit_seed(seed: int, budget: str) -> SeedAudit:
    """The audit of the correct toy of ``seed`` (toy LM and audit seed ``seed``)."""
    load_start, cpu_start, started = os.getloadavg()[0], _cpu_s(), time.monotonic()
    candidate = ToyServer(ToyConfig(speculative=True, batching=True, lm_seed=seed)).start()
    baseline = ToyServer(ToyConfig(speculative=False, lm_seed=seed)).start()
    try:
        report = audit(candidate.url, level="endpoint", budget=budget, baseline=baseline.url, checks=SPACE_CHECKS,
                       seed=seed, fail_fast=False)
    finally:
        candidate.stop()
        baseline.stop()
    if report.interrupted:
        raise KeyboardInterrupt(f"the audit of seed {seed} was interrupted: its verdicts are not a measurement")
    checks = [{"name": c.name, "verdict": str(c.verdict), "pvalue": c.pvalue, "level": c.level, "look": c.look,
               "num_looks": c.num_looks, "n": c.n} for c in report.checks]
    return SeedAudit(seed, str(report.verdict), checks, _smallest_p_over_level(report), candidate.state.requests,
                     baseline.state.requests, time.monotonic() - started, _cpu_s() - cpu_start, load_start,
                     os.getloadavg()[0])


def alarms_of_seed(seed: int, budget: str) -> list[str]:
    """The checks that did not pass on the correct toy of ``seed`` (audit seed ``seed``)."""
    return audit_seed(seed, budget).alarms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds to audit")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (resume a run after its last seed)")
    parser.add_argument("--budget", default="quick")
    parser.add_argument("--out", type=Path, help="a JSON-lines file each seed's record is appended to as it ends")
    args = parser.parse_args()
    alarms = 0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        result = audit_seed(seed, args.budget)
        alarms += bool(result.alarms)
        if args.out is not None:
            with args.out.open("a") as out:
                out.write(json.dumps(asdict(result)) + "\n")
        ratio = "none" if result.smallest_p_over_level is None else f"{result.smallest_p_over_level:.3g}"
        print(f"seed {seed}: {result.verdict}, smallest p/level {ratio}, "
              f"{result.candidate_requests} + {result.baseline_requests} requests, {result.wall_s:.0f} s wall, "
              f"{result.cpu_s:.0f} CPU-s, load {result.load_start:.1f}–{result.load_end:.1f}, "
              f"{'; '.join(result.alarms) or 'every check passed'}", flush=True)
    print(f"false alarms at {args.budget}: {alarms} of {args.seeds} audits (seeds {args.first_seed}–"
          f"{args.first_seed + args.seeds - 1}, checks {', '.join(SPACE_CHECKS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
