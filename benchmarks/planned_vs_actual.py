"""Planned against actual time of sampler audits of functions of different speeds.

    PYTHONPATH=. python benchmarks/planned_vs_actual.py [--budget quick] [--out FILE]

Each audit runs in its own process (``specverify audit``, a log display), on the checks of
:data:`CHECKS` (small and large vocabularies, so that a function whose speed depends on V is
re-timed from its own measurements).  From the log it reads the plan's expected time (the header,
at the reference's speed), the first and the last re-timed projections (``measured … ~T in all``:
the time so far plus the rest at the speeds measured, with their range; a line is said again when
the projection moves by 2×) and the audit's actual time (``audit finished in``), side by side.
Durations in the log are rounded as the display rounds them.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHECKS = ("step-K1,step-K4,batch-size-1,truncated-vocabulary,production-K12,production-gpt2-K4,"
          "production-qwen-K1")

FUNCTIONS = (
    ("reference (fused C kernel)", "reference", {}),
    ("reference on torch (no C kernel)", "reference", {"SPECVERIFY_NATIVE": "0"}),
    ("vLLM-style adapter (torch, per-call draws)", str(ROOT / "examples" / "vllm_style_adapter.py") + ":verify", {}),
    ("slow per call (sleep ≤ 4 ms a call)", str(ROOT / "tests" / "auditing" / "slow_wrapper.py") + ":verify", {}),
    ("10× slower above V = 30,000", str(ROOT / "benchmarks" / "speed_functions.py") + ":slow_at_large_vocabulary", {}),
)


def seconds_of(text: str) -> float:
    """``42 s`` / ``3.5 min`` / ``1.2 h`` in seconds."""
    value, unit = text.split()
    return float(value) * {"s": 1.0, "min": 60.0, "h": 3600.0}[unit]


DURATION = r"[\d.]+ (?:s|min|h)"


def run(label: str, target: str, env: dict[str, str], budget: str) -> dict[str, object]:
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "specverify", "audit", target, "--budget", budget, "--checks", CHECKS,
         "--allow-underpowered"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=3600)
    wall = time.perf_counter() - started
    log = completed.stderr
    planned = re.search(rf"expected ~({DURATION})", log)
    retimed = re.findall(r"measured .*? in all", log)
    finished = re.search(rf"audit finished in ({DURATION})", log)
    return {"function": label, "exit": completed.returncode,
            "planned_s": seconds_of(planned.group(1)) if planned else None,
            "first": retimed[0] if retimed else None, "last": retimed[-1] if len(retimed) > 1 else None,
            "actual_s": seconds_of(finished.group(1)) if finished else None, "process_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="quick")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [f"budget {args.budget}, checks {CHECKS}; load average {os.getloadavg()[0]:.1f}",
             "| function | planned | first re-timed line | last re-timed line | actual (report) | process |",
             "|---|---|---|---|---|---|"]
    for label, target, env in FUNCTIONS:
        row = run(label, target, env, args.budget)
        lines.append(f"| {row['function']} | {row['planned_s']} s | {row['first']} | {row['last'] or '—'} "
                     f"| {row['actual_s']} s | {row['process_s']:.1f} s (exit {row['exit']}) |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
