"""A SPEC §3 verify_tree that segfaults on its first call."""
import ctypes


def verify_tree(target_probs, draft_probs, tree_tokens, parents, generator):
    ctypes.string_at(0)
