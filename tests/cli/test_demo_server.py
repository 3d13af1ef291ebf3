"""``specverify demo-server``: it serves the endpoint toy on free ports, answers completions, and stops at
``--max-requests`` (a bounded lifetime besides); an unknown ``--bug`` is refused with the closest name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from specverify.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_demo_server_prints_its_urls_serves_and_stops_after_max_requests():
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specverify",
            "demo-server",
            "--port",
            "0",
            "--baseline-port",
            "0",
            "--max-requests",
            "2",
            "--lifetime",
            "60",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        candidate = server.stdout.readline().rsplit(" ", 1)[-1].strip()
        baseline = server.stdout.readline().rsplit(" ", 1)[-1].strip()
        command = server.stdout.readline()
        assert candidate.startswith("http://127.0.0.1:") and candidate.endswith("/v1"), candidate
        assert f"--level endpoint {candidate} --baseline {baseline}" in command
        body = {"model": "toy", "prompt": "abcabcabc", "max_tokens": 8, "temperature": 0, "logprobs": 2}
        greedy = [_post(f"{url}/completions", body)["choices"][0]["text"] for url in (candidate, baseline)]
        assert greedy[0] == greedy[1] and len(greedy[0]) == 8  # speculative greedy decoding is the target's own
        _post(f"{candidate}/completions", dict(body, temperature=1.0))
        assert server.wait(timeout=30) == 0
        assert "stopped" in server.stdout.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_an_unknown_bug_is_refused_with_the_closest_catalog_name(capsys):
    assert main(["demo-server", "--port", "0", "--bug", "bonus-from-drafts"]) == 2
    assert "--bug" in (err := capsys.readouterr().err) and "did you mean bonus-from-draft?" in err
