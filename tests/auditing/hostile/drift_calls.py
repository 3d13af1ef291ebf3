"""Correct for its first 200 calls, then keeps every draft token (state that drifts)."""
import torch

from specverify.core.rules import verify as reference

CALLS = [0]


def verify(target_probs, draft_probs, draft_tokens, generator):
    CALLS[0] += 1
    if CALLS[0] <= 200:
        return reference(target_probs, draft_probs, draft_tokens, generator)
    bonus = torch.multinomial(target_probs[:, -1], 1, generator=generator)
    return torch.cat([draft_tokens, bonus], dim=1)
