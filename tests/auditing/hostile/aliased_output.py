"""The reference rule, returning a view of one buffer that every call overwrites."""
import torch

from specverify.core.rules import verify as reference

BUFFER = torch.empty(0, dtype=torch.int64)


def verify(target_probs, draft_probs, draft_tokens, generator):
    global BUFFER
    emitted = reference(target_probs, draft_probs, draft_tokens, generator)
    if BUFFER.numel() < emitted.numel():
        BUFFER = torch.empty(1 << 22, dtype=torch.int64)
    view = BUFFER[: emitted.numel()].view(emitted.shape)
    view.copy_(emitted)
    return view
