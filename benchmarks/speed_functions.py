"""Correct SPEC §1 functions of known speeds for :mod:`benchmarks.planned_vs_actual`: the reference
rule behind a sleep that makes it slower at large vocabularies only (the shape of a kernel that
leaves its fast path above some V)."""

from __future__ import annotations

import time

import torch

from specverify.core.rules import verify as reference_verify

LARGE_FROM_VOCAB = 30_000
"""Vocabularies above this take the slow path."""

SLOW_S_PER_ENTRY = 3e-8
"""The slow path's extra seconds per probability entry: 10× the reference's ~3e-9."""


def slow_at_large_vocabulary(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                             generator: torch.Generator | None = None) -> torch.Tensor:
    """The reference rule, plus :data:`SLOW_S_PER_ENTRY` per entry read above :data:`LARGE_FROM_VOCAB`."""
    if target_probs.shape[-1] > LARGE_FROM_VOCAB:
        time.sleep(SLOW_S_PER_ENTRY * (target_probs.numel() + draft_probs.numel()))
    return reference_verify(target_probs, draft_probs, draft_tokens, generator)
