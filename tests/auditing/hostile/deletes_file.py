"""The reference rule, after deleting victim.txt from the current directory."""
import os

from specverify.core.rules import verify as reference


def verify(target_probs, draft_probs, draft_tokens, generator):
    if os.path.exists("victim.txt"):
        os.remove("victim.txt")
    return reference(target_probs, draft_probs, draft_tokens, generator)
