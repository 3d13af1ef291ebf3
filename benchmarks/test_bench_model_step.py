"""2. What fraction of a speculative decoding step is verification, on a real target (CPU).

One step = one target forward pass over ``[last token, x_1 .. x_γ]`` with a KV cache holding the
prompt, then logits -> probabilities (``specverify.core.processing``), then the rule
(``specverify.core.rules``, with validation, as ``reference.decoder`` calls it).  Each round times the
three phases separately with ``time.perf_counter``; the benchmark's own time is the whole step.
``extra_info["verify_fraction"]`` is the median over rounds of ``verify / (forward + probs +
verify)``, the number pytest-benchmark tracks (``probs_fraction`` likewise; plain
sampling pays for the probabilities too, so only ``verify`` is the cost of speculation).
"""

from __future__ import annotations

import statistics

import pytest

from benchmarks.workloads import GAMMA, ModelUnderTest, decoding_step, prepare_step

BATCHES = (1, 8)
RULES = ("rejection", "greedy")
ROUNDS = 7


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("batch", BATCHES)
def test_verification_share_of_step(benchmark, smollm2: ModelUnderTest, batch: int, rule: str,
                                    rounds: int = ROUNDS) -> None:
    state = prepare_step(smollm2, batch)
    phases: list[dict[str, float]] = []
    benchmark.group = f"model step {smollm2.name} B={batch}"
    benchmark.pedantic(lambda: phases.append(decoding_step(state, rule)), rounds=rounds, warmup_rounds=1)
    measured = phases[1:] if len(phases) > rounds else phases  # drop the warm-up round
    total = [sum(p.values()) for p in measured]
    benchmark.extra_info.update(
        suite="model-step", model=smollm2.name, batch=batch, rule=rule, gamma=GAMMA,
        context_length=state.context_length,
        forward_s=statistics.median(p["forward_s"] for p in measured),
        probs_s=statistics.median(p["probs_s"] for p in measured),
        verify_s=statistics.median(p["verify_s"] for p in measured),
        verify_fraction=statistics.median(p["verify_s"] / t for p, t in zip(measured, total)),
        probs_fraction=statistics.median(p["probs_s"] / t for p, t in zip(measured, total)),
    )
