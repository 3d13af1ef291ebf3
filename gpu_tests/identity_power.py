"""The greedy identity check against known-buggy decoders: does it catch them, on many prompts?

Decoders (the reference decoder, ``reference.decoder.speculative_generate`` with prompt-lookup
drafts, γ = 4, greedy; each bug planted by patching one of its steps):

- ``lossless``: unchanged; must pass;
- ``accept-every-draft``: the verifier emits every draft unchecked, then the target's argmax;
- ``position-shift``: the target's logits are read one position late (``read_from`` off by one),
  so draft ``i`` is checked against the law after it instead of the law before it;
- ``stale-kv``: after a rejection the target's cache forgets the rejected drafts except the first,
  whose key/value stays visible to every later token (the roll-back misses one entry).

:func:`identity_power` decodes all prompts in one batch per decoder and judges each with
:func:`specverify.hf.divergence.check_identity`.  Run as a script
(``python -m gpu_tests.identity_power --dtype bfloat16 ...``) it prints one JSON object: the
kernel-set tests of ``test_greedy_kernel_sets.py`` run it under each ``ATEN_CPU_CAPABILITY``,
because torch picks its CPU kernels once, at import.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

import reference.decoder
from reference.drafters import Draft, PromptLookupDrafter
from reference.kv import RaggedCache
from reference.sequences import TokenSequences
from specverify.core.processing import SamplingParams
from specverify.core.rules import VerifyResult
from specverify.hf import divergence
from specverify.testing.kernel_sets import kernel_set_limitation

GAMMA = 4

POWER_PROMPTS: tuple[str, ...] = (
    "Rewrite this function to use a loop instead of recursion:\n\n"
    "def total(xs):\n    if not xs:\n        return 0\n    return xs[0] + total(xs[1:])\n\nRewritten:\n",
    "def fibonacci(n):\n",
    '{"name": "Ada Lovelace", "born": 1815, "languages": [',
    'Fix the spelling and repeat the sentence: "The quick brwon fox jumsp over the lazy dgo."\nFixed:',
    "import json\n\ndef load_config(path):\n",
    'Convert to JSON with keys "city" and "population".\nParis, 2102650\nJSON:',
    "The old lighthouse keeper",
    "Once upon a time in a small village,",
    "List the planets of the solar system, one per line:\n1. Mercury\n2.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "Q: What is the capital of France?\nA: Paris.\nQ: What is the capital of Italy?\nA:",
    "SELECT name, email FROM users WHERE",
    "Translate to French: Good morning, how are you?\nFrench:",
    "<html>\n  <head>\n    <title>My page</title>\n  </head>\n  <body>\n",
    "Steps to make tea:\n1. Boil water.\n2.",
    "for i in range(10):\n    if i % 2 == 0:\n",
)
"""Code, JSON, edits, prose, lists: text that makes prompt-lookup drafts fire (and get rejected)."""


def accept_every_draft(target_probs: torch.Tensor, draft: Draft, params: SamplingParams,
                       generator: Any) -> VerifyResult:
    """Buggy verifier: emits every draft unchecked, then the target's argmax at the next position."""
    batch, width = draft.tokens.shape
    positions = torch.arange(width + 1, device=draft.tokens.device)
    rows = torch.arange(batch, device=draft.tokens.device)
    emitted = torch.full((batch, width + 1), -1, dtype=torch.int64, device=draft.tokens.device)
    emitted[:, :width] = torch.where(positions[:width] < draft.num_draft[:, None], draft.tokens, -1)
    emitted[rows, draft.num_draft] = target_probs[rows, draft.num_draft].argmax(-1)
    return VerifyResult(emitted, draft.num_draft.clone())


def score_drafts_one_late(target_kv: RaggedCache, sequences: TokenSequences, draft: Draft,
                          params: SamplingParams) -> torch.Tensor:
    """Buggy scoring: :func:`reference.decoder.score_drafts` with the logits read one column late."""
    unseen, unseen_counts = sequences.tail(target_kv.lengths)
    block, counts = reference.decoder.concat_rows(unseen, unseen_counts, draft.tokens, draft.num_draft)
    logits = target_kv.extend(block, counts, read_from=unseen_counts, width=draft.tokens.shape[1] + 1)
    return params.apply(logits.float())


class StaleEntryCache(RaggedCache):
    """Buggy cache: :meth:`forget` rolls the positions back but leaves the first forgotten entry
    (the first rejected draft) visible to attention."""

    def forget(self, counts: torch.Tensor) -> None:
        valid_from_here = self.valid.flip(1).cumsum(1).flip(1)
        stale = self.valid & (valid_from_here == counts[:, None]) & (counts[:, None] > 0)
        self.valid = (self.valid & (valid_from_here > counts[:, None])) | stale
        self.lengths = self.lengths - counts
        self._crop_trailing_holes()


