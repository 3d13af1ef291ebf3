"""Acceptance and tokens per target pass of the reference decoder's drafters, side by side.

    PYTHONPATH=. python scripts/drafter_acceptance.py [--smollm2] [--max-new-tokens 64] [--gamma 4]

Drafters: a draft model (tiny models only: the correlated 1-layer draft of
``specverify.hf.tiny_models.tiny_target_and_draft``), prompt lookup (``longest`` match), early exit
(the target's first layer(s) and its own head), and MTP (``MTPHead(target, seed=0)``: random own
weights, the target's embedding and LM head).  Models: the tiny fp32 target (V = 16, H = 32, two
layers) on 8 random prompts of 8 tokens; with ``--smollm2``, SmolLM2-135M-Instruct (fp32, CPU,
from ``specverify.hf.packaged``) on three chat prompts (a code edit, a JSON edit, a story).
Greedy and temperature 1; one batch per (model, temperature, drafter), request seeds from seed 0.

Prints a Markdown table: α₁ (acceptance of the first draft: accepted / verified at position 1),
accepted / verified drafts over all positions, tokens per target pass (emitted tokens / target
passes, the prefill pass included), and the passes.  Greedy rows are also checked against the
target's own greedy output (lossless: ``identical``).
"""

from __future__ import annotations

import argparse

import torch

from reference.decoder import speculative_generate
from reference.drafters import EarlyExitDrafter, ModelDrafter, MTPDrafter, MTPHead, PromptLookupDrafter
from reference.request_stats import RequestStats
from specverify.hf.tiny_models import tiny_target_and_draft

TINY_FIT_STEPS = 50
SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_EARLY_EXIT_LAYERS = 8
SMOLLM2_PROMPTS = (
    "Add type hints to this function and return the complete function only.\n\n```python\n"
    "def scale(values, factor):\n    result = []\n    for value in values:\n"
    "        result.append(value * factor)\n    return result\n```",
    'Rename the key "name" to "title" in this JSON and return the JSON only.\n\n'
    '{"name": "Widget", "price": 9.5, "tags": ["blue", "small"], "stock": {"name": "main", "count": 12}}',
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
)


def fitted_head(target: torch.nn.Module, *, steps: int, seed: int = 0) -> MTPHead:
    """``MTPHead(target, seed)`` fitted by self-distillation, as MTP heads are trained: on 128 of the
    target's own samples (temperature 1, 4 random prompt tokens + 20), Adam (lr 0.02) on the head's
    own weights minimises the mean over entries ``j`` of ``KL(p(· | x_{≤j+1}) ‖ q_j)``, the target's
    law of ``x_{j+2}`` against the head's from ``(h_j, x_{j+1})``."""
    generator = torch.Generator().manual_seed(seed)
    vocab = target.get_output_embeddings().weight.shape[0]
    with torch.no_grad():
        tokens = torch.randint(0, vocab, (128, 4), generator=generator)
        for _ in range(20):
            probs = torch.softmax(target(input_ids=tokens).logits[:, -1].double(), -1)
            tokens = torch.cat([tokens, torch.multinomial(probs, 1, generator=generator)], 1)
        output = target(input_ids=tokens, output_hidden_states=True)
        laws = torch.log_softmax(output.logits[:, 1:].float(), -1)  # law of x_{j+2}, entries j = 0..
        hidden = output.hidden_states[-1][:, :-1]
    head = MTPHead(target, seed=seed)
    optimizer = torch.optim.Adam([parameter for _, parameter in head.own_parameters()], lr=0.02)
    positions = torch.arange(tokens.shape[1] - 1)[None]
    for _ in range(steps):
        logits = head(input_ids=tokens[:, 1:], previous_hidden=hidden, attention_mask=torch.ones_like(tokens[:, 1:]),
                      position_ids=positions, cache=None, use_cache=False).logits
        loss = torch.nn.functional.kl_div(torch.log_softmax(logits, -1), laws, log_target=True, reduction="batchmean")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


