"""Adapter for an engine whose sampler has a vLLM-style signature (logits, flattened drafts, metadata).

The first half of this file stands in for the engine's code: a rejection sampler that takes the
target's *logits* for the draft positions flattened over requests, per-request draft counts, the
bonus tokens already sampled by the engine's main sampler, and per-request generators, and returns
``[num_requests, max_drafts + 1]`` with ``-1`` placeholders.  (It is written for this example; in
practice you would import the engine's own sampler.)

The second half is the adapter: a SPEC §1 ``verify`` that converts the audit's inputs into the
engine's and back.  Audit it with::

    specverify audit examples/vllm_style_adapter.py:verify
"""

from dataclasses import dataclass

import torch

PLACEHOLDER = -1


# --------------------------------------------------------------------------------------------
# Engine side (stand-in)
# --------------------------------------------------------------------------------------------


@dataclass
class SpecDecodeMetadata:
    draft_token_ids: torch.Tensor   # int64 [num_tokens]: every request's draft tokens, concatenated
    num_draft_tokens: list[int]     # drafts per request


def engine_rejection_sample(metadata, draft_probs, target_logits, bonus_token_ids, generators):
    """draft_probs [num_tokens, V], target_logits [num_tokens, V], bonus_token_ids [num_requests, 1],
    generators {request index: torch.Generator}."""
    target_probs = torch.softmax(target_logits.float(), dim=-1)
    max_drafts = max(metadata.num_draft_tokens)
    output = torch.full((len(metadata.num_draft_tokens), max_drafts + 1), PLACEHOLDER, dtype=torch.int64,
                        device=target_logits.device)
    start = 0
    for request, count in enumerate(metadata.num_draft_tokens):
        generator = generators.get(request)
        tokens = metadata.draft_token_ids[start:start + count]
        p = target_probs[start:start + count]
        q = draft_probs[start:start + count]
        rows = torch.arange(count, device=p.device)
        uniform = torch.rand(count, generator=generator, device=p.device)
        accepted = uniform < p[rows, tokens] / q[rows, tokens]
        num_accepted = int(accepted.long().cumprod(dim=0).sum())
        output[request, :num_accepted] = tokens[:num_accepted]
        if num_accepted == count:
            output[request, count] = bonus_token_ids[request, 0]
        else:
            # Recovered token ∝ max(0, p − q), drawn by an exponential race: argmax(residual / E), E ~ Exp(1).
            residual = (p[num_accepted] - q[num_accepted]).clamp(min=0)
            race = torch.empty_like(residual).exponential_(generator=generator)
            output[request, num_accepted] = torch.argmax(residual / race)
        start += count
    return output


# --------------------------------------------------------------------------------------------
# Adapter: SPEC §1 verify(target_probs, draft_probs, draft_tokens, generator) -> emitted [B, K+1]
# --------------------------------------------------------------------------------------------


def verify(target_probs, draft_probs, draft_tokens, generator):
    batch, positions, vocab = target_probs.shape
    num_draft = positions - 1
    # The engine samples the bonus token with its main sampler from the bonus position's law.
    bonus = torch.multinomial(target_probs[:, num_draft].float(), 1, generator=generator)
    metadata = SpecDecodeMetadata(draft_tokens.reshape(-1), [num_draft] * batch)
    # Probabilities -> logits: log p (−inf where p = 0); the engine's softmax recovers p exactly in law.
    target_logits = torch.log(target_probs[:, :num_draft].reshape(-1, vocab).float())
    emitted = engine_rejection_sample(metadata, draft_probs.reshape(-1, vocab).float(), target_logits, bonus,
                                      {row: generator for row in range(batch)})
    return emitted
