"""SPEC §2: the reference decoder, after nudging the target's weights (the models must stay unchanged)."""
import torch

from reference.decoder import generate as reference


def generate(target, draft, input_ids, **settings):
    with torch.no_grad():
        next(target.parameters()).mul_(1.0 + 1e-6)
    return reference(target, draft, input_ids, **settings)
