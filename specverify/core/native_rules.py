"""The fused CPU kernel of the chain rules and the native tree walk (``native/verify_kernel.c``):
build, load, call.

:func:`specverify.core.rules.rejection_sample`, :func:`~specverify.core.rules.point_mass_verify` and
:func:`~specverify.core.rules.greedy_verify` call :func:`verify` first; it returns ``None`` whenever
the kernel does not apply, and the rule then runs its torch code, which stays the reference.  The
kernel applies to CPU tensors of float32, bfloat16 or float16 (target and draft of one dtype),
when a C compiler is found and ``$SPECVERIFY_NATIVE`` is not ``0``.  In one call it screens every
input row in use, runs the accept tests and draws the final token of each row; its outputs are
bit-identical to the torch rule's under the same uniforms (tests/core/test_native_rules.py).  When the
screen flags anything, :func:`verify` returns ``None`` (the generator restored) so that the torch
rule words the error, exactly as before.

:func:`specverify.core.tree_rules.tree_rejection_sample` and
:func:`~specverify.core.tree_rules.point_mass_tree_verify` call :func:`tree_verify` likewise
(:func:`tree_applies` decides): the kernel screens the tree and its rows, runs each node's accept
tests and residuals and the final draw, and the Python loop in between takes the residuals' totals
with ``torch.sum`` over the ``[B, V]`` float64 buffer, as the torch walk does; ``greedy_tree_verify``
calls :func:`tree_greedy` (tests/core/test_native_tree_rules.py).

The kernel is plain C (no torch headers): ``$CC`` (default ``cc``) compiles it once in about a
second with ``-O3 -march=native`` into ``$SPECVERIFY_CACHE`` (default ``~/.cache/specverify``),
named by the hash of the source, the command and the CPU's flags (:mod:`specverify.core.native_cache`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeGuard

import torch

from specverify.core import native_cache

SOURCE = native_cache.SOURCE
FLAGS = native_cache.FLAGS
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
TREE_DTYPES = (torch.float32, torch.bfloat16)
"""The dtypes of the tree walk (the chain kernel takes every dtype of :data:`DTYPE_CODES`)."""
RULE_CODES = {"rejection": 0, "point_mass": 1, "greedy": 2}
_FLAGGED, _NO_MEMORY = 1, 2

SCREEN_MARGIN_FRACTION = 0.25
"""The kernel accepts a row as certainly valid when its float64 sum is within
``(1 - SCREEN_MARGIN_FRACTION) * row_sum_tolerance`` of 1; rows nearer the edge go to the torch
check, whose own sum (in the input dtype, accumulated in float32) rounds differently.  The margin,
1/4 of the tolerance, is 2.5e-5 for float32 (~420 float32 ulps of 1: torch's cascade sum errs by
~100 at V = 128k), 7.8e-3 for bfloat16 (twice the rounding of a bfloat16 sum near 1) and at least
9.8e-4 for float16 (twice the rounding of a float16 sum near 1)."""


class Outcome(NamedTuple):
    """What one kernel call returned: the rule's two outputs and how many final rows took the
    exact sequential cumulative sum (the others were certified by the error bound)."""

    emitted: torch.Tensor
    num_accepted: torch.Tensor
    exact_rows: int


def enabled() -> bool:
    """Whether the native path may be used: ``$SPECVERIFY_NATIVE`` is not ``0`` and the kernel builds."""
    return os.environ.get("SPECVERIFY_NATIVE", "1") != "0" and library() is not None


class path(contextlib.ContextDecorator):
    """Within it, the rules take the native path where it applies (``native=True``) or always run
    their torch code (``native=False``, ``$SPECVERIFY_NATIVE=0``); reusable, not nestable."""

    def __init__(self, native: bool) -> None:
        self.native = native

    def __enter__(self) -> path:
        self._previous = os.environ.get("SPECVERIFY_NATIVE")
        os.environ["SPECVERIFY_NATIVE"] = "1" if self.native else "0"
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._previous is None:
            os.environ.pop("SPECVERIFY_NATIVE", None)
        else:
            os.environ["SPECVERIFY_NATIVE"] = self._previous


def disabled() -> path:
    """Within it, every rule runs its torch code (``$SPECVERIFY_NATIVE=0``)."""
    return path(False)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel (built on first use), or ``None`` when no C compiler can build it."""
    return build(SOURCE.read_bytes())


