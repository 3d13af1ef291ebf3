"""The endpoint level against servers that batch and seed: a lossless batching toy server passes
every check; each planted bug of shared verification steps or of seed handling is caught by the
check built for it; a non-promised seeded determinism is reported, never accused."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

pytest.importorskip("httpx", reason="the endpoint level needs httpx: pip install -e '.[endpoint]'")

from test_endpoint_audit import CORE_CHECKS

from specverify.auditing.endpoint.battery import PROMPTS, EndpointBattery, EndpointTarget
from specverify.auditing.endpoint.bursts import BURST_SETTINGS, CoBatching, burst_rows, co_batching
from specverify.auditing.endpoint.client import Completion, parse_choices
from specverify.auditing.endpoint.context_law import context_cells, stratified_fit
from specverify.auditing.isolation.faults import Fault
from specverify.auditing.runner import audit
from specverify.core.seeding import derive_seed

NEW_CHECKS = ("context-law-T1-top4", "pit-burst-mixed", "pit-pairs-n2", "seed-reproducibility")


def _verdicts(report) -> dict[str, str]:
    return {c.name: c.verdict for c in report.checks}


def test_lossless_batching_server_passes_every_check(toy_server) -> None:
    """The batching toy runs every request's rows in shared steps, each with its own settings and
    random state: lossless, and (float64, per-request generators) seeded-deterministic in any batch."""
    candidate, baseline = toy_server(speculative=True, batching=True), toy_server(speculative=False)
    report = audit(candidate.url, level="endpoint", budget="quick", baseline=baseline.url, seeded_determinism=True,
                   checks=CORE_CHECKS)
    assert report.exit_code == 0, report.explain()
    assert set(_verdicts(report).values()) == {"pass"} and set(NEW_CHECKS) <= set(_verdicts(report))
    assert candidate.engine.largest_step >= 4  # the server did verify several requests in one step
    burst = next(c for c in report.checks if c.name == "pit-burst-mixed")
    assert "all in flight at once" in burst.message and "overlapping processing" in burst.message
    assert report.plan.alpha_share == pytest.approx(1e-3 / 6)  # 6 statistical checks share α (Bonferroni)


@pytest.mark.parametrize(("config", "check"), [
    ({"step_bug": "settings"}, "pit-burst-mixed"),  # one request's temperature / top-k for the whole step
    ({"step_bug": "rows"}, "pit-burst-mixed"),      # the bonus row read from the next request
    ({"seed_bug": "step"}, "context-law-T1-top4"),  # drafts and acceptance tests share their uniforms
    ({"seed_bug": "choices"}, "pit-pairs-n2"),      # every choice of n = 2 seeded with the request's seed
])
def test_planted_batch_and_seed_bugs_are_caught(toy_server, config: dict, check: str) -> None:
    candidate = toy_server(speculative=True, batching=True, **config)
    report = audit(candidate.url, level="endpoint", budget="quick", baseline=toy_server(speculative=False).url,
                   checks=[check])
    assert report.exit_code == 1 and report.verdict == "loss detected", report.explain()


def test_seed_shared_by_a_step_is_reported_and_judged_only_when_promised(toy_server) -> None:
    """step_bug="seed": every row of a step draws from its first row's generator.  The law stays
    exact (pit-burst-mixed passes), but a seeded request's tokens depend on its batch: reported
    and not judged by default (the API promises best effort), contract violated when promised."""
    candidate = toy_server(speculative=True, batching=True, step_bug="seed")
    plain = audit(candidate.url, level="endpoint", budget="quick", checks=["seed-reproducibility"])
    result = plain.checks[0]
    assert result.verdict == "skipped" and "not judged" in result.message and "difference" in result.message
    assert plain.verdict not in ("loss detected", "contract violated")
    promised = audit(candidate.url, level="endpoint", budget="quick", checks=["seed-reproducibility"],
                     seeded_determinism=True)
    assert promised.verdict == "contract violated" and promised.exit_code == 1, promised.explain()
    assert "promises seeded determinism" in promised.checks[0].message


def test_the_burst_plan_is_a_function_of_the_seed_alone(toy_server) -> None:
    """Rows of a burst: distinct prompts, neighbouring settings differ, a seed each, and in odd
    bursts a companion that repeats row 0's seed on another prompt; the same requests reach the
    server in two runs, whatever its batching did."""
    for burst in range(6):
        rows = burst_rows(PROMPTS, 7, 0, burst, 4)
        assert len({r.prompt for r in rows}) == 4
        assert all((a.temperature, a.top_k) != (b.temperature, b.top_k) for a, b in zip(rows, rows[1:]))
        assert [r.counted for r in rows] == [True, True, True, burst % 2 == 0]
        assert (rows[-1].seed == rows[0].seed) == (burst % 2 == 1)
        assert len({r.seed for r in rows[:3]}) == 3
    assert burst_rows(PROMPTS, 7, 0, 3, 4) == burst_rows(PROMPTS, 7, 0, 3, 4) != burst_rows(PROMPTS, 8, 0, 3, 4)
    assert {(t, k) for t, k in BURST_SETTINGS} == {(r.temperature, r.top_k) for b in range(3)
                                                   for r in burst_rows(PROMPTS, 7, 0, b, 1)}
    sent = []
    for _ in range(2):
        server = toy_server(speculative=True, batching=True)
        audit(server.url, level="endpoint", budget=120, checks=["pit-burst-mixed"])
        sent.append(Counter((b["prompt"], b["temperature"], b["top_k"], b["seed"]) for b in server.state.bodies
                            if b.get("top_k") is not None))
    assert sent[0] == sent[1] and len(sent[0]) > 10


def _completion(sent: float, received: float, server_ms: float | None) -> Completion:
    timings = None if server_ms is None else {"prompt_ms": 0.0, "predicted_ms": server_ms}
    return Completion("", (), (), (), "length", timings, sent, received)


def test_co_batching_evidence_from_the_clock_and_the_servers_timings() -> None:
    """Overlapping processing is shown only when the server's times sum above the wall time."""
    together = [_completion(0.00, 0.10, 90.0), _completion(0.01, 0.11, 95.0)]
    assert co_batching(together) == CoBatching(1, 1, 1, 1)
    one_at_a_time = [_completion(0.00, 0.10, 45.0), _completion(0.01, 0.11, 50.0)]  # in flight, served in turn
    assert co_batching(one_at_a_time) == CoBatching(1, 1, 1, 0)
    serial = [_completion(0.00, 0.05, 50.0), _completion(0.06, 0.11, 50.0)]
    assert co_batching(serial) == CoBatching(1, 0, 1, 0)
    untimed = [_completion(0.00, 0.10, None), _completion(0.01, 0.11, None)]
    evidence = co_batching(untimed) + co_batching(together)
    assert evidence == CoBatching(2, 2, 1, 1)
    assert "cannot be confirmed from outside" in co_batching(untimed).describe(2)


