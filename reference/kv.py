"""A KV cache for a batch of requests that advance by different numbers of tokens.

In speculative decoding every row of a batch accepts its own number of draft tokens per step, so
after one step the rows' sequences have different lengths.  This module keeps ONE Hugging Face
``DynamicCache`` for the whole batch and makes each row's computation independent of the others
with three pieces of bookkeeping:

- ``valid [B, S]`` (bool): which cache columns hold a token of row b's current sequence.  A token
  that is rolled back (a rejected draft) or that was only padding is marked invalid and becomes a
  *hole*; the 2-D attention mask passed to the model is exactly ``valid``, so no real token ever
  attends to a hole or to another row.
- ``lengths [B]``: the number of valid tokens of each row, which is also the position id of its
  next token.  Position ids are passed explicitly, so RoPE sees every row's true positions no
  matter how many holes lie before them.
- trailing columns that are holes in *every* row are cut off with ``DynamicCache.crop``.

New tokens arrive as a block ``[B, m]`` whose row b holds ``counts[b]`` real tokens at the *left*
followed by padding.  Padding is therefore always preceded by at least one real token of its row
(callers never append an empty row before the row has a valid token), so no query attends to
nothing and no NaN can enter the cache.  Each row's causal attention runs over its own valid
columns in order, which is the computation it would get alone: the result of row b never depends
on another row (up to floating-point summation order in batched kernels).

Cost: holes are kept, not compacted.  After a step where the rows keep ``k_b`` of ``m`` new
columns, the cache grows by ``max_b k_b`` columns, so row b carries ``max_b k_b - k_b`` holes:
attention and memory cost ``O(B * S)`` with ``S = sum over steps of max_b k_b`` (at most
``(γ + 1)`` columns per step) instead of each row's own length.  The alternative, one cache per row, avoids the
holes but runs B separate forward passes.  The column-as-time layout assumes full attention: a
sliding-window layer would count holes as positions.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from reference.drafters import MTPHead  # reference.drafters imports this module


class RaggedCache:
    """One model's KV cache for ``batch_size`` rows of different lengths (see the module docstring)."""

    def __init__(
        self, model: PreTrainedModel | MTPHead, batch_size: int, device: torch.device, *, keep_hidden: bool = False
    ) -> None:
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        self.lengths = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.keep_hidden = keep_hidden
        self.hidden: torch.Tensor | None = None  # with keep_hidden: the latest block's last hidden states [B, m, H]

    @torch.no_grad()
    def extend(
        self, tokens: torch.Tensor, counts: torch.Tensor, read_from: torch.Tensor | None = None, width: int = 1,
        **model_inputs: torch.Tensor,
    ) -> torch.Tensor:
        """Run the model on a block of new tokens and append their keys/values; return their logits.

        ``tokens [B, m]`` holds ``counts[b]`` real tokens of row b at its left and padding after them;
        the logits at padding columns are meaningless.  Row b's real token ``j`` gets position id
        ``lengths[b] + j`` and attends to the row's valid columns plus its own earlier block tokens.
        ``model_inputs``: further per-column inputs of the model's forward (an MTP head's
        ``previous_hidden [B, m, H]``).

        Returns every column's logits ``[B, m, V]``, or with ``read_from [B]`` only row b's columns
        ``read_from[b] .. read_from[b] + width - 1`` (``[B, width, V]``; columns past the block repeat
        its last).  Then the output head runs only from column ``min(read_from)`` on (Hugging Face's
        ``logits_to_keep``, where the model takes it): a prompt's other positions predict nothing.
        With ``keep_hidden``, :attr:`hidden` becomes the model's last hidden state at every column of
        the block, ``[B, m, H]`` (the last of ``output_hidden_states``: the input of the output head).
        """
        block_width = tokens.shape[1]
        offsets = torch.arange(block_width, device=tokens.device)
        new_valid = offsets < counts[:, None]
        attention_mask = torch.cat([self.valid, new_valid], dim=1)
        position_ids = self.lengths[:, None] + offsets
        skipped = 0 if read_from is None else int(read_from.min())
        keep = {"logits_to_keep": block_width - skipped} if skipped and self.keeps_logits else {}
        hidden = {"output_hidden_states": True} if self.keep_hidden else {}
        output = self.model(
            input_ids=tokens,
            attention_mask=attention_mask.to(torch.int64),
            position_ids=position_ids,
            cache=self.cache,
            use_cache=True,
            **keep,
            **hidden,
            **model_inputs,
        )
        self.valid = attention_mask
        self.lengths = self.lengths + counts
        if self.keep_hidden:
            self.hidden = output.hidden_states[-1]
        logits = output.logits[:, -(block_width - skipped):]  # [B, m - skipped, V]
        if read_from is None:
            return logits
        columns = (read_from[:, None] - skipped + torch.arange(width,
                                                               device=tokens.device)).clamp(max=logits.shape[1] - 1)
        return logits[torch.arange(tokens.shape[0], device=tokens.device)[:, None], columns]

    def forget(self, counts: torch.Tensor) -> None:
        """Roll back the last ``counts[b]`` tokens of each row b (rejected drafts, padding, a re-fed token).

        The forgotten columns become holes; trailing columns that are holes in every row are cropped.
        """
        valid_from_here = self.valid.flip(1).cumsum(1).flip(1)  # valid columns at or after each column
        self.valid = self.valid & (valid_from_here > counts[:, None])
        self.lengths = self.lengths - counts
        self._crop_trailing_holes()

    def _crop_trailing_holes(self) -> None:
        used_columns = self.valid.any(0)
        width = self.valid.shape[1]
        keep = int(used_columns.nonzero().max()) + 1 if bool(used_columns.any()) else 0
        if keep < width:
            self.cache.crop(keep - width)  # transformers 5.x: a negative argument removes that many columns
            self.valid = self.valid[:, :keep]
