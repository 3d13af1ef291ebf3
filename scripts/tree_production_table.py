"""Print the tree audit's checks as a table: V, nodes N, depth, most children, node orders, schemes,
call sizes B, samples, seconds and the TV each detects, from one audit run.

    PYTHONPATH=. python3 scripts/tree_production_table.py [--target reference] [--budget standard]

The audit runs as ``specverify audit --level tree`` does (worker process, fail-fast off); the wall
time of the whole audit and the CPU seconds of this process and its worker are printed last.
"""

from __future__ import annotations

import argparse
import resource
import time

from specverify.auditing.runner import audit
from specverify.core import tree_exact


def describe(check) -> dict[str, str]:
    p = check.parameters
    shapes = p.get("shapes")
    if shapes:
        nodes = "/".join(str(len(s)) for s in shapes)
        depth = str(max(tree_exact.tree_depth(s) for s in shapes))
        children = str(max(tree_exact.max_children(s) for s in shapes))
    elif "shape" in p:
        nodes, depth, children = (str(len(p["shape"])), str(tree_exact.tree_depth(p["shape"])),
                                  str(tree_exact.max_children(p["shape"])))
    else:
        nodes, depth, children = "/".join(str(n) for n in p.get("N", [])), str(p.get("depth",
                                                                                     "")), str(p.get("children", ""))
    orders = ",".join(o.replace("_first", "").replace("interleaved", "inter") for o in p.get("orders", ["breadth"]))
    scheme = p.get("scheme", "")
    scheme = "mixed" if isinstance(scheme, list) else str(scheme).replace("without_replacement", "w/o-repl")
    calls = p.get("B")
    b = "4096" if calls is None else f"{min(calls)}-{max(calls)}"
    if p.get("inputs"):
        b += " (+strided)"
    return {"V": f"{p.get('V', '')}", "N": nodes, "depth": depth, "children": children, "orders": orders,
            "scheme": scheme, "B": b, "test": p.get("test", "joint" if "L" in p else "binomial")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="reference")
    parser.add_argument("--budget", default="standard")
    args = parser.parse_args()
    started = time.perf_counter()
    report = audit(args.target, level="tree", budget=args.budget, fail_fast=False)
    wall = time.perf_counter() - started
    header = ("check", "V", "N", "depth", "children", "orders", "scheme", "B", "test", "n", "seconds", "TV detect.")
    print(" | ".join(header))
    for check in report.checks:
        if check.alpha is None:
            continue
        d = describe(check)
        print(" | ".join([check.name, d["V"], d["N"], d["depth"], d["children"], d["orders"], d["scheme"], d["B"],
                          d["test"], f"{check.n:,}", f"{check.seconds:.1f}", f"{check.detectable_tv:.4f}"]))
    exact = next((c for c in report.checks if c.name == "exact-tree-step"), None)
    if exact is not None:
        print(f"exact-tree-step: {len(exact.parameters['cases'])} cases, {exact.seconds:.1f} s, {exact.verdict}")
    own, worker = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"verdict {report.verdict} (exit {report.exit_code}); audit wall {wall:.1f} s; CPU: this process "
          f"{own.ru_utime + own.ru_stime:.1f} s, worker {worker.ru_utime + worker.ru_stime:.1f} s")


if __name__ == "__main__":
    main()
