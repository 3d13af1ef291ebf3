"""The reference rule, after printing 100 MB on its first call."""
import sys

from specverify.core.rules import verify as reference

PRINTED = []


def verify(target_probs, draft_probs, draft_tokens, generator):
    if not PRINTED:
        PRINTED.append(True)
        print("hello from the function")
        sys.stdout.write(("x" * 1023 + "\n") * (100 * 1024))
        sys.stdout.flush()
    return reference(target_probs, draft_probs, draft_tokens, generator)
