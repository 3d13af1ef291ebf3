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

Storages are kept across calls (:class:`Presenter`): an input that is the very tensor a storage
already holds, in a storage the last call left exactly as presented (block and padding, bit for
bit), is not written again, and a new input of the same shape is written into the block only.
A law expanded over a call's rows is then copied into the function's buffer once per shape, and
each call costs the function's own reads plus one comparison, which the mutation check needs
anyway.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
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


def padding_of(storage: torch.Tensor, shape: tuple[int, ...]) -> list[torch.Tensor]:
    """The entries of ``storage`` outside its leading block of ``shape``, as disjoint views: for each
    dimension ``d ≥ 1`` that ``storage`` widens, the entries at index ``≥ shape[d]`` in ``d`` and
    inside the block in dimensions ``1..d−1`` (every later dimension whole)."""
    parts = []
    for d in range(1, storage.dim()):
        if storage.shape[d] > shape[d]:
            inside = tuple(slice(0, size) for size in shape[1:d])
            parts.append(storage[(slice(None), *inside, slice(shape[d], None))])
    return parts


def fill_storage(storage: torch.Tensor, tensor: torch.Tensor, decoy: float | int) -> torch.Tensor:
    """Write ``tensor`` into the leading block of ``storage`` and ``decoy`` everywhere else; return the block."""
    for part in padding_of(storage, tuple(tensor.shape)):
        part.fill_(decoy)
    block = view_of(storage, tuple(tensor.shape))
    block.copy_(tensor)
    return block


_COMPARED_ELEMENTS = 1 << 18
"""Entries compared per step of :func:`same_bits` (its temporary stays in cache)."""

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(tensor: torch.Tensor) -> np.ndarray:
    """The CPU tensor's entries as integers of its element size (a view: no copy, strides kept)."""
    return tensor.view(_BITS[tensor.element_size()]).numpy()


MEMCMP_ROW_BYTES = 1 << 14
"""Rows at least this long (bytes, contiguous in both tensors) are compared with the C library's
``memcmp`` one row at a time, at memory bandwidth; shorter ones in numpy steps, where a call per
row would cost more than the comparison."""


@functools.cache
def _memcmp() -> Callable[[int, int, int], int] | None:
    """The C library's ``memcmp`` (None where ctypes cannot load it)."""
    try:
        function = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, TypeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return function


def _same_rows(tensor: torch.Tensor, other: torch.Tensor) -> bool | None:
    """Whether ``tensor`` and ``other`` hold the same bytes, compared row by row (rows of the last
    dimension, contiguous in both, any other strides including 0) with ``memcmp``; None when the
    rows are not contiguous, or ``memcmp`` is not available."""
    compare = _memcmp()
    if (compare is None or tensor.stride(-1) != 1 or other.stride(-1) != 1 or tensor.dtype != other.dtype
            or tensor.shape != other.shape):
        return None
    row_bytes = tensor.shape[-1] * tensor.element_size()
    for left, right in zip(_row_addresses(tensor), _row_addresses(other)):
        if compare(left, right, row_bytes):
            return False
    return True


def _row_addresses(tensor: torch.Tensor) -> list[int]:
    """The address of every row of the last dimension, in index order."""
    addresses = np.zeros((), dtype=np.int64)
    for extent, stride in zip(tensor.shape[:-1], tensor.stride()[:-1]):
        addresses = addresses[..., None] + np.arange(extent, dtype=np.int64) * (stride * tensor.element_size())
    return (addresses.reshape(-1) + tensor.data_ptr()).tolist()


def same_bits(tensor: torch.Tensor, other: torch.Tensor | float | int) -> bool:
    """Whether every entry of the CPU tensor ``tensor`` has the bits of ``other``'s entry (a tensor
    of the same shape and dtype, broadcast views included) or of the scalar ``other`` in
    ``tensor``'s dtype; long contiguous rows compared with ``memcmp`` (:func:`_same_rows`), the
    rest in steps of whole leading-dimension slices."""
    if tensor.numel() == 0:
        return True
    if tensor.dim() and tensor.shape[-1] * tensor.element_size() >= MEMCMP_ROW_BYTES:
        if not isinstance(other, torch.Tensor):  # the scalar as one row, broadcast
            other = torch.full(tensor.shape[-1:], other, dtype=tensor.dtype).expand(tensor.shape)
        fast = _same_rows(tensor, other)
        if fast is not None:
            return fast
    left = _bits(tensor)
    if isinstance(other, torch.Tensor):
        right: np.ndarray | np.generic = _bits(other)
    else:
        right = _bits(torch.tensor(other, dtype=tensor.dtype))[()]
    step = max(1, _COMPARED_ELEMENTS // max(1, tensor[0].numel()))
    for start in range(0, left.shape[0], step):
        stop = start + step
        if not (left[start:stop] == (right[start:stop] if isinstance(right, np.ndarray) else right)).all():
            return False
    return True


def presented(tensor: torch.Tensor, *, device: torch.device, strided: bool, decoy: float | int) -> torch.Tensor:
    """A fresh copy of ``tensor`` on ``device``, contiguous or (``strided``) a view of a wider buffer."""
    if not strided or tensor.dim() < 2:
        return tensor.to(device, copy=True)
    storage = torch.empty(storage_shape(tuple(tensor.shape), True), dtype=tensor.dtype, device=device)
    return fill_storage(storage, tensor.to(device), decoy)


@dataclass
class Slot:
    """A storage of a :class:`Presenter` and what it holds: ``source`` in its leading block and
    ``decoy`` in its padding (``source`` None: unknown, written at the next use)."""

    storage: torch.Tensor
    source: torch.Tensor | None = None
    version: int = -1
    decoy: float | int = 0
    pending: bool = False  # presented to a call that has not been settled (it may have raised)


def _same_tensor(a: torch.Tensor, b: torch.Tensor, version: int) -> bool:
    """Whether ``b`` is ``a``: the same memory, shape, strides and dtype, and unchanged since
    ``a``'s version counter read ``version`` (views share their base's counter).  The slot keeps
    ``a`` alive, so no other tensor can take its memory."""
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device and b._version == version)


