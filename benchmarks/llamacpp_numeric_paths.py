"""Where llama-cpp-python's speculative logprobs come from, and how far its numeric paths are apart.

Run: ``PYTHONPATH=$PWD python3 benchmarks/llamacpp_numeric_paths.py`` (needs the ``[server]`` extra
and the packaged SmolLM2-135M-Instruct Q4_1 GGUF; ~2 min on 2 cores).  In process, no server, one
thread, the five greedy prompts of the endpoint level, 48 greedy tokens each:

1. **Replay.**  A ``Llama`` with ``LlamaPromptLookupDecoding(num_pred_tokens=4)`` (the candidate
   the endpoint tests serve) generates greedily; every ``eval`` call it makes (n_past, tokens:
   the verify passes, rejected drafts included) is replayed on a second ``Llama`` *without* a
   draft model.  llama-cpp-python returns logprobs as the log-softmax of its ``scores`` rows
   (``Llama.logits_to_logprobs(self._scores[...])`` in ``create_completion``), so if the replayed
   rows equal the candidate's bit for bit, the candidate's logprobs are the baseline model's own,
   evaluated in the candidate's batch shapes, and nothing else.
2. **Paths.**  The baseline's greedy text is re-evaluated in several batch shapes and each is
   compared, on the reference's top two tokens per position, with the GGUF's dequantised float32
   law (``specverify.hf.packaged``, the same weights in plain PyTorch): the decode path (prompt
   prefill, then 1-token steps), all 1-token steps, 5-token batches (a verify pass of K = 4),
   one prefill of the whole text (what ``echo`` does), 31- and 32-token batches.
"""

from __future__ import annotations

import numpy as np
import torch

from specverify.auditing.endpoint.battery import PROMPTS
from specverify.hf.packaged import load_causal_lm
from specverify.testing.llama_servers import smollm2_gguf

TOKENS = 48
DRAFT = 4


def _logprobs(llm, count: int) -> np.ndarray:
    scores = llm.scores[:count].astype(np.float64)
    return scores - np.logaddexp.reduce(scores, axis=1, keepdims=True)


def _top_two_deviation(rows: np.ndarray, reference: np.ndarray) -> np.ndarray:
    top = np.argsort(-reference, axis=1)[:, :2]
    picked = np.take_along_axis(rows, top, 1) - np.take_along_axis(reference, top, 1)
    return np.abs(picked).max(axis=1)


def _evaluate(llm, ids: list[int], chunks: list[int]) -> np.ndarray:
    llm.reset()
    start = 0
    for size in chunks:
        if start >= len(ids):
            break
        type(llm).eval(llm, ids[start:start + size])
        start += size
    return _logprobs(llm, len(ids))


def main() -> None:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    options = dict(model_path=str(smollm2_gguf()), n_ctx=2048, n_threads=1, n_threads_batch=1, verbose=False,
                   logits_all=True)
    baseline = Llama(**options)
    candidate = Llama(**options, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=DRAFT))
    calls: list[tuple[int, list[int]]] = []
    evaluate = Llama.eval

    def logged(self, tokens):  # record the candidate's eval calls
        if self is candidate:
            calls.append((self.n_tokens, list(tokens)))
        return evaluate(self, tokens)

    Llama.eval = logged
    reference_model = load_causal_lm("smollm2-135m-instruct", dtype=torch.float32, device="cpu")
    sizes: dict[int, int] = {}
    paths: dict[str, list[np.ndarray]] = {}
    print("1. candidate (prompt lookup, K = 4) vs the same eval calls replayed on the baseline model")
    for prompt in PROMPTS:
        calls.clear()
        candidate.reset()
        ids = candidate.tokenize(prompt.text.encode())
        out = []
        for token in candidate.generate(ids, temp=0.0, repeat_penalty=1.0, reset=False):
            out.append(token)
            if len(out) == TOKENS:
                break
        count = len(ids) + len(out) - 1
        own = _logprobs(candidate, count)
        baseline.reset()
        for n_past, tokens in calls:
            baseline.n_tokens = n_past
            evaluate(baseline, tokens)
        replayed = _logprobs(baseline, count)
        for _, tokens in calls[1:]:
            sizes[len(tokens)] = sizes.get(len(tokens), 0) + 1
        print(f"   {prompt.kind:10s} prompt {len(ids):2d} tokens, {len(calls):2d} eval calls: max |Δ logprob| over "
              f"{count} rows × {own.shape[1]} tokens = {np.abs(own - replayed).max():.3g}")
        baseline.reset()
        generated = []
        for token in baseline.generate(ids, temp=0.0, repeat_penalty=1.0, reset=False):
            generated.append(token)
            if len(generated) == TOKENS:
                break
        text = ids + generated
        with torch.no_grad():
            exact = torch.log_softmax(reference_model(torch.tensor([text])).logits[0].double(), -1).numpy()
        rows = slice(len(ids) - 1, len(text) - 1)
        shapes = {"decode: prompt prefill, then 1-token steps (the baseline)": [len(ids)] + [1] * TOKENS,
                  "1-token steps throughout": [1] * len(text),
                  "5-token batches (a verify pass, K = 4)": [5] * len(text),
                  "one prefill of the whole text (echo)": [len(text)],
                  "31-token batches": [31] * len(text),
                  "32-token batches": [32] * len(text)}
        for name, chunks in shapes.items():
            paths.setdefault(name, []).append(_top_two_deviation(_evaluate(baseline, text, chunks)[rows], exact[rows]))
    print(f"   verify-pass sizes (tokens per eval call after the prompt): {dict(sorted(sizes.items()))}")
    print("2. |Δ logprob| against the dequantised float32 model, top two tokens per position, 5 prompts × 48 tokens")
    for name, values in paths.items():
        d = np.concatenate(values)
        print(f"   {name:58s} median {np.median(d):.3f}  Q0.9 {np.quantile(d, 0.9):.3f}  max {d.max():.3f}")


if __name__ == "__main__":
    main()