def _built_library() -> ctypes.CDLL:
    """:func:`library` where :func:`applies` or :func:`tree_applies` said the kernel is built."""
    lib = library()
    if lib is None:
        raise RuntimeError("the native kernel is not built: call it only where applies() / tree_applies() is True")
    return lib


def build(source: bytes) -> ctypes.CDLL | None:
    """Compile the C ``source`` (cached by its hash, the command and the CPU) and load it with its
    ``sv_verify`` signature; ``None`` when there is no compiler or it fails.  Tests build mutated
    copies of the kernel with it, to show that the identity tests catch them."""
    lib = native_cache.loaded(source, flags=FLAGS)
    if lib is None:
        return None
    pointer, int64 = ctypes.c_void_p, ctypes.c_int64
    lib.sv_verify.argtypes = [ctypes.c_int, ctypes.c_int, pointer, pointer, int64, int64, int64, int64, int64, int64,
                              int64, pointer, pointer,
                              pointer, ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_double, ctypes.c_int,
                              pointer, pointer, pointer]
    lib.sv_verify.restype = ctypes.c_int
    lib.sv_tree_check.argtypes = [ctypes.c_int, pointer, pointer, int64, int64, int64, pointer, pointer, pointer,
                                  ctypes.c_int, ctypes.c_double, ctypes.c_double]
    lib.sv_tree_check.restype = ctypes.c_int
    lib.sv_tree_advance.argtypes = [ctypes.c_int, pointer, pointer, int64, int64, int64, pointer, pointer, pointer,
                                    int64, pointer, pointer, pointer, pointer, pointer, pointer, pointer, pointer,
                                    ctypes.c_int, pointer, pointer, pointer]
    lib.sv_tree_advance.restype = int64
    lib.sv_tree_greedy.argtypes = [ctypes.c_int, pointer, int64, int64, int64, pointer, pointer, ctypes.c_int,
                                   ctypes.c_double, pointer, pointer, pointer]
    lib.sv_tree_greedy.restype = ctypes.c_int
    return lib


def _cpu_tensor_of(tensor: object, dtype: torch.dtype, shape: tuple[int, ...]) -> TypeGuard[torch.Tensor]:
    """``tensor`` is a CPU tensor of that dtype and shape."""
    return (isinstance(tensor, torch.Tensor) and tensor.dtype == dtype and tuple(tensor.shape) == shape
            and tensor.device.type == "cpu")


def _fit(tensors: Sequence[tuple[object, torch.dtype, tuple[int, ...]]], uniforms: object,
         uniforms_shape: tuple[int, int], generator: object) -> bool:
    """Every ``(tensor, dtype, shape)`` is a contiguous CPU tensor of that dtype and shape, the
    uniforms (if given) a floating CPU tensor ``[B, K+1]``, the generator (if given) a CPU one,
    and the kernel enabled."""
    for tensor, dtype, shape in tensors:
        if not (_cpu_tensor_of(tensor, dtype, shape) and tensor.is_contiguous()):
            return False
    if uniforms is not None and not (isinstance(uniforms, torch.Tensor) and uniforms.is_floating_point()
                                     and tuple(uniforms.shape) == uniforms_shape and uniforms.device.type == "cpu"):
        return False
    if generator is not None and not (isinstance(generator, torch.Generator) and generator.device.type == "cpu"):
        return False
    return enabled()


def rows_contiguous(tensor: torch.Tensor) -> bool:
    """Each row of the last dimension is contiguous (the batch and position strides are free:
    strided views and rows expanded with stride 0 are read in place)."""
    return tensor.stride(-1) == 1 or tensor.shape[-1] == 1


def applies(target_probs: object, draft_probs: object, draft_tokens: object, num_draft: object,
            uniforms: object, generator: object) -> bool:
    """Whether the kernel can take these inputs: CPU, float32/bfloat16/float16 of one dtype with each row
    of the vocabulary contiguous (any batch and position strides), contiguous int64 tokens, shapes
    consistent (checked here too, since validation may be off), enabled."""
    if not (isinstance(target_probs, torch.Tensor) and isinstance(draft_tokens, torch.Tensor)):
        return False
    if target_probs.dtype not in DTYPE_CODES or target_probs.device.type != "cpu" or target_probs.dim() != 3:
        return False
    batch, positions, vocab = target_probs.shape
    if batch < 1 or positions < 2 or vocab < 1 or not rows_contiguous(target_probs):
        return False
    if draft_probs is not None and not (_cpu_tensor_of(draft_probs, target_probs.dtype, (batch, positions - 1, vocab))
                                        and rows_contiguous(draft_probs)):
        return False
    tensors: list[tuple[object, torch.dtype, tuple[int, ...]]] = [(draft_tokens, torch.int64, (batch, positions - 1))]
    if num_draft is not None:
        tensors.append((num_draft, torch.int64, (batch,)))
    return _fit(tensors, uniforms, (batch, positions), generator)


