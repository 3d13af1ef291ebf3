"""Tiny random Hugging Face causal LMs whose continuation law can be enumerated exactly.

A decoder-level exactness test needs a real ``transformers`` model (so that the decoder's KV
caches, attention masks and position ids are exercised) whose sampling law is nevertheless known
exactly.  With a vocabulary of 8–16 tokens every continuation of ``L = 2..3`` tokens can be
enumerated: ``V**(L-1)`` prefixes in one batched forward pass give every conditional law

    P(x_1 .. x_L | prompt) = prod_{i=1..L} p(x_i | prompt, x_1 .. x_{i-1}),

each ``p`` being the model's next-token law *after* temperature / top-k / top-p / min-p processing
by :func:`specverify.core.processing.process_logits` (the one function the decoders under test use), so
the result is the law that SPEC §2 requires a lossless decoder to sample from.

Public API (kept small; reused by the decoder-level audit):
- :func:`tiny_causal_lm` — one deterministic random ``LlamaForCausalLM`` (fp32, CPU);
- :func:`tiny_target_and_draft` — a 2-layer target and a *different*, correlated 1-layer draft;
- :func:`continuation_laws` — the processed next-token law after the prompt and every short prefix;
- :func:`continuation_distribution` — the exact law of the next ``length`` tokens after a prompt.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from specverify.core.processing import process_logits

# Rows per forward pass when enumerating prefixes (keeps peak memory small for V**(L-1) prefixes).
ENUMERATION_CHUNK = 4096


def tiny_causal_lm(
    *,
    vocab_size: int = 12,
    hidden_size: int = 16,
    num_layers: int = 1,
    num_heads: int = 2,
    seed: int = 0,
    logit_scale: float = 2.0,
    max_positions: int = 256,
) -> LlamaForCausalLM:
    """A deterministic random ``LlamaForCausalLM`` in fp32 on CPU, in eval mode.

    Weights are drawn from a ``torch.Generator`` seeded with ``seed`` (the global RNG is left
    untouched): embeddings ~ N(0, 1), every inner linear map ~ N(0, 1/fan_in) (activations keep
    unit scale), norms = 1, and the output head ~ N(0, logit_scale**2 / hidden_size) so that,
    after the final RMS norm, the logits have standard deviation about ``logit_scale``.  The
    default 2.0 gives peaked, context-dependent next-token laws (HF's own init, std 0.02, would
    give nearly uniform ones, under which many decoder bugs are invisible).  No BOS/EOS/pad ids:
    ``generate`` never stops early.
    """
    if not 2 <= vocab_size <= 4096:
        raise ValueError(f"vocab_size: expected 2..4096 (8–16 keeps enumeration cheap), got {vocab_size}")
    if hidden_size % num_heads or (hidden_size // num_heads) % 2:
        raise ValueError(
            f"hidden_size: must be a multiple of 2 * num_heads (even head dimension for RoPE), got "
            f"hidden_size={hidden_size}, num_heads={num_heads}"
        )
    if num_layers < 1:
        raise ValueError(f"num_layers: expected >= 1, got {num_layers}")
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):  # HF's own init draws from the global RNG; keep it untouched
        model = LlamaForCausalLM(config)
    _initialise(model, seed=seed, logit_scale=logit_scale)
    return model.eval()


def _initialise(model: LlamaForCausalLM, *, seed: int, logit_scale: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    hidden_size = model.config.hidden_size
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if "norm" in name:
                parameter.fill_(1.0)
            elif "embed_tokens" in name:
                parameter.normal_(0.0, 1.0, generator=generator)
            elif "lm_head" in name:
                parameter.normal_(0.0, logit_scale / math.sqrt(hidden_size), generator=generator)
            else:
                parameter.normal_(0.0, 1.0 / math.sqrt(parameter.shape[-1]), generator=generator)


def tiny_target_and_draft(
    *, vocab_size: int = 12, seed: int = 0, hidden_size: int = 16, draft_noise: float = 0.3, logit_scale: float = 2.0,
    draft_layers: int = 1,
) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """A 2-layer target and a different draft (1 layer by default) over the same vocabulary.

    The target has two layers so that early-exit self-drafting (its first layer plus its own head)
    is a genuine drafter.  The draft starts from the same seed (so it equals that early exit: the
    first layer, norm and head are drawn first) and then every weight ``w`` gets independent noise
    ``N(0, (draft_noise * std(w))**2)`` (seed ``seed + 1``): a separate model whose law overlaps the
    target's partly.  With the defaults the per-token acceptance ``sum_x min(p, q)`` is about 0.5
    at temperature 1 (0.65 without noise; an unrelated random draft would give about 0.25).
    ``logit_scale`` (both models, :func:`tiny_causal_lm`) sets how peaked their laws are;
    ``draft_layers = 2`` makes the draft the target itself plus the noise (acceptance about 0.95 at
    ``draft_noise = 0.05``).
    """
    target = tiny_causal_lm(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=2, seed=seed,
                            logit_scale=logit_scale)
    draft = tiny_causal_lm(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=draft_layers, seed=seed,
                           logit_scale=logit_scale)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in sorted(draft.named_parameters()):
            if "norm" not in name:
                noise = torch.randn(parameter.shape, generator=generator)
                parameter.add_(noise * draft_noise * parameter.std())
    return target, draft


@torch.no_grad()
def continuation_laws(
    model: PreTrainedModel,
    prompt: Sequence[int],
    length: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> list[np.ndarray]:
    """The model's processed next-token law after the prompt and every prefix of up to ``length - 1`` tokens.

    Returns ``laws`` with ``laws[i]`` a float64 array of shape ``(V,) * i + (V,)``:
    ``laws[i][x_1, .., x_i, :] = process_logits(logits after prompt + x_1 .. x_i)``.  One forward
    pass per ``ENUMERATION_CHUNK`` of the ``V**(length-1)`` longest prefixes gives every depth
    (causal attention: position ``i`` of a row only sees its first ``i`` suffix tokens).
    """
    if length < 1:
        raise ValueError(f"length: expected >= 1 continuation tokens, got {length}")
    if len(prompt) < 1:
        raise ValueError("prompt: expected at least one token")
    vocab_size = model.get_output_embeddings().weight.shape[0]
    device = next(model.parameters()).device
    prefixes = torch.tensor(list(itertools.product(range(vocab_size), repeat=length - 1)), dtype=torch.int64)
    prefixes = prefixes.reshape(vocab_size ** (length - 1), length - 1).to(device)
    prompt_tensor = torch.as_tensor(list(prompt), dtype=torch.int64, device=device)
    chunks = []
    for chunk in prefixes.split(ENUMERATION_CHUNK):
        input_ids = torch.cat([prompt_tensor.expand(len(chunk), -1), chunk], dim=1)
        logits = model(input_ids=input_ids).logits[:, len(prompt) - 1 :].to(torch.float64)  # [N, L, V]
        probs = process_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        probs = probs.to(torch.float64)
        chunks.append((probs / probs.sum(-1, keepdim=True)).cpu())  # exact normalisation after the float32 output
    all_probs = torch.cat(chunks).numpy().reshape((vocab_size,) * (length - 1) + (length, vocab_size))
    # laws[i] does not depend on x_{i+1} .. x_{L-1}: read it at x_{i+1} = .. = 0
    return [all_probs[(...,) + (0,) * (length - 1 - i) + (i, slice(None))] if i < length - 1 else all_probs[..., i, :]
            for i in range(length)]


def continuation_distribution(
    model: PreTrainedModel,
    prompt: Sequence[int],
    length: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> dict[tuple[int, ...], float]:
    """Exact law of the next ``length`` tokens sampled from ``model`` after ``prompt``.

    Returns ``{(x_1, ..., x_L): P(x_1 .. x_L | prompt)}`` over all ``V**L`` tuples (zeros
    included), float64, by the chain rule ``P = prod_i laws[i-1][x_1 .. x_{i-1}, x_i]`` over the
    processed laws of :func:`continuation_laws`.  ``temperature == 0`` gives the point mass on the
    greedy continuation.
    """
    laws = continuation_laws(model, prompt, length, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    joint = laws[0]
    for law in laws[1:]:
        joint = joint[..., None] * law
    return {key: float(joint[key]) for key in itertools.product(range(joint.shape[0]), repeat=length)}
