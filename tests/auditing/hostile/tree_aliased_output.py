"""A lossless SPEC §3 verify_tree whose output is a view of a buffer it overwrites on its next call."""
import torch

from specverify.core.tree_rules import verify_tree as reference

draft_schemes = ("independent",)
_buffer = torch.empty(0, 0, dtype=torch.int64)


def verify_tree(target_probs, draft_probs, tree_tokens, parents, generator):
    global _buffer
    emitted = reference(target_probs, draft_probs, tree_tokens, parents, generator)
    if _buffer.shape[0] < emitted.shape[0] or _buffer.shape[1] != emitted.shape[1]:
        _buffer = torch.empty(max(emitted.shape[0], 1 << 16), emitted.shape[1], dtype=torch.int64)
    view = _buffer[: emitted.shape[0]]
    view.copy_(emitted)
    return view