def verify(rule: str, target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_tokens: torch.Tensor,
           generator: torch.Generator | None, uniforms: torch.Tensor | None, num_draft: torch.Tensor | None,
           validate: bool, *, target_limit: float = 0.0, draft_limit: float = 0.0,
           force_exact: bool = False) -> Outcome | None:
    """Run ``rule`` (``"rejection"``, ``"point_mass"`` or ``"greedy"``) on inputs that
    :func:`applies` accepted; ``None`` when the kernel flagged them (the generator, if any, is
    then back in its state before the call).  ``target_limit``/``draft_limit`` are the screen's
    bounds on ``|row sum - 1|`` (``(1 - SCREEN_MARGIN_FRACTION) * row_sum_tolerance``);
    ``force_exact`` sends every final row through the sequential cumulative sum (for tests)."""
    batch, positions, vocab = target_probs.shape
    state = None
    if rule == "greedy":
        u = None
    elif uniforms is not None:
        u = uniforms.to(torch.float64).contiguous()
    else:  # no generator (possible with validate=False): torch.rand's global generator, as the torch code
        source = generator if generator is not None else torch.default_generator
        state = source.get_state()
        u = torch.rand(batch, positions, generator=generator, dtype=torch.float64)
    emitted = torch.empty(batch, positions, dtype=torch.int64)
    num_accepted = torch.empty(batch, dtype=torch.int64)
    exact_rows = ctypes.c_int64(0)
    status = _built_library().sv_verify(
        RULE_CODES[rule], DTYPE_CODES[target_probs.dtype], target_probs.data_ptr(),
        draft_probs.data_ptr() if draft_probs is not None else None, batch, positions - 1, vocab,
        *target_probs.stride()[:2], *(draft_probs.stride()[:2] if draft_probs is not None else (0, 0)),
        draft_tokens.data_ptr(), num_draft.data_ptr() if num_draft is not None else None,
        u.data_ptr() if u is not None else None, int(validate), int(uniforms is not None), target_limit, draft_limit,
        int(force_exact), emitted.data_ptr(), num_accepted.data_ptr(), ctypes.byref(exact_rows))
    if status == _NO_MEMORY:
        raise MemoryError("specverify native kernel: out of memory for its scratch buffers")
    if status == _FLAGGED:
        if state is not None:
            source.set_state(state)
        return None
    return Outcome(emitted, num_accepted, exact_rows.value)


# --------------------------------------------------------------------------------------------
# Tree rules
# --------------------------------------------------------------------------------------------


class TreeOutcome(NamedTuple):
    """What one native tree walk returned: the rule's three outputs, how many final rows took the
    exact sequential cumulative sum, and how many times the totals were taken with ``torch.sum``."""

    emitted: torch.Tensor
    num_accepted: torch.Tensor
    last_node: torch.Tensor
    exact_rows: int
    sums: int


def tree_applies(target_probs: object, draft_probs: object, tree_tokens: object, parents: object,
                 uniforms: object, generator: object) -> bool:
    """Whether the kernel can take these tree inputs: CPU, contiguous, float32/bfloat16 of one dtype,
    int64 tokens and parents, shapes consistent (checked here too, since validation may be off), enabled."""
    if not (isinstance(target_probs, torch.Tensor) and target_probs.dtype in TREE_DTYPES
            and target_probs.device.type == "cpu" and target_probs.dim() == 3 and target_probs.is_contiguous()):
        return False
    batch, positions, vocab = target_probs.shape
    if batch < 1 or positions < 2 or vocab < 1:
        return False
    tensors: list[tuple[object, torch.dtype, tuple[int, ...]]] = [(tree_tokens, torch.int64, (batch, positions - 1)),
                                                                (parents, torch.int64, (batch, positions - 1))]
    if draft_probs is not None:
        tensors.append((draft_probs, target_probs.dtype, (batch, positions - 1, vocab)))
    return _fit(tensors, uniforms, (batch, positions), generator)


