"""The reference rule, after changing the torch default dtype, the torch thread count and numpy's error state."""
import numpy as np
import torch

from specverify.core.rules import verify as reference


def verify(target_probs, draft_probs, draft_tokens, generator):
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    np.seterr(all="raise")
    return reference(target_probs, draft_probs, draft_tokens, generator)
