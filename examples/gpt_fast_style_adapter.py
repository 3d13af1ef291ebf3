"""Adapter for a gpt-fast-style, single-sequence speculative step that uses the global RNG.

The first half stands in for the engine's code: one sequence at a time, draft tokens ``[k]``,
draft probabilities ``[k, V]`` and target probabilities ``[k+1, V]`` in, the accepted drafts plus
one new token out (a variable-length tensor), randomness from the *global* torch RNG.

The adapter loops over the batch's rows, pads each result with ``-1``, and, because the engine
cannot take a generator, runs it inside ``torch.random.fork_rng`` with the global RNG seeded from
the audit's generator: the output is then a function of the generator alone (the audit checks
this), and the caller's global RNG is left untouched.  Audit it with::

    specverify audit examples/gpt_fast_style_adapter.py:verify --budget quick
"""

import torch

# --------------------------------------------------------------------------------------------
# Engine side (stand-in)
# --------------------------------------------------------------------------------------------


def speculative_step(draft_tokens, draft_probs, target_probs):
    k = draft_tokens.shape[0]
    positions = torch.arange(k, device=draft_tokens.device)
    p = target_probs[positions, draft_tokens]
    q = draft_probs[positions, draft_tokens]
    rejected = (torch.rand(k, device=p.device) * q >= p).nonzero()
    if rejected.numel() == 0:
        next_token = torch.multinomial(target_probs[k], 1)
        return torch.cat([draft_tokens, next_token])
    n = int(rejected[0, 0])
    residual = (target_probs[n] - draft_probs[n]).clamp(min=0)
    next_token = torch.multinomial(residual / residual.sum(), 1)
    return torch.cat([draft_tokens[:n], next_token])


# --------------------------------------------------------------------------------------------
# Adapter: SPEC §1 verify(target_probs, draft_probs, draft_tokens, generator) -> emitted [B, K+1]
# --------------------------------------------------------------------------------------------


def verify(target_probs, draft_probs, draft_tokens, generator):
    batch, positions, _ = target_probs.shape
    emitted = torch.full((batch, positions), -1, dtype=torch.int64, device=target_probs.device)
    devices = [target_probs.device] if target_probs.device.type == "cuda" else []
    seeds = torch.randint(0, 2**62, (batch,), generator=generator, device=generator.device).tolist()
    with torch.random.fork_rng(devices=devices):
        for row in range(batch):
            torch.manual_seed(seeds[row])
            tokens = speculative_step(draft_tokens[row], draft_probs[row].double(), target_probs[row].double())
            emitted[row, : tokens.shape[0]] = tokens
    return emitted
