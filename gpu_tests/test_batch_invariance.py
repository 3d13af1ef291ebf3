"""Batch invariance of the reference decoder on a real model: a request's tokens must not depend
on the other requests decoded with it.

- Greedy: each prompt decoded alone and inside one batch with prompts of other lengths.  float32:
  identical.  float16/bfloat16: both are judged by whole-sequence greedy identity
  (:func:`specverify.hf.divergence.check_identity`: every position against the target's argmax
  given the row's own prefix, within the rounding noise :func:`specverify.hf.divergence.calibrate`
  measures for this model and dtype), so a batched row that leaves its alone row is correct only
  where both are.
- Sampling: the same request with the same seed gives the same tokens when decoded twice in the
  same batch (reproducibility) and when decoded alone or inside a batch (batch invariance).

Default run (CPU, float32, SmolLM2, 8 new tokens, batches of 3): the two sampling checks, about 5 s.  The
greedy check needs only CPU float32 to be exact, which ``test_greedy_identity``'s batch-4 case
already implies (every batched row equals the plain greedy output of its prompt alone); here it
runs on CUDA (``-m gpu``) and on CPU under ``-m slow``.
"""

from __future__ import annotations

import pytest
import torch

from reference.decoder import speculative_generate
from reference.drafters import ModelDrafter, PromptLookupDrafter
from specverify.core.seeding import derive_seed
from specverify.hf import divergence

PROMPTS = (
    "def is_prime(n):\n",
    '{"id": 17, "tags": ["red", "green"], "owner": {"name":',
    "Summarise in one sentence: the meeting moved from Tuesday to Thursday because the room was booked.",
    "The river",
)
GREEDY_TOKENS = 64
SAMPLED_TOKENS = 8
CUDA = pytest.mark.gpu


def encode(pair, text: str, device: str) -> torch.Tensor:
    return pair.tokenizer(text, return_tensors="pt").input_ids[0].to(device)


def make_drafter(kind: str, target: torch.nn.Module):
    return PromptLookupDrafter() if kind == "prompt-lookup" else ModelDrafter(target)


GREEDY_CASES = [
    pytest.param(device, dtype, kind, id=f"{device}-{str(dtype)[6:]}-{kind}", marks=marks)
    for device, dtype, marks in (
        ("cpu", torch.float32, [pytest.mark.slow]),
        ("cpu", torch.bfloat16, [pytest.mark.slow]),
        ("cuda", torch.float32, [CUDA]),
        ("cuda", torch.float16, [CUDA]),
        ("cuda", torch.bfloat16, [CUDA]),
    )
    for kind in ("prompt-lookup", "self")
]


@pytest.mark.parametrize("device,dtype,kind", GREEDY_CASES)
def test_greedy_alone_equals_in_batch(load_pair, identity_log, device, dtype, kind):
    pair = load_pair("default", device, dtype)
    device = str(pair.target.device)
    prompts = [encode(pair, text, device) for text in PROMPTS]
    drafter = make_drafter(kind, pair.target)
    alone = [
        speculative_generate(pair.target, drafter, [p], max_new_tokens=GREEDY_TOKENS, temperature=0.0).tokens[0].cpu()
        for p in prompts
    ]
    batched = speculative_generate(pair.target, drafter, prompts, max_new_tokens=GREEDY_TOKENS, temperature=0.0).tokens
    if dtype in divergence.EXACT_DTYPES:
        assert [row.tolist() for row in batched] == [row.tolist() for row in alone]
    float32_target, calibration = None, None
    if dtype not in divergence.EXACT_DTYPES:
        float32_target = load_pair("default", device, torch.float32).target
        calibration = divergence.calibrate(pair.target, prompts, max_new_tokens=GREEDY_TOKENS,
                                           batch_sizes=(1, len(prompts)), float32_model=float32_target,
                                           pad_token_id=pair.tokenizer.pad_token_id or 0)
    labels = [f"alone{i}" for i in range(len(prompts))] + [f"batched{i}" for i in range(len(prompts))]
    report = divergence.check_identity(pair.target, prompts * 2, alone + list(batched), calibration=calibration,
                                       float32_model=float32_target, labels=labels)
    identity_log({"test": f"batch-invariance-greedy-{kind}", "device": device, "dtype": str(dtype),
                  "positions": report.positions, "exceedances": report.exceedances, "report": str(report)})
    assert report.passed, str(report)


SAMPLING_CASES = [
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    pytest.param("cuda", torch.float32, id="cuda-float32", marks=CUDA),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=CUDA),
]


def sample(pair, prompts: list[torch.Tensor], seed: int) -> torch.Tensor:
    return speculative_generate(
        pair.target, PromptLookupDrafter(), prompts, max_new_tokens=SAMPLED_TOKENS, temperature=1.0, seed=seed
    ).tokens.cpu()


@pytest.mark.parametrize("device,dtype", SAMPLING_CASES)
def test_sampling_same_seed_same_batch_is_reproducible(load_pair, device, dtype):
    pair = load_pair("default", device, dtype)
    prompts = [encode(pair, text, str(pair.target.device)) for text in PROMPTS[:3]]
    seed = derive_seed("batch-invariance", "reproducible", device, str(dtype))
    assert torch.equal(sample(pair, prompts, seed), sample(pair, prompts, seed))


@pytest.mark.parametrize("device,dtype", SAMPLING_CASES)
def test_sampling_same_seed_alone_equals_in_batch(load_pair, device, dtype):
    pair = load_pair("default", device, dtype)
    prompts = [encode(pair, text, str(pair.target.device)) for text in PROMPTS[:3]]
    seed = derive_seed("batch-invariance", "alone-vs-batch", device, str(dtype))
    alone = sample(pair, prompts[:1], seed)[0]
    in_batch = sample(pair, prompts, seed)[0]
    assert torch.equal(alone, in_batch), f"alone {alone.tolist()} vs in a batch {in_batch.tolist()}"
