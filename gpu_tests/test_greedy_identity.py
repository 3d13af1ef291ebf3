"""Greedy token identity on real models: speculative greedy output = the target's own greedy output.

Candidates: Hugging Face assisted generation (``prompt_lookup_num_tokens``, ``assistant_model``,
``assistant_early_exit``) and the reference decoder (``reference.decoder.speculative_generate``
with each drafter: prompt lookup, early exit, the target itself, a random-initialised model, the
user's draft model), 64 new tokens, end-of-sequence stopping disabled.

Verdict (:func:`specverify.hf.divergence.check_identity`, whole-sequence): the target scores each
candidate row's whole continuation teacher-forced (one pass, in the dtype under test, and in
float32 for float16/bfloat16) and every position's token is judged against the target's argmax
given the row's own prefix.  float32: exact (no position may differ).  float16/bfloat16: no
position's gap may exceed τ, and no more positions may differ than rounding explains, both
calibrated per model, device and dtype from plain greedy decoding against itself
(:func:`specverify.hf.divergence.calibrate`).  Oracle checks on the drafters: the target drafting
for itself is accepted almost always, a random-initialised draft almost never.  Every verdict
prints its positions compared and exceedances (``identity_log``).

Known-buggy decoders (:mod:`gpu_tests.identity_power`: accept every draft unchecked, logits read
one position late, a stale KV entry) must fail and the lossless one pass, on many prompts:
``test_identity_catches_buggy_decoders`` here (float32 on CPU; every dtype on CUDA), and in
bfloat16/float16 on CPU under each kernel set in ``test_greedy_kernel_sets.py``.

What runs where (SmolLM2-135M-Instruct unless ``--target-model``/``--draft-model`` say otherwise):

- default run, CPU: HF prompt lookup and the reference decoder with prompt lookup, float32 and
  bfloat16, an edit-of-the-prompt prompt at batch 1, one float32 batch-4 case (edit and code
  prompts, rows of different lengths), and the float32 buggy-decoder check (4 prompts, 32
  tokens).  The bfloat16 calibration is one plain batch-2 decode, once per worker;
- ``-m slow``: every prompt kind, every drafter, batch 4, on CPU; the buggy decoders on 16 prompts
  and 64 tokens; the Qwen2.5-Coder 1.5B/0.5B pair;
- ``-m gpu``: everything on CUDA in float16, bfloat16 and float32, batch sizes 1, 4 and 16.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

import reference.decoder
from gpu_tests import identity_power
from reference.decoder import speculative_generate
from reference.drafters import EarlyExitDrafter, ModelDrafter, PromptLookupDrafter
from specverify.hf import divergence
from specverify.hf import packaged as models

MAX_NEW_TOKENS = 64
GAMMA = 4
EXACT = (torch.float32,)
DEFAULT_CHOICE, QWEN_CHOICE = "default", "qwen-coder"  # model choices of gpu_tests/conftest.py's load_pair

PROMPTS: dict[str, str] = {
    "code/0": "def fibonacci(n):\n",
    "code/1": "import json\n\ndef load_config(path):\n",
    "json/0": '{"name": "Ada Lovelace", "born": 1815, "languages": [',
    "json/1": 'Convert to JSON with keys "city" and "population".\nParis, 2102650\nJSON:',
    "edit/0": (
        "Rewrite this function to use a loop instead of recursion:\n\n"
        "def total(xs):\n    if not xs:\n        return 0\n    return xs[0] + total(xs[1:])\n\nRewritten:\n"
    ),
    "edit/1": 'Fix the spelling and repeat the sentence: "The quick brwon fox jumsp over the lazy dgo."\nFixed:',
    "prose/0": "The old lighthouse keeper",
    "prose/1": "Once upon a time in a small village,",
}
# On CPU every decode costs ~5 s per 64 tokens on one core, so the CPU cases use few prompts:
CPU_PROMPTS = ("edit/0",)  # decoded alone
CPU_BATCH_PROMPTS = ("edit/0", "code/0")  # cycled to fill a CPU batch (rows of different lengths); tau's calibration
ONE_PER_KIND = ("code/0", "json/0", "edit/0", "prose/0")


def settings(*, cpu: Sequence[tuple[torch.dtype, bool]],
             cuda: Sequence[torch.dtype] = (torch.float16, torch.bfloat16, torch.float32)):
    """(device, dtype) parameters: CPU ones as given ``(dtype, slow)``, CUDA ones marked ``gpu``."""
    for dtype, slow in cpu:
        yield "cpu", dtype, [pytest.mark.slow] if slow else []
    for dtype in cuda:
        yield "cuda", dtype, [pytest.mark.gpu]


def param_id(device: str, dtype: torch.dtype, *rest: object) -> str:
    return "-".join([device, str(dtype).removeprefix("torch."), *map(str, rest)])


class IdentityContext:
    """One model choice on one device and dtype: prompts, the float32 reference, τ, the verdict."""

    def __init__(self, pair: models.ModelPair, float32_target: Any | None, choice: str, device: str,
                 dtype: torch.dtype, log: Callable) -> None:
        self.pair, self.float32_target = pair, float32_target
        self.choice, self.device, self.dtype, self.log = choice, device, dtype, log
        self.pad_token_id = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else 0
        self._calibration: divergence.Calibration | None = None

    def prompt(self, prompt_id: str) -> torch.Tensor:
        return self.pair.tokenizer(PROMPTS[prompt_id], return_tensors="pt").input_ids[0]

    def calibration(self) -> divergence.Calibration | None:
        """None in float32 (identity is exact); else calibrated once on this context's prompts."""
        if self.dtype in EXACT:
            return None
        if self._calibration is None:
            prompt_ids = CPU_BATCH_PROMPTS if self.device == "cpu" else tuple(PROMPTS)
            batch_sizes = (2,) if self.device == "cpu" else (4, 16)
            self._calibration = divergence.calibrate(
                self.pair.target, [self.prompt(p) for p in prompt_ids], max_new_tokens=MAX_NEW_TOKENS,
                batch_sizes=batch_sizes, float32_model=self.float32_target, pad_token_id=self.pad_token_id,
            )
            self.log({"calibration": self.choice, "device": self.device, **self._calibration.summary()})
        return self._calibration

    def verdict(self, test: str, prompt_ids: Sequence[str], candidates: Sequence[torch.Tensor], seconds: float,
                **extra: Any) -> divergence.IdentityReport:
        report = divergence.check_identity(
            self.pair.target, [self.prompt(p) for p in prompt_ids], candidates, calibration=self.calibration(),
            float32_model=self.float32_target, labels=prompt_ids,
        )
        self.log({"test": test, "model": self.pair.target_spec, "device": self.device, "dtype": str(self.dtype),
                  "runtime_s": round(seconds, 2), "passed": report.passed, "positions": report.positions,
                  "exceedances": report.exceedances, "report": str(report), **extra})
        return report


