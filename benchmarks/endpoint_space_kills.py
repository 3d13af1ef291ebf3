"""The kill table of the request space: every planted toy-server bug against the check built for it.

Run: ``PYTHONPATH=$PWD python3 benchmarks/endpoint_space_kills.py [--budget quick] [--seed 0]``.

For each bug of ``REQUEST_SPACE_BUGS`` (specverify/testing/toy_server.py) a batching
speculative toy server with the bug and a plain baseline are started on 127.0.0.1, and
``audit(candidate, checks=[check], budget=B, baseline=..., concurrency=4)`` runs the one check
built for it (sequential looks, fail-fast).  One markdown row per bug: the check, its verdict, the
p-value at the look that decided (Bonferroni-adjusted as the check reports it), that look, the
candidate requests the check sent up to its verdict, and the wall time of the audit.  The
servers are stopped whatever happens.
"""

from __future__ import annotations

import argparse
import sys
import time

from specverify.auditing.runner import audit  # noqa: E402
from specverify.testing.toy_server import REQUEST_SPACE_BUGS, ToyConfig, ToyServer


def kill_row(label: str, check: str, bug: dict, budget: str, seed: int) -> str:
    candidate = ToyServer(ToyConfig(speculative=True, batching=True, lm_seed=seed, **bug)).start()
    baseline = ToyServer(ToyConfig(speculative=False, lm_seed=seed)).start()
    started = time.monotonic()
    try:
        report = audit(candidate.url, level="endpoint", budget=budget, baseline=baseline.url, checks=[check],
                       concurrency=4, seed=seed)
    finally:
        candidate.stop()
        baseline.stop()
    wall = time.monotonic() - started
    result = report.checks[0]
    pvalue = "—" if result.pvalue is None else f"{result.pvalue:.3g}"
    look = f"{result.look}/{result.num_looks}" if result.look is not None else "—"
    return f"| {label} | `{check}` | {result.verdict} | {pvalue} | {look} | {result.calls} | {wall:.1f} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="quick")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"budget {args.budget}, seed {args.seed}, concurrency 4")
    print("| planted bug | check | verdict | p-value | look | requests to verdict | wall s |")
    print("|---|---|---|---|---|---|---|")
    for label, check, bug in REQUEST_SPACE_BUGS:
        print(kill_row(label, check, bug, args.budget, args.seed), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
