"""A SPEC §3 verify_tree that ends the process on its first call."""
import os


def verify_tree(target_probs, draft_probs, tree_tokens, parents, generator):
    os._exit(0)
