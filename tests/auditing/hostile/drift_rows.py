"""Correct for its first 250,000 rows, then keeps every draft token (state that drifts)."""
import torch

from specverify.core.rules import verify as reference

ROWS = [0]


def verify(target_probs, draft_probs, draft_tokens, generator):
    ROWS[0] += draft_tokens.shape[0]
    if ROWS[0] <= 250_000:
        return reference(target_probs, draft_probs, draft_tokens, generator)
    bonus = torch.multinomial(target_probs[:, -1], 1, generator=generator)
    return torch.cat([draft_tokens, bonus], dim=1)
