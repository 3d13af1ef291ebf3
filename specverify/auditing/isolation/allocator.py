"""glibc's allocator told to keep large freed blocks, in the worker and in the audit's own process.

A call of a production-shape check moves tens of MB of fresh tensors: the gather of its rows'
laws in the audit's process (42 MB a call for ``truncated-vocabulary``), the inputs of 1–2 MB a row
at V = 151,936 in the worker.  glibc maps a block above its mmap threshold on allocation and unmaps
it when freed, so every call's fresh tensors page-fault on first touch: the 42 MB gather takes
24 ms instead of 6 ms.  With :data:`SETTINGS` large blocks come from the heap, which keeps what was
freed (no trim, a generous top pad), and the next call reuses the same pages.

The worker gets them as environment variables (:func:`environment`, read when glibc starts);
the ``specverify`` command (:func:`specverify.cli.main`) applies them to its own running process
with ``mallopt`` (:func:`apply`).
"""

from __future__ import annotations

import ctypes
import functools

SETTINGS: tuple[tuple[str, int, int], ...] = (
    ("MALLOC_MMAP_THRESHOLD_", -3, 1 << 30),
    ("MALLOC_TRIM_THRESHOLD_", -1, (1 << 31) - 1),
    ("MALLOC_TOP_PAD_", -2, 1 << 28),
)
"""Per setting: glibc's environment variable, its ``mallopt`` parameter (``M_MMAP_THRESHOLD``,
``M_TRIM_THRESHOLD``, ``M_TOP_PAD``) and the value in bytes (within a C ``int``, as ``mallopt`` takes)."""


def environment() -> dict[str, str]:
    """The settings as environment variables, for a process about to start."""
    return {name: str(value) for name, _, value in SETTINGS}


@functools.cache
def apply() -> bool:
    """Apply the settings to this process (once); False where the C library has no ``mallopt``
    (not glibc) or refuses one of them, which leaves the allocator as it was for that setting."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.restype = ctypes.c_int
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return all([mallopt(parameter, value) == 1 for _, parameter, value in SETTINGS])
