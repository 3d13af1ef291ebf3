"""Tokens per target pass of the reference tree decoder vs a chain of the same node count, on SmolLM2-135M.

CPU, fp32, greedy (temperature 0), deterministic children, ``--new-tokens`` tokens per prompt.
Drafters: ``lookup`` (default; :class:`reference.tree_decoder.PromptLookupTreeDrafter`, children = the
followers of the last n-gram's earlier occurrences) or ``early-exit`` (the target's first
``--draft-layers`` layers + its final norm and head, ``reference.drafters.truncated_view``).  Every shape must produce
the same tokens (greedy decoding is the target's own greedy output whatever the tree); the script checks that.

Run: PYTHONPATH=$PWD python3 benchmarks/tree_decoder_smollm2.py [--drafter lookup] [--prompts 0 1 2] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

from reference.drafters import truncated_view
from reference.tree_decoder import (
    ModelTreeDrafter,
    PromptLookupTreeDrafter,
    tree_speculative_generate,
)
from specverify.core.tree_exact import binary_shape, chain_shape, eagle_shape
from specverify.hf.packaged import DEFAULT_TARGET, load_causal_lm, load_tokenizer

PROMPTS = (
    ("def total(xs):\n    if not xs:\n        return 0\n    return xs[0] + total(xs[1:])\n\n"
     "Rewrite total with a loop instead of recursion:\n"),
    ('{"name": "Ada Lovelace", "born": 1815, "field": "mathematics"},\n{"name": "Alan Turing", "born": 1912, '
     '"field": "computer science"},\n{"name": "Grace Hopper", "born": 1906, '),
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
)


def shapes(num_nodes: int) -> dict[str, tuple[int, ...]]:
    result = {f"chain N={num_nodes}": chain_shape(num_nodes), f"binary N={num_nodes}": binary_shape(num_nodes)}
    if num_nodes == 6:
        result["eagle(2,3,1) N=6"] = eagle_shape(2, 3, 1)
        result["chain5+alt N=6"] = chain_shape(5) + (-1,)  # a 5-chain and a second candidate for the next token
        result["2 chains of 3"] = (-1, 0, 1, -1, 3, 4)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", choices=("lookup", "early-exit"), default="lookup")
    parser.add_argument("--draft-layers", type=int, default=10)
    parser.add_argument("--prompts", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--nodes", type=int, nargs="+", default=[6])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", nargs="+", default=None, help="names of the shapes to run (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_causal_lm(DEFAULT_TARGET, dtype=torch.float32)
    tokenizer = load_tokenizer(DEFAULT_TARGET)
    if args.drafter == "lookup":
        make_drafter, label = PromptLookupTreeDrafter, "prompt-lookup tree draft (max n-gram 3)"
    else:
        draft = truncated_view(target, args.draft_layers)
        make_drafter = functools.partial(ModelTreeDrafter, draft)
        label = f"early-exit draft ({args.draft_layers} of {target.config.num_hidden_layers} layers), top-k children"
    print(f"{DEFAULT_TARGET}, CPU fp32, greedy, {label}, {args.new_tokens} new tokens")
    for num_nodes in args.nodes:
        for prompt_index in args.prompts:
            text = PROMPTS[prompt_index]
            prompt = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.int64)
            outputs = {}
            for name, parents in shapes(num_nodes).items():
                if args.shapes and name not in args.shapes:
                    continue
                start = time.perf_counter()
                generation = tree_speculative_generate(target, make_drafter(), prompt, parents=parents,
                                                       max_new_tokens=args.new_tokens, temperature=0.0)
                seconds = time.perf_counter() - start
                outputs[name] = generation.tokens.tolist()
                s = generation.stats
                depth = ", ".join(f"{a:.2f}" for a in s.acceptance_by_depth)
                print(f"prompt {prompt_index} {name:17s}: tokens/pass {s.tokens_per_pass:.3f} "
                      f"({s.target_passes} target passes), P(accepted >= d) = [{depth}], {seconds:.1f} s, "
                      f"tokens hash {hash(tuple(outputs[name])) % 10**8}")
            assert len({tuple(tokens) for tokens in outputs.values()}) <= 1, "greedy outputs differ between shapes"


if __name__ == "__main__":
    main()
