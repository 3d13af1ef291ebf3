"""What torch cannot run on this CPU under a forced kernel set (``ATEN_CPU_CAPABILITY``).

Torch picks its vectorised CPU kernels once, at import, from ``ATEN_CPU_CAPABILITY`` (``default``,
``avx2``, ``avx512``), but some reduced-precision paths dispatch on the CPU's own instructions:
on a CPU with AMX, bfloat16 attention packs its operands for AMX with AVX-512 code and raises
("pack_vnni2 is only supported when avx512 is supported") once the capability is forced below
AVX-512.  Such a path cannot run on that machine under that kernel set: a test meeting it skips
with the reason (:func:`kernel_set_limitation` before the work, :func:`is_kernel_set_limitation`
on an error raised during it); it never fails.
"""

from __future__ import annotations

import os
import re

import torch

KERNEL_SET_LIMITATION = re.compile(r"only supported when (avx512|avx2|amx)\b|not supported on this (cpu|platform)",
                                   re.IGNORECASE)
"""How torch says a kernel needs instructions the picked kernel set excludes."""


def forced_kernel_set() -> str | None:
    """The kernel set ``ATEN_CPU_CAPABILITY`` forces (lower case), or ``None`` when it is unset."""
    value = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    return value or None


def is_kernel_set_limitation(error: BaseException) -> bool:
    """Whether ``error`` is torch refusing a kernel that the forced kernel set cannot run here.

    Only a ``RuntimeError`` whose message matches :data:`KERNEL_SET_LIMITATION`, and only while
    ``ATEN_CPU_CAPABILITY`` is set: with torch's own choice of kernels every path must run."""
    return (forced_kernel_set() is not None and isinstance(error, RuntimeError)
            and KERNEL_SET_LIMITATION.search(str(error)) is not None)


def kernel_set_limitation(dtype: torch.dtype, heads: int = 9, head_dim: int = 64, hidden: int = 576) -> str | None:
    """Why torch cannot run a transformer's ``dtype`` kernels under the picked kernel set, or ``None``.

    One causal attention call (``heads`` heads of ``head_dim``, 256 positions: the packed path
    needs at least 64 keys) and one ``hidden × hidden`` matmul in ``dtype`` find that out before a
    model loads (the defaults are SmolLM2-135M's shapes); an error that is not such a refusal is
    raised as it is."""
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, heads, 256, head_dim, generator=generator).to(dtype) for _ in range(3))
    weight = torch.randn(hidden, hidden, generator=generator).to(dtype)
    try:
        torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
        torch.randn(16, hidden, generator=generator).to(dtype) @ weight
    except RuntimeError as error:
        if KERNEL_SET_LIMITATION.search(str(error)) is None:
            raise
        return str(error).splitlines()[0]
    return None
