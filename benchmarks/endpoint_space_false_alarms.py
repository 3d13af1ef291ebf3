"""False alarms of the request-space checks on the correct endpoint toy, over seeds.

Run: ``PYTHONPATH=$PWD python3 benchmarks/endpoint_space_false_alarms.py [--seeds 20] [--budget quick]``.

Seed s: a batching speculative toy server and a plain baseline over toy LM s, and
``audit(..., checks=SPACE_CHECKS, budget=B, seed=s, fail_fast=False)``.  Every check's verdict
other than "pass" is a false alarm (the server is correct).  Each audit runs at α = 1e-3
family-wise, so N correct audits raise an alarm with probability ≤ N · 1e-3.  One line per seed
(wall time, non-passing checks), then the count.
"""

from __future__ import annotations

import argparse
import sys
import time

from specverify.auditing.runner import audit  # noqa: E402
from specverify.testing.toy_server import ToyConfig, ToyServer

SPACE_CHECKS = ("space-sampling-fields", "space-prompt-lengths", "space-prefixes", "space-load", "choices-joint",
                "space-penalties", "stop-handling")


def alarms_of_seed(seed: int, budget: str) -> list[str]:
    """The checks that did not pass on the correct toy of ``seed`` (audit seed ``seed``)."""
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
    return [f"{c.name} {c.verdict} (p {c.pvalue})" for c in report.checks if c.verdict != "pass"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--budget", default="quick")
    args = parser.parse_args()
    alarms = 0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        started = time.monotonic()
        found = alarms_of_seed(seed, args.budget)
        alarms += bool(found)
        print(f"seed {seed}: {time.monotonic() - started:.0f} s, {'; '.join(found) or 'every check passed'}",
              flush=True)
    print(f"false alarms at {args.budget}: {alarms} of {args.seeds} audits (seeds {args.first_seed}–"
          f"{args.first_seed + args.seeds - 1}, checks {', '.join(SPACE_CHECKS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