def test_parse_choices_orders_by_index_and_checks_n() -> None:
    document = {"choices": [{"index": 1, "text": "b", "finish_reason": "length"},
                            {"index": 0, "text": "a", "finish_reason": "length"}]}
    assert [c.text for c in parse_choices(document, "candidate", "http://x/v1", {"n": 2})] == ["a", "b"]
    with pytest.raises(Fault, match="asked for n=3"):
        parse_choices(document, "candidate", "http://x/v1", {"n": 3})
    with pytest.raises(Fault, match="index fields"):
        parse_choices({"choices": [{"index": 0, "text": "a"}, {"index": 0, "text": "b"}]}, "candidate", "u", {})


def test_a_server_that_ignores_n_gets_no_pairs_check(toy_server) -> None:
    battery = EndpointBattery()
    battery.resolve_budget("quick")
    session = battery.open_session(EndpointTarget(toy_server(speculative=True, fault="no-n").url), device="cpu",
                                   timeout_s=30)
    try:
        names = [c.name for c in battery.checks(session)]
    finally:
        session.close()
    assert "pit-pairs-n2" not in names and "pit-burst-mixed" in names
    assert any("does not serve n = 2" in note for note in session.notes)


def _draws(law: dict[str, float], n: int, rng: np.random.Generator) -> Counter:
    tokens = sorted(law)
    return Counter(rng.choice(tokens, size=n, p=[law[t] for t in tokens]).tolist())


def test_stratified_fit_keeps_deviations_that_cancel_across_contexts() -> None:
    """Two contexts whose deviations are mirror images: pooled over contexts the token ranks see
    nothing, summed per context the deviation is plain; under the law the p-value is not small."""
    rng = np.random.default_rng(derive_seed("stratified-fit"))
    law = {"a": 0.5, "b": 0.3, "c": 0.2}
    shifted = [{"a": 0.4, "b": 0.4, "c": 0.2}, {"a": 0.6, "b": 0.2, "c": 0.2}]
    n = 2000
    expected = {("p", x): {t: n * q for t, q in law.items()} for x in "xy"}
    null = stratified_fit({("p", x): _draws(law, n, rng) for x in "xy"}, expected, 0)
    assert null.dof == 4 and null.contexts == 2 and null.pvalue > 1e-3
    mirrored = {("p", x): _draws(q, n, rng) for x, q in zip("xy", shifted)}
    pooled = mirrored[("p", "x")] + mirrored[("p", "y")]
    assert abs(pooled["a"] / (2 * n) - 0.5) < 0.03  # the pooled counts look like the law
    alternative = stratified_fit(mirrored, expected, 0)
    assert alternative.pvalue < 1e-12 and alternative.empirical_tv > 0.05
    assert stratified_fit(mirrored, expected, 1).pvalue == 0.0  # a token of probability 0: certain loss
    assert context_cells(2, 4) == 31  # 1 + P (1 + k)(k − 1) planning cells