BUGS: dict[str, dict[str, Any]] = {
    "lossless": {},
    "accept-every-draft": {"verify": accept_every_draft},
    "position-shift": {"score_drafts": score_drafts_one_late},
    "stale-kv": {"RaggedCache": StaleEntryCache},
}
"""Decoder name -> the ``reference.decoder`` attributes it replaces."""


@contextlib.contextmanager
def planted(name: str) -> Iterator[None]:
    """``reference.decoder`` with decoder ``name``'s bug planted for the duration of the block."""
    patch = BUGS[name]
    saved = {attribute: getattr(reference.decoder, attribute) for attribute in patch}
    for attribute, value in patch.items():
        setattr(reference.decoder, attribute, value)
    try:
        yield
    finally:
        for attribute, value in saved.items():
            setattr(reference.decoder, attribute, value)


def identity_power(
    target: Any,
    tokenizer: Any,
    *,
    prompts: Sequence[str],
    max_new_tokens: int,
    decoders: Sequence[str] = tuple(BUGS),
    float32_target: Any | None = None,
    log: Callable[[dict[str, Any]], None] = lambda record: None,
) -> dict[str, Any]:
    """Each decoder in ``decoders`` on all ``prompts`` (one batch), judged by whole-sequence greedy
    identity; float16/bfloat16 targets are calibrated first (plain greedy in one batch of all
    prompts, teacher-forced in the dtype and by ``float32_target``).  Returns the calibration and
    one record per decoder (verdict, positions compared, exceedances, each reference's counts)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(target.parameters()).device
    encoded = [tokenizer(text, return_tensors="pt").input_ids[0].to(device) for text in prompts]
    exact = target.dtype in divergence.EXACT_DTYPES
    start = time.perf_counter()
    calibration = None if exact else divergence.calibrate(
        target, encoded, max_new_tokens=max_new_tokens, batch_sizes=(len(encoded),), float32_model=float32_target,
        pad_token_id=pad)
    out: dict[str, Any] = {"dtype": divergence.dtype_name(target.dtype),
                           "capability": torch.backends.cpu.get_cpu_capability(),
                           "prompts": len(prompts), "max_new_tokens": max_new_tokens,
                           "calibration": None if calibration is None else calibration.summary(),
                           "calibration_s": round(time.perf_counter() - start, 1), "decoders": {}}
    for name in decoders:
        start = time.perf_counter()
        with planted(name):
            generation = reference.decoder.speculative_generate(target, PromptLookupDrafter(), encoded,
                                                                max_new_tokens=max_new_tokens, gamma=GAMMA,
                                                                temperature=0.0)
        report = divergence.check_identity(target, encoded, list(generation.tokens), calibration=calibration,
                                           float32_model=None if exact else float32_target,
                                           labels=[f"prompt{i}" for i in range(len(prompts))])
        record = {"passed": report.passed, "positions": report.positions, "exceedances": report.exceedances,
                  "references": [{"reference": r.reference, "tolerance": r.tolerance,
                                  "exceedances": len(r.exceedances), "divergent": r.divergent,
                                  "noise_divergent": r.noise_divergent,
                                  "noise_positions": r.noise_positions, "pvalue": r.pvalue,
                                  "explainable_fraction": r.explainable_fraction} for r in report.results],
                  "seconds": round(time.perf_counter() - start, 1), "report": str(report)}
        out["decoders"][name] = record
        log({"decoder": name, "dtype": out["dtype"], "capability": out["capability"], **record})
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Script entry: load the target in ``--dtype`` (and float32), run :func:`identity_power`, print JSON."""
    from specverify.hf import packaged

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="target spec (default: packaged SmolLM2)")
    parser.add_argument("--capability", default=None,
                        help="the ATEN_CPU_CAPABILITY expected (default, avx2, avx512): if torch picked another "
                             "(the CPU lacks it), print {\"unsupported\": reason} and stop")
    parser.add_argument("--dtype", required=True, choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--prompts", type=int, default=4, help="the first N of POWER_PROMPTS")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per prompt")
    parser.add_argument("--decoders", nargs="+", default=list(BUGS), choices=list(BUGS))
    args = parser.parse_args(argv)
    picked = torch.backends.cpu.get_cpu_capability()
    if args.capability is not None and picked.lower() != args.capability.lower():
        print(json.dumps({"unsupported": f"ATEN_CPU_CAPABILITY={args.capability} is not available on this CPU "
                                         f"(torch picked {picked})"}))
        return
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    limitation = kernel_set_limitation(dtype)
    if limitation is not None:
        print(json.dumps({"unsupported": f"ATEN_CPU_CAPABILITY={picked}: torch cannot run {args.dtype} attention "
                                         f"and matmul with these kernels on this CPU ({limitation})"}))
        return
    pair = packaged.load_model_pair(args.target, dtype=dtype)
    float32_target = None if dtype in divergence.EXACT_DTYPES else packaged.load_causal_lm(pair.target_spec)
    result = identity_power(pair.target, pair.tokenizer, prompts=POWER_PROMPTS[: args.prompts],
                            max_new_tokens=args.tokens, decoders=args.decoders, float32_target=float32_target)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