def tiny_setup() -> tuple[torch.nn.Module, dict[str, object], list[torch.Tensor]]:
    """The tiny target, its drafters and 8 random prompts of 8 tokens."""
    target, draft = tiny_target_and_draft(vocab_size=16, hidden_size=32, seed=3)
    target.requires_grad_(False)
    fitted = fitted_head(target, steps=TINY_FIT_STEPS)
    drafters = {
        "draft model": lambda: ModelDrafter(draft),
        "prompt lookup": PromptLookupDrafter,
        "early exit (1 of 2 layers)": lambda: EarlyExitDrafter(target, num_layers=1),
        "MTP head (random)": lambda: MTPDrafter(MTPHead(target, seed=0)),
        f"MTP head (fitted, {TINY_FIT_STEPS} steps)": lambda: MTPDrafter(fitted),
    }
    prompts = list(torch.randint(0, 16, (8, 8), generator=torch.Generator().manual_seed(0)))
    return target, drafters, prompts


def smollm2_setup() -> tuple[torch.nn.Module, dict[str, object], list[torch.Tensor]]:
    """SmolLM2-135M-Instruct, its drafters (no smaller model of its family is packaged) and three chat prompts."""
    from specverify.hf.packaged import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(SMOLLM2)
    target = load_causal_lm(SMOLLM2)
    drafters = {
        "prompt lookup": PromptLookupDrafter,
        f"early exit ({SMOLLM2_EARLY_EXIT_LAYERS} of 30 layers)": lambda: EarlyExitDrafter(
            target, num_layers=SMOLLM2_EARLY_EXIT_LAYERS),
        "MTP head (random)": lambda: MTPDrafter(MTPHead(target, seed=0)),
    }
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)["input_ids"][0]
               for text in SMOLLM2_PROMPTS]
    return target, drafters, prompts


@torch.no_grad()
def target_greedy(target: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    output = target.generate(prompt[None], attention_mask=torch.ones_like(prompt[None]), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    return output[0, len(prompt):].tolist()


def table_row(model: str, temperature: float, drafter: str, stats: RequestStats, identical: str) -> str:
    accepted, verified = sum(stats.accepted_by_position), sum(stats.verified_by_position)
    first = f"{stats.acceptance_by_position[0]:.3f}" if stats.verified_by_position[0] else "—"
    rate = accepted / max(verified, 1)
    return (f"| {model} | {temperature:g} | {drafter} | {first} | {accepted}/{verified} = {rate:.3f} "
            f"| {stats.tokens_per_pass:.3f} | {stats.target_passes} | {identical} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", action="store_true", help="also measure SmolLM2-135M-Instruct")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    args = parser.parse_args()

    setups = {"tiny (V=16)": tiny_setup}
    if args.smollm2:
        setups["SmolLM2-135M"] = smollm2_setup
    print(f"γ = {args.gamma}, {args.max_new_tokens} new tokens per prompt")
    print("| model | T | drafter | α₁ | accepted/verified | tokens per pass | passes | greedy output |")
    print("|---|---|---|---|---|---|---|---|")
    for model, setup in setups.items():
        target, drafters, prompts = setup()
        greedy = [target_greedy(target, prompt, args.max_new_tokens) for prompt in prompts]
        for temperature in (0.0, 1.0):
            for name, make in drafters.items():
                generation = speculative_generate(target, make(), prompts, max_new_tokens=args.max_new_tokens,
                                                  gamma=args.gamma, temperature=temperature, seed=0)
                identical = "—"
                if temperature == 0:
                    same = all(generation.tokens[row].tolist() == tokens for row, tokens in enumerate(greedy))
                    identical = "identical" if same else "DIFFERS"
                print(table_row(model, temperature, name, generation.stats.pooled(), identical), flush=True)


if __name__ == "__main__":
    main()
