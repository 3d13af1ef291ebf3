"""Time the endpoint audit against a llama.cpp pair on this machine.

Starts the pair of :func:`specverify.testing.llama_servers.llama_pair` (SmolLM2-135M-Instruct on
two ``llama_cpp.server`` processes: a baseline, and a candidate with prompt-lookup drafting), runs
``python -m specverify audit --level endpoint CANDIDATE --baseline BASELINE --budget B`` and writes
its log (with the load average before and after, and the wall time) and its JSON report under OUT.
The servers are stopped whatever happens.

    python benchmarks/endpoint_llamacpp.py --budget standard --out benchmarks/results/issue11

``--request-space-only`` runs the request-space checks and the coverage table alone, at a fixed
budget of N samples per check (``--budget 120``): a coverage run, each check stating the TV it
detects (``--allow-underpowered``, ``--no-fail-fast``); its files are named ``space-<budget>``.

``--checks NAMES`` runs only the named core checks (the audit's ``--checks``, with
``--no-request-space``); its files are named ``checks-<budget>``:

    python benchmarks/endpoint_llamacpp.py --budget quick --checks greedy-identity,batch-invariance --out DIR
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from specverify.testing.llama_servers import llama_pair


def load_line() -> str:
    return f"{time.strftime('%H:%M:%S')} load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="standard")
    parser.add_argument("--out", type=Path, required=True, help="folder for <budget>_terminal.txt and <budget>.json")
    parser.add_argument("--deadline", type=float, default=4 * 3600.0, help="the audit's --deadline, seconds")
    parser.add_argument("--request-space-only", action="store_true",
                        help="the request-space checks and the coverage table alone (a coverage run)")
    parser.add_argument("--checks", metavar="NAMES",
                        help="comma-separated core check names to run alone, without the request space")
    args = parser.parse_args()
    if args.checks and args.request_space_only:
        parser.error("--checks: runs core checks without the request space; leave out --request-space-only")
    args.out.mkdir(parents=True, exist_ok=True)
    name = (f"space-{args.budget}" if args.request_space_only
            else f"checks-{args.budget}" if args.checks else args.budget)
    with llama_pair() as pair:
        command = [sys.executable, "-m", "specverify", "audit", "--level", "endpoint", pair.candidate,
                   "--baseline", pair.baseline, "--budget", args.budget, "--timeout", "300",
                   "--deadline", f"{args.deadline:g}", "--json", str(args.out / f"{name}.json")]
        if args.request_space_only:
            command += ["--request-space-only", "--allow-underpowered", "--no-fail-fast"]
        if args.checks:
            command += ["--checks", args.checks, "--no-request-space"]
        with open(args.out / f"{name}_terminal.txt", "w") as log:
            log.write(load_line() + "\n$ " + " ".join(command) + "\n")
            log.flush()
            started = time.monotonic()
            code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
            log.write(f"{load_line()}\nexit {code}; wall time {time.monotonic() - started:.1f} s\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
