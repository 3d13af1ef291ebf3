"""The reference tree decoder on CUDA: the tree attention path in float16, bfloat16 and float32.

Two checks per dtype (SmolLM2-135M-Instruct unless ``--target-model`` says otherwise; skipped
cleanly without CUDA):

- one tree pass (4-D boolean tree mask, depth position ids, committed-prefix KV cache) against
  plain forward passes over each node's path: the softmax laws agree within a dtype tolerance
  (exactly, up to 1e-4, in float32);
- greedy identity: the tree decoder's 64 greedy tokens (binary and EAGLE-like trees, early-exit
  draft), every position against the target's argmax given the row's own prefix
  (:func:`specverify.hf.divergence.check_identity`): exact in float32, within the calibrated
  rounding noise in float16/bfloat16 (the dtype's own and a float32 teacher-forced pass).
"""

from __future__ import annotations

import pytest
import torch

from reference.drafters import truncated_view
from reference.tree_decoder import (
    ModelTreeDrafter,
    TargetTreeCache,
    TreeDraft,
    TreeShape,
    tree_speculative_generate,
)
from specverify.core.tree_exact import binary_shape, eagle_shape
from specverify.hf import divergence

pytestmark = pytest.mark.gpu

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LAW_TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 6e-2, torch.float32: 1e-4}
SHAPES = {"binary6": binary_shape(6), "eagle231": eagle_shape(2, 3, 1)}
PROMPTS = ("def fibonacci(n):\n", "The capital of France is Paris. The capital of Italy is",
           '{"name": "Ada Lovelace", "born": 1815, "languages": [')
MAX_NEW_TOKENS = 64
DRAFT_LAYERS = 10


@pytest.fixture
def cuda_pair(load_pair):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")

    def get(dtype: torch.dtype):
        return load_pair("default", "cuda", dtype)

    return get


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@torch.no_grad()
def test_tree_pass_equals_path_forwards_cuda(cuda_pair, dtype, name):
    pair = cuda_pair(dtype)
    target = pair.target
    device = next(target.parameters()).device
    prompt = pair.tokenizer(PROMPTS[0], return_tensors="pt").input_ids[0].to(device)
    shape = TreeShape.of(SHAPES[name])
    tokens = torch.randint(target.config.vocab_size, (shape.num_nodes,),
                           generator=torch.Generator().manual_seed(0)).to(device)
    laws = torch.softmax(TargetTreeCache(target, prompt).score(prompt[-1], TreeDraft(tokens, None), shape).float(), -1)
    worst = 0.0
    for node in range(-1, shape.num_nodes):
        path = tokens[shape.path_to(node)] if node >= 0 else tokens[:0]
        reference = torch.softmax(target(input_ids=torch.cat([prompt, path])[None]).logits[0, -1].float(), -1)
        worst = max(worst, float((laws[node + 1] - reference).abs().max()))
    print(f"{dtype} {name}: largest law difference {worst:.2e}")
    assert worst <= LAW_TOLERANCE[dtype]


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_tree_decoder_greedy_identity_cuda(cuda_pair, identity_log, dtype, name):
    pair = cuda_pair(dtype)
    target = pair.target
    device = next(target.parameters()).device
    pad = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else 0
    prompts = [pair.tokenizer(text, return_tensors="pt").input_ids[0].to(device) for text in PROMPTS]
    float32_target = None if dtype == torch.float32 else cuda_pair(torch.float32).target
    calibration = None if dtype == torch.float32 else divergence.calibrate(
        target, prompts, max_new_tokens=MAX_NEW_TOKENS, batch_sizes=(1, 4), float32_model=float32_target,
        pad_token_id=pad)
    drafter = ModelTreeDrafter(truncated_view(target, DRAFT_LAYERS))
    generations = [tree_speculative_generate(target, drafter, prompt, parents=SHAPES[name],
                                             max_new_tokens=MAX_NEW_TOKENS, temperature=0.0) for prompt in prompts]
    report = divergence.check_identity(target, prompts, [g.tokens for g in generations], calibration=calibration,
                                       float32_model=float32_target, labels=[f"prompt{i}" for i in range(len(prompts))])
    identity_log({"test": f"tree-decoder-{name}", "dtype": str(dtype), "passed": report.passed,
                  "positions": report.positions, "exceedances": report.exceedances,
                  "calibration": None if calibration is None else calibration.summary(),
                  "tokens_per_pass": [round(g.stats.tokens_per_pass, 3) for g in generations], "report": str(report)})
    assert report.passed, str(report)
