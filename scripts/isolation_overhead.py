"""Print the per-call cost of process isolation: the same calls of the reference rule through
:class:`specverify.auditing.isolation.guarded.GuardedFunction` with ``isolation="process"`` and ``"none"``.

    PYTHONPATH=. python3 scripts/isolation_overhead.py [--calls 200]

Rows: (B, K, V) = (4096, 2, 4) — the default batch of the step checks —, (1, 2, 4) — the B = 1
check's calls, sent 1000 per request —, and (170, 1, 32768) — a large-vocabulary call.  The
overhead per call is the difference of the mean wall times per call (process − none).
"""

from __future__ import annotations

import argparse
import time

import torch

from specverify.auditing.isolation.guarded import GuardedFunction
from specverify.auditing.sampler.battery import positional_family_bank
from specverify.testing.harness import Tables, propose


def per_call_seconds(function: GuardedFunction, batch: int, num_draft: int, vocab: int, calls: int,
                     group: int | None) -> float:
    tables = Tables(positional_family_bank("overhead", "random", vocab, num_draft, 1))
    proposal = propose(tables, tables.initial_state(torch.zeros(batch * (group or 1), dtype=torch.int64)), num_draft,
                       torch.Generator().manual_seed(0))
    generator = function.generator(1)
    function(type(proposal)(*(t[:batch] for t in proposal)), generator, where="warm-up")
    started = time.perf_counter()
    if group:
        for _ in range(max(1, calls // group)):
            function.call_groups(proposal, generator, [batch] * group, where="bench")
        return (time.perf_counter() - started) / (max(1, calls // group) * group)
    for _ in range(calls):
        function(proposal, generator, where="bench")
    return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    from specverify.core.rules import verify

    cases = [(4096, 2, 4, args.calls, None), (1, 2, 4, 20 * args.calls, 1000),
             (170, 1, 32768, max(5, args.calls // 20), None)]
    print(f"{'B':>5} {'K':>2} {'V':>6}  {'none ms/call':>12}  {'process ms/call':>15}  {'overhead ms/call':>16}")
    for batch, num_draft, vocab, calls, group in cases:
        times = {}
        for isolation in ("none", "process"):
            function = GuardedFunction(verify, timeout_s=60, isolation=isolation)
            try:
                times[isolation] = per_call_seconds(function, batch, num_draft, vocab, calls, group)
            finally:
                function.close()
        print(f"{batch:>5} {num_draft:>2} {vocab:>6}  {1e3 * times['none']:>12.3f}  {1e3 * times['process']:>15.3f}  "
              f"{1e3 * (times['process'] - times['none']):>16.3f}")
    started = time.perf_counter()
    function = GuardedFunction(verify, timeout_s=60, isolation="process")
    function.close()
    print(f"worker start (spawn, import torch, load the target, stop): {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
