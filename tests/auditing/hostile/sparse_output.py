"""Returns its output in a sparse layout."""
from specverify.core.rules import verify as reference


def verify(target_probs, draft_probs, draft_tokens, generator):
    return reference(target_probs, draft_probs, draft_tokens, generator).to_sparse()
