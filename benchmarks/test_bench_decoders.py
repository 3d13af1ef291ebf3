"""4. The reference decoder against plain decoding and Hugging Face assisted generation (greedy).

Same target, same prompts (``CODE_EDIT_PROMPTS``: code edits whose answers copy the prompt), same
draft, batch 1, ``max_new_tokens`` new tokens without stopping at EOS.  Drafters: prompt lookup
(n-gram copy, up to 3-grams) and an early-exit draft (the target's first ``EARLY_EXIT_LAYERS``
layers + its final norm and head; Hugging Face ``assistant_early_exit``), plus a separate draft
model when ``$SPECVERIFY_DRAFT`` names one.  See ``benchmarks/workloads.py`` for the methods.

Per run ``extra_info`` records tokens, target passes (prefill included), tokens per target pass,
accepted drafts per draft slot, the reference's acceptance by position, and whether the tokens
equal plain greedy decoding's (they must: greedy speculative decoding is lossless).  Tokens per
second = ``new_tokens`` / the benchmark's median time (``benchmarks/report.py``).
Goal: the reference at least as fast as HF assisted generation on the same work, and
faster than plain decoding on code/edit prompts.

Issue 12: the reference's prompt lookup against HF's prompt lookup with each match policy
(``-earliest`` is HF's own choice: the same drafts), and, behind ``-m slow``, the Qwen2.5-Coder
pair (1.5B-Instruct target, 0.5B-Instruct draft, provisioned by ``specverify.hf.packaged``): prompt
lookup and the draft model against HF's ``prompt_lookup_num_tokens`` / ``assistant_model`` with
the same γ (``test_decoder_qwen``, a few short requests: the 1.5B target in fp32 is slow on a CPU).
``python benchmarks/decoder_ratios.py RUN.json`` prints the reference/HF ratios.
"""

from __future__ import annotations

import functools

import pytest
import torch

from benchmarks.workloads import DRAFTERS, ModelUnderTest, decode, decode_summary

MAX_NEW_TOKENS = 48
PROMPTS = (0, 1, 3)  # indices into the model's prompts: rename, type hints, bug fix
ROUNDS = 1
MATCH_POLICY_METHODS = tuple(f"reference-prompt-lookup-{policy}" for policy in ("earliest", "latest", "longest"))
METHODS = ("plain",) + tuple(
    method
    for drafter in DRAFTERS + ("draft-model",)
    for method in (f"reference-{drafter}", f"hf-{drafter}")
    + ((f"hf-{drafter}-defaults",) if drafter != "prompt-lookup" else ())
) + MATCH_POLICY_METHODS  # every match policy of the reference's prompt lookup

QWEN_MAX_NEW_TOKENS = 32
QWEN_PROMPTS = (1, 3)  # type hints, bug fix
QWEN_METHODS = (
    "reference-prompt-lookup", "hf-prompt-lookup", "reference-draft-model", "hf-draft-model", *MATCH_POLICY_METHODS,
)


@functools.lru_cache(maxsize=8)
def plain_tokens(unit: ModelUnderTest, prompt_index: int, max_new_tokens: int) -> torch.Tensor:
    """Plain greedy decoding's tokens: what every speculative method must reproduce."""
    return decode(unit, "plain", [unit.prompts[prompt_index]], max_new_tokens).tokens


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("prompt_index", PROMPTS)
def test_decoder(benchmark, smollm2: ModelUnderTest, prompt_index: int, method: str,
                 max_new_tokens: int = MAX_NEW_TOKENS, rounds: int = ROUNDS) -> None:
    run_decoder(benchmark, smollm2, prompt_index, method, max_new_tokens, rounds)


@pytest.mark.slow
@pytest.mark.parametrize("method", QWEN_METHODS)
@pytest.mark.parametrize("prompt_index", QWEN_PROMPTS)
def test_decoder_qwen(benchmark, qwen_pair: ModelUnderTest, prompt_index: int, method: str,
                      max_new_tokens: int = QWEN_MAX_NEW_TOKENS, rounds: int = ROUNDS) -> None:
    run_decoder(benchmark, qwen_pair, prompt_index, method, max_new_tokens, rounds)


def run_decoder(benchmark, unit: ModelUnderTest, prompt_index: int, method: str, max_new_tokens: int,
                rounds: int) -> None:
    """Time one decoder on one prompt and record what it did (``extra_info``)."""
    if "draft-model" in method and unit.draft_model is None:
        pytest.skip("no separate draft model: set $SPECVERIFY_DRAFT to one sharing the target's vocabulary")
    prompt = unit.prompts[prompt_index]
    expected = plain_tokens(unit, prompt_index, max_new_tokens)  # also warms the model up
    results = []
    benchmark.group = f"decoders {unit.name} prompt {prompt_index}"
    benchmark.pedantic(lambda: results.append(decode(unit, method, [prompt], max_new_tokens)),
                       rounds=rounds, iterations=1)
    result = results[-1]
    benchmark.extra_info.update(
        suite="decoders", model=unit.name, method=method, prompt_index=prompt_index,
        prompt_tokens=len(prompt), matches_plain=bool(torch.equal(result.tokens, expected)),
        **decode_summary(result, method),
    )