@pytest.fixture(scope="module")
def context(load_pair, identity_log) -> Callable[[str, str, torch.dtype], IdentityContext]:
    """``context(choice, device, dtype)``: the cached :class:`IdentityContext`."""
    contexts: dict[tuple[str, str, torch.dtype], IdentityContext] = {}

    def get(choice: str, device: str, dtype: torch.dtype) -> IdentityContext:
        if (choice, device, dtype) not in contexts:
            pair = load_pair(choice, device, dtype)
            float32_target = None if dtype in EXACT else load_pair(choice, device, torch.float32).target
            contexts[choice, device, dtype] = IdentityContext(pair, float32_target, choice,
                                                              models.resolve_device(device),
                                                              dtype, identity_log)
        return contexts[choice, device, dtype]

    return get


def hf_greedy(ctx: IdentityContext, prompt_id: str, **assist: Any) -> torch.Tensor:
    """HF ``generate`` greedy with the assistance named in ``assist``; exactly 64 new tokens."""
    prompt = ctx.prompt(prompt_id)[None].to(ctx.device)
    out = ctx.pair.target.generate(
        prompt, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=ctx.pad_token_id,
        **assist,
    )
    return out[0, prompt.shape[1]:].cpu()


def reference_greedy(ctx: IdentityContext, drafter: Any, prompt_ids: Sequence[str]) -> reference.decoder.Generation:
    prompts = [ctx.prompt(p).to(ctx.device) for p in prompt_ids]
    return speculative_generate(ctx.pair.target, drafter, prompts, max_new_tokens=MAX_NEW_TOKENS, gamma=GAMMA,
                                temperature=0.0)


def acceptance_rate(generation: reference.decoder.Generation) -> float:
    """Accepted / verified draft tokens over all rows and positions of a run."""
    pooled = generation.stats.pooled()
    return sum(pooled.accepted_by_position) / max(sum(pooled.verified_by_position), 1)