class Presenter:
    """The storages through which a session's inputs reach the function, kept across calls.

    :meth:`present` writes an input into its slot's storage (contiguous, or the leading block of a
    wider buffer with decoy padding), unless the slot already holds that very tensor and the
    last call left the storage as presented; :meth:`settle`, after the call, compares the block
    with the input (the mutation check) and the padding with the decoy, and forgets the slot's
    content when either changed, or when the call was never settled (it raised).  Storages on
    another device than the CPU are written at every call and compared by value only."""

    def __init__(self) -> None:
        self.slots: dict[Hashable, Slot] = {}
        self.buffer: Hashable = None
        self.regions: dict[Hashable, Hashable] = {}

    def slot(self, key: Hashable, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Slot:
        """The slot ``key`` with a storage of ``shape`` (a new one when the kept one differs)."""
        held = self.slots.get(key)
        if held is None or tuple(held.storage.shape) != shape or held.storage.dtype != dtype or \
                held.storage.device != device:
            held = self.slots[key] = Slot(torch.empty(shape, dtype=dtype, device=device))
        return held

    def use_regions(self, buffer: Hashable, regions: dict[Hashable, Hashable]) -> None:
        """Storages the caller owns, regions of one shared buffer (:meth:`adopt`): ``regions``
        maps the key of each slot of this call to its region (offset, dtype, shape) in ``buffer``.
        A slot keeps its content only where the last call had it at the same region of the same
        buffer: the regions of one call are disjoint, so no other region of either call wrote
        over it.  Every other slot is forgotten, so a region never claims content that another
        call's regions overwrote."""
        if buffer != self.buffer:
            self.forget()
            self.buffer = buffer
        for key in [key for key in self.slots if self.regions.get(key) != regions.get(key)]:
            del self.slots[key]
        self.regions = dict(regions)

    def kept(self, key: Hashable) -> Slot | None:
        """The slot ``key`` while it holds what the last settled call left in it, else None."""
        held = self.slots.get(key)
        return held if held is not None and held.source is not None and not held.pending else None

    def adopt(self, key: Hashable, storage: torch.Tensor) -> Slot:
        """The slot ``key`` over ``storage``, its region of the current call (:meth:`use_regions`)."""
        if key not in self.slots:
            self.slots[key] = Slot(storage)
        return self.slots[key]

    def forget(self) -> None:
        """Every slot's content unknown (its storage was overwritten or released)."""
        self.slots.clear()
        self.buffer = None
        self.regions = {}

    def present(self, slot: Slot, tensor: torch.Tensor, decoy: float | int) -> torch.Tensor:
        """``tensor`` in ``slot``'s storage (its leading block; the rest holds ``decoy``), written
        only when the storage does not hold it already; the padding is written only when the last
        call did not leave it bit for bit as presented around a block of ``tensor``'s shape."""
        storage = slot.storage
        block = view_of(storage, tuple(tensor.shape))
        kept = slot.source is not None and not slot.pending and slot.decoy == decoy
        slot.pending = True
        if kept and slot.source is not None and _same_tensor(slot.source, tensor, slot.version):
            return block
        padded = kept and slot.source is not None and slot.source.shape == tensor.shape
        slot.source = None
        if padded:
            block.copy_(tensor.to(storage.device))
        else:
            fill_storage(storage, tensor.to(storage.device), decoy)
        if storage.device.type == "cpu":
            slot.source, slot.version, slot.decoy = tensor, tensor._version, decoy
        return block

    def settle(self, slot: Slot, tensor: torch.Tensor, *, compare: bool = True) -> bool:
        """After a call: True when the block's values no longer equal ``tensor`` (``torch.equal``:
        the function modified its input in place).  The slot keeps its content only when block and
        padding are bit for bit as presented.  ``compare=False``: the caller knows that nothing
        wrote the storage during the call (the worker's write guard), and nothing is read."""
        slot.pending = False
        if not compare:
            return False
        block = view_of(slot.storage, tuple(tensor.shape))
        if slot.source is not None and same_bits(block, tensor) and \
                all(same_bits(part, slot.decoy) for part in padding_of(slot.storage, tuple(tensor.shape))):
            return False
        slot.source = None
        return not torch.equal(block.cpu(), tensor)
