"""How the inputs of a call reach the function under audit: contiguous, or as strided views.

Engines rarely hand a verifier fresh contiguous tensors.  The target's probabilities are a slice
of a wider logits buffer (``probs[:, :K+1]`` of a buffer sized for the longest request, or the
first V columns of a vocabulary padded to a multiple of 128), the draft tokens a slice of a
token buffer.  A kernel that indexes its inputs with the strides of a contiguous tensor
(``row * V + token`` instead of ``row * stride(0) + token * stride(-1)``) is right on contiguous
inputs and wrong on every engine's.

``strided=True`` presents each input as the leading block of a wider buffer: every dimension but
the first gets one extra entry and the last :data:`STRIDE_PAD` more, so every stride but the
last differs from a contiguous tensor's and rows are not aligned to 128 entries.  The padding
holds a *decoy* of the right kind (:func:`decoy_value`): a uniform law in probability buffers,
the last token id in token buffers, ``-1`` in parent buffers.  A function that reads the padding
therefore computes with valid but wrong inputs and emits wrong tokens, which the statistical
checks see as a loss, instead of crashing on garbage.
"""

from __future__ import annotations

import torch

STRIDE_PAD = 67
"""Extra entries of the last dimension of a strided input's buffer (odd: rows are not 128-aligned)."""


def storage_shape(shape: tuple[int, ...], strided: bool) -> tuple[int, ...]:
    """The shape of the buffer an input of ``shape`` is a view of (``shape`` itself when contiguous)."""
    if not strided or len(shape) < 2:
        return tuple(shape)
    return (shape[0], *(size + 1 for size in shape[1:-1]), shape[-1] + STRIDE_PAD)


def view_of(storage: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The leading block of ``storage`` of the given ``shape`` (a view, sharing its memory)."""
    return storage[tuple(slice(0, size) for size in shape)]


def decoy_value(name: str, vocab_size: int) -> float | int:
    """What the padding of input ``name`` holds: a uniform law over the vocabulary in the
    probability inputs, the last token id in token inputs, ``-1`` (a child of the root) in parents."""
    if name.endswith("probs"):
        return 1.0 / vocab_size
    if name == "parents":
        return -1
    return vocab_size - 1


def fill_storage(storage: torch.Tensor, tensor: torch.Tensor, decoy: float | int) -> torch.Tensor:
    """Write ``tensor`` into the leading block of ``storage`` and ``decoy`` everywhere else; return the block."""
    storage.fill_(decoy)
    block = view_of(storage, tuple(tensor.shape))
    block.copy_(tensor)
    return block


def presented(tensor: torch.Tensor, *, device: torch.device, strided: bool, decoy: float | int) -> torch.Tensor:
    """A fresh copy of ``tensor`` on ``device``, contiguous or (``strided``) a view of a wider buffer."""
    if not strided or tensor.dim() < 2:
        return tensor.to(device, copy=True)
    storage = torch.empty(storage_shape(tuple(tensor.shape), True), dtype=tensor.dtype, device=device)
    return fill_storage(storage, tensor.to(device), decoy)
