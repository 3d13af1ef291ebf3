"""Time to verdict of every catalog entry: wall seconds from ``specverify audit`` to its exit.

    python benchmarks/time_to_verdict.py --budget standard --out benchmarks/results/issue12/ttv-after.json
    python benchmarks/time_to_verdict.py --level decoder --budget quick --out ...decoder-quick.json
    python benchmarks/time_to_verdict.py --budget standard --without-uniforms --out ...ttv-after-sampled.json
    python benchmarks/time_to_verdict.py --report benchmarks/results/issue12/ttv-*.json

Each entry is audited in a fresh process, as a user runs it (``python -m specverify audit
catalog:NAME --budget B --quiet --json F``; with ``--without-uniforms`` the target is
``benchmarks/without_uniforms.py:NAME``, so no exact check runs and the loss must be found by
sampling).  ``--specverify PATH`` runs another checkout of the package (``PYTHONPATH=PATH``),
which is how the "before" figures are taken from an older commit in a git worktree.  The JSON
holds, per entry: wall seconds, exit status, the first failing check, its look and n, the calls
of the function in the whole audit, and the machine's load average at the start (the figures are
only comparable at similar load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def catalog_names(level: str) -> list[str]:
    """The names of the known-bug catalog of ``level``."""
    sys.path.insert(0, str(ROOT))
    if level == "decoder":
        from specverify.auditing.decoder.catalog import DECODER_CATALOG

        return sorted(DECODER_CATALOG)
    if level == "tree":
        from specverify.auditing.tree.catalog import TREE_CATALOG

        return sorted(TREE_CATALOG)
    from specverify.auditing.sampler.catalog import CATALOG

    return sorted(CATALOG)


def time_entry(name: str, *, level: str, budget: str, without_uniforms: bool, package_root: Path,
               extra: list[str]) -> dict:
    """Audit one entry in a fresh process and return its timing and outcome."""
    target = f"{ROOT / 'benchmarks' / 'without_uniforms.py'}:{name}" if without_uniforms else f"catalog:{name}"
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "specverify", "audit", target, "--level", level, "--budget", budget, "--quiet",
                   "--json", str(report_path), *extra]
        environment = dict(os.environ, PYTHONPATH=str(package_root))
        load = os.getloadavg()[0]
        started = time.perf_counter()
        completed = subprocess.run(command, env=environment, capture_output=True, text=True, cwd=scratch)
        seconds = time.perf_counter() - started
        document = json.loads(report_path.read_text()) if report_path.exists() else {}
    failing = [c for c in document.get("checks", []) if c.get("verdict") == "fail"]
    first = failing[0] if failing else {}
    return {"entry": name, "seconds": round(seconds, 2), "exit": completed.returncode, "load": round(load, 2),
            "first_failing": first.get("name"), "look": first.get("look"), "num_looks": first.get("num_looks"),
            "n": first.get("n"), "calls": document.get("timings", {}).get("calls"), "checks_failed": len(failing),
            "checks_run": sum(c.get("verdict") != "skipped" for c in document.get("checks", [])),
            "stderr_tail": completed.stderr[-300:] if completed.returncode not in (0, 1) else ""}


def summary(rows: list[dict]) -> str:
    times = [r["seconds"] for r in rows]
    caught = sum(r["exit"] == 1 for r in rows)
    return (f"{len(rows)} entries, {caught} caught (exit 1); time to verdict median {statistics.median(times):.1f} s, "
            f"max {max(times):.1f} s; load {min(r['load'] for r in rows):.1f}–{max(r['load'] for r in rows):.1f}")


def report(paths: list[Path]) -> str:
    """A markdown table: one row per entry, one column per run file."""
    runs = {path.stem: {r["entry"]: r for r in json.loads(path.read_text())["rows"]} for path in paths}
    names = sorted(set().union(*(set(r) for r in runs.values())))
    header = "| entry | " + " | ".join(f"{run} s (check, look)" for run in runs) + " |"
    lines = [header, "|---|" + "---:|" * len(runs)]
    for name in names:
        cells = []
        for rows in runs.values():
            row = rows.get(name)
            if row is None:
                cells.append("—")
                continue
            where = (f"{row['first_failing']}, {row['look']}/{row['num_looks']}" if row["look"]
                     else (row["first_failing"] or f"exit {row['exit']}"))
            cells.append(f"{row['seconds']:.1f} ({where})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for run, rows in runs.items():
        lines.append(f"\n{run}: {summary(list(rows.values()))}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--level", choices=("sampler", "tree", "decoder"), default="sampler")
    parser.add_argument("--budget", default="standard")
    parser.add_argument("--without-uniforms", action="store_true")
    parser.add_argument("--specverify", type=Path, default=ROOT, help="root of the checkout to run")
    parser.add_argument("--entries", help="comma-separated catalog names (default: all)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path, nargs="+", help="print the table of these run files and exit")
    parser.add_argument("extra", nargs="*", help="more audit options after --, e.g. -- --no-fail-fast")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    names = args.entries.split(",") if args.entries else catalog_names(args.level)
    rows = []
    for name in names:
        row = time_entry(name, level=args.level, budget=args.budget, without_uniforms=args.without_uniforms,
                         package_root=args.specverify.resolve(), extra=args.extra)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(summary(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"level": args.level, "budget": args.budget,
                                        "without_uniforms": args.without_uniforms,
                                        "specverify": str(args.specverify), "extra": args.extra, "rows": rows},
                                       indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
