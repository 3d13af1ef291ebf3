"""The committed tokens of a batch of requests: prompt plus every token emitted so far, per row.

Rows have different lengths (different prompts, different numbers of accepted drafts per step),
so the tokens live in one right-padded tensor ``tokens [B, capacity]`` with ``lengths [B]``; the
capacity doubles when a step would overflow it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class TokenSequences:
    """Right-padded token rows of different lengths, on one device."""

    def __init__(self, prompts: Sequence[torch.Tensor], device: torch.device) -> None:
        self.prompt_lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=device)
        self.lengths = self.prompt_lengths.clone()
        capacity = 2 * int(self.lengths.max())
        self.tokens = torch.zeros(len(prompts), capacity, dtype=torch.int64, device=device)
        for row, prompt in enumerate(prompts):
            self.tokens[row, : len(prompt)] = prompt.to(device)

    def tail(self, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens ``start[b]..lengths[b]-1`` of every row, left-aligned: ``(block [B, m], counts [B])``.

        ``m = max(counts)``; positions past a row's count hold token 0 (padding).
        """
        counts = self.lengths - start
        width = int(counts.max())
        offsets = torch.arange(width, device=self.tokens.device)
        index = (start[:, None] + offsets).clamp(max=self.tokens.shape[1] - 1)
        block = torch.where(offsets < counts[:, None], self.tokens.gather(1, index), 0)
        return block, counts

    def append(self, emitted: torch.Tensor, counts: torch.Tensor) -> None:
        """Append the first ``counts[b]`` tokens of ``emitted[b]`` to row b (``emitted [B, K+1]``, -1 padded)."""
        width = emitted.shape[1]
        needed = int(self.lengths.max()) + width
        if needed > self.tokens.shape[1]:
            grown = self.tokens.new_zeros(self.tokens.shape[0], 2 * needed)
            grown[:, : self.tokens.shape[1]] = self.tokens
            self.tokens = grown
        offsets = torch.arange(width, device=self.tokens.device)
        index = self.lengths[:, None] + offsets
        keep = offsets < counts[:, None]
        values = torch.where(keep, emitted, self.tokens.gather(1, index))
        self.tokens.scatter_(1, index, values)
        self.lengths = self.lengths + counts