def make_drafter(kind: str, ctx: IdentityContext) -> Any:
    """The reference drafter called ``kind`` for ``ctx``'s target (skips when there is no draft model)."""
    target = ctx.pair.target
    if kind == "prompt-lookup":
        return PromptLookupDrafter()
    if kind == "early-exit":
        return EarlyExitDrafter(target, num_layers=max(1, target.config.num_hidden_layers // 2))
    if kind == "self":
        return ModelDrafter(target)
    if kind == "random":
        return ModelDrafter(models.random_init_like(target, seed=1))
    if ctx.pair.draft is None:
        pytest.skip("no draft model: pass --draft-model or set SPECVERIFY_DRAFT")
    return ModelDrafter(ctx.pair.draft)


# --- HF assisted generation --------------------------------------------------------------------

PROMPT_LOOKUP_CASES = [
    pytest.param(device, dtype, prompt_id, id=param_id(device, dtype, prompt_id),
                 marks=marks + ([pytest.mark.slow] if device == "cpu" and prompt_id not in CPU_PROMPTS else []))
    for device, dtype, marks in settings(cpu=[(torch.float32, False), (torch.bfloat16, False)])
    for prompt_id in PROMPTS
]


@pytest.mark.parametrize("device,dtype,prompt_id", PROMPT_LOOKUP_CASES)
def test_hf_prompt_lookup_greedy_identity(context, device, dtype, prompt_id):
    ctx = context(DEFAULT_CHOICE, device, dtype)
    ctx.calibration()  # tau is calibrated before the clock starts
    start = time.perf_counter()
    candidate = hf_greedy(ctx, prompt_id, prompt_lookup_num_tokens=GAMMA)
    report = ctx.verdict("hf-prompt-lookup", [prompt_id], [candidate], time.perf_counter() - start)
    assert report.passed, str(report)


HF_MODEL_DRAFT_CASES = [
    pytest.param(device, dtype, kind, id=param_id(device, dtype, kind), marks=marks)
    for device, dtype, marks in settings(cpu=[(torch.float32, True), (torch.bfloat16, True)])
    for kind in ("self", "random", "early-exit", "draft-model")
]


@pytest.mark.parametrize("device,dtype,kind", HF_MODEL_DRAFT_CASES)
def test_hf_assisted_model_draft_greedy_identity(context, device, dtype, kind):
    ctx = context(DEFAULT_CHOICE, device, dtype)
    target = ctx.pair.target
    if kind == "early-exit":
        assist = {"assistant_early_exit": max(1, target.config.num_hidden_layers // 2)}
    elif kind == "self":
        assist = {"assistant_model": target}
    elif kind == "random":
        assist = {"assistant_model": models.random_init_like(target, seed=1)}
    elif ctx.pair.draft is None:
        pytest.skip("no draft model: pass --draft-model or set SPECVERIFY_DRAFT")
    else:
        assist = {"assistant_model": ctx.pair.draft}
    ctx.calibration()
    start = time.perf_counter()
    candidates = [hf_greedy(ctx, prompt_id, **assist) for prompt_id in ONE_PER_KIND]
    report = ctx.verdict(f"hf-{kind}", ONE_PER_KIND, candidates, time.perf_counter() - start)
    assert report.passed, str(report)


# --- the reference decoder ---------------------------------------------------------------------

def reference_cases():
    for device, dtype, marks in settings(cpu=[(torch.float32, False), (torch.bfloat16, False)]):
        for kind in ("prompt-lookup", "early-exit", "self", "random", "draft-model"):
            for batch_size in (1, 4) if device == "cpu" else (1, 4, 16):
                default = device == "cpu" and kind == "prompt-lookup" and (batch_size == 1 or dtype in EXACT)
                slow = [] if device == "cuda" or default else [pytest.mark.slow]
                yield pytest.param(device, dtype, kind, batch_size,
                                   id=param_id(device, dtype, kind, f"batch{batch_size}"),
                                   marks=marks + slow)


def batches_for(device: str, batch_size: int) -> list[list[str]]:
    """Prompt ids per call.  CPU: CPU_PROMPTS alone (batch 1), or CPU_BATCH_PROMPTS cycled to fill
    one batch.  CUDA: all eight prompts alone, in two batches of 4, in one batch of 16 (each twice)."""
    if device == "cpu":
        if batch_size == 1:
            return [[p] for p in CPU_PROMPTS]
        return [[CPU_BATCH_PROMPTS[i % len(CPU_BATCH_PROMPTS)] for i in range(batch_size)]]
    if batch_size == 1:
        return [[p] for p in PROMPTS]
    ids = list(PROMPTS) * (batch_size // len(PROMPTS) or 1)
    return [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]


@pytest.mark.parametrize("device,dtype,kind,batch_size", list(reference_cases()))
def test_reference_decoder_greedy_identity(context, device, dtype, kind, batch_size):
    ctx = context(DEFAULT_CHOICE, device, dtype)
    drafter = make_drafter(kind, ctx)
    batches = batches_for(device, batch_size)
    ctx.calibration()
    start = time.perf_counter()
    generations = [reference_greedy(ctx, drafter, batch) for batch in batches]
    seconds = time.perf_counter() - start
    rate = sum(acceptance_rate(g) for g in generations) / len(generations)
    report = ctx.verdict(f"reference-{kind}-batch{batch_size}", [p for b in batches for p in b],
                         [row for g in generations for row in g.tokens], seconds, acceptance=round(rate, 4))
    assert report.passed, str(report)
    if kind == "self":  # oracle: the target agrees with itself up to rounding
        assert rate >= (0.99 if dtype in EXACT else 0.9), f"self-draft acceptance {rate:.3f}; expected ~1"
    if kind == "random":  # oracle: a random model's argmax almost never matches the target's
        assert rate <= 0.1, f"random-draft acceptance {rate:.3f}; expected ~0"


# --- known-buggy decoders ----------------------------------------------------------------------

POWER_CASES = [
    pytest.param(device, dtype, prompts, tokens, id=param_id(device, dtype, f"{prompts}x{tokens}"), marks=marks)
    for device, dtype, marks, prompts, tokens in [
        ("cpu", torch.float32, [], 4, 32),
        ("cpu", torch.float32, [pytest.mark.slow], len(identity_power.POWER_PROMPTS), MAX_NEW_TOKENS),
    ] + [(device, dtype, marks, len(identity_power.POWER_PROMPTS), MAX_NEW_TOKENS) for device, dtype,
         marks in settings(cpu=[])]
]


@pytest.mark.parametrize("device,dtype,prompts,tokens", POWER_CASES)
def test_identity_catches_buggy_decoders(context, identity_log, device, dtype, prompts, tokens):
    """The lossless reference decoder passes and each planted bug (:mod:`gpu_tests.identity_power`)
    fails the whole-sequence identity check, over ``prompts`` prompts of ``tokens`` new tokens
    decoded in one batch.  (bfloat16/float16 on CPU: ``test_greedy_kernel_sets.py``.)"""
    ctx = context(DEFAULT_CHOICE, device, dtype)
    result = identity_power.identity_power(
        ctx.pair.target, ctx.pair.tokenizer, prompts=identity_power.POWER_PROMPTS[:prompts], max_new_tokens=tokens,
        float32_target=ctx.float32_target, log=identity_log)
    verdicts = {name: record["passed"] for name, record in result["decoders"].items()}
    assert verdicts == {name: name == "lossless" for name in identity_power.BUGS}, json.dumps(result, indent=1)


# --- the Qwen2.5-Coder pair (slow) -------------------------------------------------------------

QWEN_CASES = [
    pytest.param(device, dtype, decoder, id=param_id(device, dtype, decoder), marks=marks + [pytest.mark.slow])
    for device, dtype, marks in settings(cpu=[(torch.float32, True), (torch.bfloat16, True)],
                                         cuda=(torch.float16, torch.bfloat16))
    for decoder in ("hf-assistant", "reference")
]


@pytest.mark.parametrize("device,dtype,decoder", QWEN_CASES)
def test_qwen_coder_pair_greedy_identity(context, device, dtype, decoder):
    """Qwen2.5-Coder-1.5B-Instruct verified against drafts of Qwen2.5-Coder-0.5B-Instruct, on code
    and JSON prompts.  Runtime: 2-5 minutes per case on one CPU core (float32: identical, draft
    acceptance 0.84), seconds on a GPU."""
    ctx = context(QWEN_CHOICE, device, dtype)
    prompt_ids = ["code/0", "json/0"]
    ctx.calibration()
    start = time.perf_counter()
    if decoder == "hf-assistant":
        candidates = [hf_greedy(ctx, p, assistant_model=ctx.pair.draft) for p in prompt_ids]
        extra = {}
    else:
        generation = reference_greedy(ctx, ModelDrafter(ctx.pair.draft), prompt_ids)
        candidates, extra = list(generation.tokens), {"acceptance": round(acceptance_rate(generation), 4)}
    report = ctx.verdict(f"qwen-{decoder}", prompt_ids, candidates, time.perf_counter() - start, **extra)
    assert report.passed, str(report)
