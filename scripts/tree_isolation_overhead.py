"""Print the per-call cost of process isolation at the tree level: the same calls of the reference
``verify_tree`` through :class:`specverify.auditing.isolation.guarded.GuardedTreeFunction` with
``isolation="process"`` and ``"none"`` (alternating, twice each).

    PYTHONPATH=. python3 scripts/tree_isolation_overhead.py [--calls 20]

One 4096-row proposal (the default tree batch) of the ``tree-branches`` shapes (N = 5, V = 3),
drafted independently; the overhead per call is the difference of the mean wall times per call
(process − none); ``open`` is the worker's start (spawned interpreter importing torch and the target).
"""

from __future__ import annotations

import argparse
import time

import torch

from specverify.auditing.isolation.guarded import GuardedTreeFunction
from specverify.auditing.tree.battery import BRANCH_SHAPES, tree_bank
from specverify.testing.tree_harness import DEFAULT_TREE_ROWS, draft_trees, padded_parents, present_nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    calls = parser.parse_args().calls
    bank = tree_bank("overhead", 3, 1)
    index = torch.arange(DEFAULT_TREE_ROWS)
    chain = index % bank.num_chains
    shape_of_row = (index // bank.num_chains) % len(BRANCH_SHAPES)
    drafted = draft_trees(bank, chain, bank.prompt_states(chain), padded_parents(BRANCH_SHAPES, shape_of_row),
                          present_nodes(BRANCH_SHAPES, shape_of_row), "independent", torch.Generator().manual_seed(0))
    for isolation in ("process", "none", "process", "none"):
        started = time.perf_counter()
        function = GuardedTreeFunction("reference", timeout_s=60, isolation=isolation)
        opened = time.perf_counter() - started
        generator = function.generator(1)
        function(drafted.proposal, generator, where="warm-up")
        started = time.perf_counter()
        for _ in range(calls):
            function(drafted.proposal, generator, where="timed")
        wall = (time.perf_counter() - started) / calls
        inside = function.log.function_seconds / function.log.calls
        function.close()
        print(f"{isolation:>7}: open {opened:.2f} s; per call {wall * 1e3:.1f} ms wall, "
              f"{inside * 1e3:.1f} ms in the function")


if __name__ == "__main__":
    main()
