"""Audit vLLM CPU servers' speculative decoding end to end, one candidate method at a time.

Starts a baseline vLLM server (no speculation) and one candidate per method of ``--methods``
(:mod:`specverify.testing.vllm_servers`; the venv of ``scripts/vllm_cpu_env.sh``) over the tiny
random Llama of :mod:`specverify.hf.server_checkpoints` (``--model tiny``; ``--model tiny-mimo``:
the same target as a MiMo checkpoint with one MTP layer, for ``--methods mtp``) or the packaged
SmolLM2-135M-Instruct converted to safetensors (``--model smollm2``).  It measures each server's
decoding speed (one greedy request of :data:`SPEED_TOKENS` tokens on a repetitive prompt, after a
warm-up request), then runs ``python -m specverify audit --level endpoint CANDIDATE --baseline
BASELINE --budget B [--checks C]`` per candidate and writes its log (load average before and after, wall time)
and JSON report under OUT.  The servers are stopped whatever happens.

    python benchmarks/endpoint_vllm_cpu.py --model tiny --methods ngram,draft_model --budget quick \
        --no-request-space --out /tmp/vllm-audit
    python benchmarks/endpoint_vllm_cpu.py --model tiny-mimo --methods mtp --budget quick \
        --no-request-space --checks greedy-identity,batch-invariance,acceptance --out /tmp/vllm-audit
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specverify.hf.server_checkpoints import write_tiny_eagle_head
from specverify.testing.vllm_servers import draft_model_config, eagle_config, mtp_config, ngram_config, vllm_servers

SPEED_TOKENS = 128
SPEED_PROMPT = "red green blue, red green blue, red green blue, red green blue, red green"


def load_line() -> str:
    return f"{time.strftime('%H:%M:%S')} load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def tokens_per_second(url: str, model: str) -> float:
    """Completion tokens per second of one greedy request of :data:`SPEED_TOKENS` tokens (after a warm-up)."""
    import httpx

    body = {"model": model, "prompt": SPEED_PROMPT, "max_tokens": SPEED_TOKENS, "temperature": 0.0, "ignore_eos": True}
    httpx.post(url + "/completions", json=dict(body, max_tokens=8), timeout=600).raise_for_status()
    started = time.monotonic()
    response = httpx.post(url + "/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()["usage"]["completion_tokens"] / (time.monotonic() - started)


def model_folders(name: str) -> tuple[Path, Path | None, Path]:
    """(target folder, draft folder or None, tokenizer folder) of ``--model``."""
    if name in ("tiny", "tiny-mimo"):
        from specverify.hf.server_checkpoints import write_tiny_mimo, write_tiny_target_and_draft

        folder = Path(tempfile.gettempdir()) / "specverify-tiny-server-models"
        target, draft = write_tiny_target_and_draft(folder)
        return (target, draft, target) if name == "tiny" else (write_tiny_mimo(folder / "mimo", target), None, target)
    from specverify.hf.packaged import prepare_packaged_model

    model = prepare_packaged_model("smollm2-135m-instruct")
    return model, None, model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("tiny", "tiny-mimo", "smollm2"), default="tiny")
    parser.add_argument(
        "--methods", default="ngram,draft_model", help="comma-separated: ngram, draft_model, eagle, mtp"
    )
    parser.add_argument("--checks", help="comma-separated check names, passed to the audit (default: all)")
    parser.add_argument("--budget", default="quick")
    parser.add_argument("--no-request-space", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=4 * 3600.0, help="each audit's --deadline, seconds")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    target, draft, tokenizer = model_folders(args.model)
    configs = {
        "ngram": lambda: ngram_config(),
        "draft_model": lambda: draft_model_config(draft or target),
        "eagle": lambda: eagle_config(write_tiny_eagle_head(target.parent / "eagle", target)),
        "mtp": lambda: mtp_config(),
    }
    methods = args.methods.split(",")
    servers = {"baseline": None} | {method: configs[method]() for method in methods}
    summary: dict[str, object] = {"model": args.model, "budget": args.budget, "servers": servers}
    started = time.monotonic()
    with vllm_servers(target, servers, tokenizer=tokenizer) as urls:
        summary["startup_s"] = round(time.monotonic() - started, 1)
        summary["tokens_per_s"] = {name: round(tokens_per_second(url, "model"), 2) for name, url in urls.items()}
        code = 0
        for method in methods:
            stem = f"{args.model}_{method}_{args.budget}"
            command = [
                sys.executable,
                "-m",
                "specverify",
                "audit",
                "--level",
                "endpoint",
                urls[method],
                "--baseline",
                urls["baseline"],
                "--budget",
                args.budget,
                "--timeout",
                "300",
                "--deadline",
                f"{args.deadline:g}",
                "--json",
                str(args.out / f"{stem}.json"),
            ]
            if args.no_request_space:
                command.append("--no-request-space")
            if args.checks:
                command += ["--checks", args.checks]
            with open(args.out / f"{stem}_terminal.txt", "w") as log:
                log.write(load_line() + "\n$ " + " ".join(command) + "\n")
                log.flush()
                audit_started = time.monotonic()
                result = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
                wall = time.monotonic() - audit_started
                log.write(f"{load_line()}\nexit {result}; wall time {wall:.1f} s\n")
            summary[method] = {"exit": result, "wall_s": round(wall, 1)}
            code = max(code, result)
    (args.out / f"{args.model}_summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