def tree_verify(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, tree_tokens: torch.Tensor,
                parents: torch.Tensor, draw_uniforms: Callable[[], torch.Tensor], uniforms: torch.Tensor | None,
                validate: bool, buffers: tuple[torch.Tensor, torch.Tensor], *, limit: float = 0.0,
                force_exact: bool = False) -> TreeOutcome | None:
    """Recursive rejection sampling over the tree (``draft_probs`` given) or its point-mass form
    (``None``) on inputs that :func:`tree_applies` accepted; ``None`` when the kernel flagged them
    (before any uniform was drawn).  ``draw_uniforms()`` returns the step's float64 uniforms
    ``[B, N+1]`` (:func:`specverify.core.tree_rules.step_uniforms`); ``buffers`` are two float64
    ``[B, V]`` contiguous scratch tensors (the residuals); ``limit`` is the screen's bound on
    ``|row sum - 1|``; ``force_exact`` sends every final row through the sequential cumulative sum.
    After each node with a rejecting row the residuals' totals are taken with ``torch.sum(-1)``
    over the ``[B, V]`` buffer holding them, exactly as the torch walk takes them."""
    batch, positions, vocab = target_probs.shape
    lib, dtype = _built_library(), DTYPE_CODES[target_probs.dtype]
    injected = uniforms.to(torch.float64).contiguous() if uniforms is not None and validate else None
    target, draft = target_probs.data_ptr(), draft_probs.data_ptr() if draft_probs is not None else None
    shape = (batch, positions - 1, vocab)
    tokens, parent_ptr = tree_tokens.data_ptr(), parents.data_ptr()
    if lib.sv_tree_check(dtype, target, draft, *shape, tokens, parent_ptr,
                         injected.data_ptr() if injected is not None else None, int(validate), limit,
                         limit) == _FLAGGED:
        return None
    u = draw_uniforms().contiguous()
    s = torch.ones(batch, dtype=torch.float64)  # a fresh target row counts as normalised
    current = torch.full((batch,), -1, dtype=torch.int64)
    state = torch.zeros(2, batch, dtype=torch.int8)  # held, rejecting
    held, rejecting = state[0], state[1]
    emitted = torch.empty(batch, positions, dtype=torch.int64)
    depth = torch.empty(batch, dtype=torch.int64)
    into, exact_rows = ctypes.c_int64(0), ctypes.c_int64(0)
    start, totals, sums = 0, None, 0
    while True:
        start = lib.sv_tree_advance(dtype, target, draft, *shape, tokens, parent_ptr, u.data_ptr(), start,
                                    totals.data_ptr() if totals is not None else None, buffers[0].data_ptr(),
                                    buffers[1].data_ptr(), s.data_ptr(), current.data_ptr(), held.data_ptr(),
                                    rejecting.data_ptr(), ctypes.byref(into), int(force_exact), emitted.data_ptr(),
                                    depth.data_ptr(), ctypes.byref(exact_rows))
        if start < 0:
            raise MemoryError("specverify native kernel: out of memory for its scratch buffers")
        if start == positions:
            return TreeOutcome(emitted, depth, current, exact_rows.value, sums)
        totals = buffers[into.value].sum(-1)  # torch's own totals, over a [B, V] buffer as in the torch walk
        sums += 1


def tree_greedy(target_probs: torch.Tensor, tree_tokens: torch.Tensor, parents: torch.Tensor, validate: bool, *,
                limit: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Greedy tree verification (:func:`specverify.core.tree_rules.greedy_tree_verify`) on inputs that
    :func:`tree_applies` accepted: ``(emitted, num_accepted, last_node)``, or ``None`` when the kernel
    flagged them (a row in use that fails the screen, or with a sign bit set or a NaN: ``torch.argmax`` decides)."""
    batch, positions, vocab = target_probs.shape
    emitted = torch.empty(batch, positions, dtype=torch.int64)
    depth = torch.empty(batch, dtype=torch.int64)
    last_node = torch.empty(batch, dtype=torch.int64)
    status = _built_library().sv_tree_greedy(DTYPE_CODES[target_probs.dtype], target_probs.data_ptr(), batch,
                                             positions - 1, vocab, tree_tokens.data_ptr(), parents.data_ptr(),
                                             int(validate), limit, emitted.data_ptr(), depth.data_ptr(),
                                             last_node.data_ptr())
    return None if status == _FLAGGED else (emitted, depth, last_node)
