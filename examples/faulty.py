"""Adapters that break the SPEC §1 contract in one way each, for the audit's fault handling.

Each is the reference rule plus one fault.  ``specverify audit`` reports every one of them and
never calls them lossless::

    specverify audit examples/faulty.py:raises          # exit 2: exception
    specverify audit examples/faulty.py:hangs --timeout 2  # exit 2: per-call timeout
    specverify audit examples/faulty.py:nan_ids         # exit 2: malformed output
    specverify audit examples/faulty.py:mutates_inputs  # exit 1: modifies its inputs
    specverify audit examples/faulty.py:global_rng      # exit 1: ignores the generator
"""

import time

import torch

from specverify.core.rules import verify as reference


def raises(target_probs, draft_probs, draft_tokens, generator):
    raise RuntimeError("CUDA kernel not compiled for this architecture")


def hangs(target_probs, draft_probs, draft_tokens, generator):
    time.sleep(3600)


def nan_ids(target_probs, draft_probs, draft_tokens, generator):
    emitted = reference(target_probs, draft_probs, draft_tokens, generator).double()
    emitted[0, 0] = float("nan")
    return emitted


def wrong_shape(target_probs, draft_probs, draft_tokens, generator):
    return reference(target_probs, draft_probs, draft_tokens, generator)[:, :-1]


def wrong_dtype(target_probs, draft_probs, draft_tokens, generator):
    return reference(target_probs, draft_probs, draft_tokens, generator).int()


def out_of_range(target_probs, draft_probs, draft_tokens, generator):
    emitted = reference(target_probs, draft_probs, draft_tokens, generator)
    return torch.where(emitted >= 0, emitted + target_probs.shape[-1], emitted)


def token_after_padding(target_probs, draft_probs, draft_tokens, generator):
    """Writes a token into the last slot of rows that stopped early, after their -1 padding."""
    emitted = reference(target_probs, draft_probs, draft_tokens, generator)
    emitted[:, -1] = torch.where(emitted[:, -2] < 0, 0, emitted[:, -1])
    return emitted


def non_draft_accepted(target_probs, draft_probs, draft_tokens, generator):
    """Emits the correction token after a wrongly 'accepted' first slot."""
    emitted = reference(target_probs, draft_probs, draft_tokens, generator)
    emitted[:, 0] = (draft_tokens[:, 0] + 1) % target_probs.shape[-1]
    emitted[:, 1] = 0
    emitted[:, 2:] = -1
    return emitted


def reads_other_rows_drafts(target_probs, draft_probs, draft_tokens, generator):
    """Verifies every row against the next row's draft tokens (a batch-index bug): well-formed
    output whose accepted slots hold other requests' tokens."""
    return reference(target_probs, draft_probs, draft_tokens.roll(1, dims=0), generator)


def emits_forbidden_token(target_probs, draft_probs, draft_tokens, generator):
    """Replaces every correction-or-bonus token by the target's least likely token, often of
    probability 0 (tests forbid tokens on purpose)."""
    emitted = reference(target_probs, draft_probs, draft_tokens, generator)
    lengths = (emitted >= 0).sum(dim=-1)
    final = target_probs[torch.arange(len(emitted)), lengths - 1].argmin(dim=-1)
    emitted[torch.arange(len(emitted)), lengths - 1] = final
    return emitted


def mutates_inputs(target_probs, draft_probs, draft_tokens, generator):
    """Correct output, but reuses the draft-token buffer afterwards (engines share these buffers)."""
    emitted = reference(target_probs, draft_probs, draft_tokens, generator)
    draft_tokens.zero_()
    return emitted


def global_rng(target_probs, draft_probs, draft_tokens, generator):
    """Correct law, but draws its uniforms from the global torch RNG instead of ``generator``."""
    batch, positions, _ = target_probs.shape
    uniforms = torch.rand(batch, positions, dtype=torch.float64, device=target_probs.device)
    return reference(target_probs, draft_probs, draft_tokens, uniforms=uniforms)
