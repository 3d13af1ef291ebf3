"""5. Batch-size sweep: where speculation stops paying on this machine, measured and predicted.

For each batch size B, in one group:

- ``plain``: Hugging Face greedy ``generate`` on B prompts (cycled code/edit prompts, left-padded);
- ``reference-prompt-lookup``: the reference decoder with prompt lookup on the same prompts;
- ``target-pass-1`` / ``target-pass-{γ+1}``: one target forward pass over 1 and over γ+1 new
  tokens per row with a KV cache holding the prompt: the cost inputs of the speedup model.

Measured speedup = t(plain) / t(reference) (same B × max_new_tokens tokens).  Predicted speedup
(``specverify.core.speedup.speedup``, Leviathan et al. 2023 §3.3–3.4 with a verification cost) uses the
measured effective acceptance by position (``workloads.effective_alphas``), the draft cost
``c = draft seconds per drafted token / t(target-pass-1)`` and the verification cost
``v = (t(target-pass-{γ+1}) − t(target-pass-1)) / (γ · t(target-pass-1))``
(``benchmarks/report.py`` computes both).  On a CPU a target pass becomes compute bound at small
B, so ``v`` grows quickly with B and speculation stops paying early.

Trimmed for a 2-core CPU: B ∈ {1, 2, 4, 8, 16} (the full sweep is 1 … 64; at B = 64 one reference run
of SmolLM2 takes minutes there).  Set ``$SPECVERIFY_SWEEP_BATCHES`` (e.g. ``1,4,16,64``) to change it.
The early-exit draft is left out: with ~6% acceptance it cannot pay at any B.
"""

from __future__ import annotations

import os
import statistics

import pytest

from benchmarks.workloads import (
    GAMMA,
    ModelUnderTest,
    batch_of_prompts,
    decode,
    decode_summary,
    prepare_step,
    target_pass,
    timed,
)

BATCHES = tuple(int(b) for b in os.environ.get("SPECVERIFY_SWEEP_BATCHES", "1,2,4,8,16").split(","))
MAX_NEW_TOKENS = 32
DECODERS = ("plain", "reference-prompt-lookup")
PASS_WIDTHS = (1, GAMMA + 1)
PASS_ROUNDS = 5


@pytest.mark.parametrize("method", DECODERS)
@pytest.mark.parametrize("batch", BATCHES)
def test_sweep_decoder(benchmark, smollm2: ModelUnderTest, batch: int, method: str,
                       max_new_tokens: int = MAX_NEW_TOKENS) -> None:
    prompts = batch_of_prompts(smollm2.prompts, batch)
    results = []
    benchmark.group = f"sweep {smollm2.name} B={batch}"
    benchmark.pedantic(lambda: results.append(decode(smollm2, method, prompts, max_new_tokens)), rounds=1,
                       iterations=1)
    benchmark.extra_info.update(suite="sweep", kind="decoder", model=smollm2.name, method=method, batch=batch,
                                gamma=GAMMA, **decode_summary(results[-1], method))


@pytest.mark.parametrize("width", PASS_WIDTHS)
@pytest.mark.parametrize("batch", BATCHES)
def test_sweep_target_pass(benchmark, smollm2: ModelUnderTest, batch: int, width: int,
                           rounds: int = PASS_ROUNDS) -> None:
    state = prepare_step(smollm2, batch)
    seconds: list[float] = []
    benchmark.group = f"sweep {smollm2.name} B={batch}"
    benchmark.pedantic(lambda: seconds.append(timed(lambda: target_pass(state, width), state.block.device)[1]),
                       rounds=rounds, warmup_rounds=1)
    benchmark.extra_info.update(suite="sweep", kind="target-pass", model=smollm2.name, batch=batch, width=width,
                                gamma=GAMMA, context_length=state.context_length,
                                pass_s=statistics.median(seconds))
