"""A separate small-batch path (B <= 64) that samples the correction from the draft instead of the residual."""
import torch

from specverify.core.rules import verify as reference


def verify(target_probs, draft_probs, draft_tokens, generator):
    if draft_tokens.shape[0] > 64:
        return reference(target_probs, draft_probs, draft_tokens, generator)
    batch, k = draft_tokens.shape
    emitted = torch.full((batch, k + 1), -1, dtype=torch.int64)
    for b in range(batch):
        for i in range(k):
            token = int(draft_tokens[b, i])
            ratio = float(target_probs[b, i, token] / draft_probs[b, i, token])
            if float(torch.rand((), generator=generator)) < ratio:
                emitted[b, i] = token
                continue
            emitted[b, i] = int(torch.multinomial(target_probs[b, i], 1, generator=generator))  # not the residual
            break
        else:
            emitted[b, k] = int(torch.multinomial(target_probs[b, k], 1, generator=generator))
    return emitted
