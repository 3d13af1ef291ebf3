"""The worker's write guard: while the function runs, the pages of its inputs are read-only
(``specverify/core/native/write_guard.c``).

A call's inputs lie in the shared buffer before its output, which starts on a page of its own
(:func:`specverify.auditing.isolation.process.layout`), so the span from the buffer's start to
the output's offset holds the inputs and nothing the worker writes.  :class:`WriteGuard` makes
that span read-only in the worker's mapping while the function runs, and keeps it so across
requests of the same layout.  A write into it faults;
the guard's signal handler records the fault, makes the span writable and lets the write happen,
so the function computes exactly what it would unguarded.  After the call:

- ``untouched`` True: no write reached the inputs through the worker's mapping, so they are bit
  for bit as presented (the audit's process writes them, the worker never does) and the mutation
  check need not read them again;
- otherwise (a write faulted, or the span could not be guarded: no C compiler, a platform without
  ``mprotect``) the audit compares the inputs byte for byte, as it does for every call without
  the guard.

The guard changes what a call costs, never what it computes or what the audit concludes: a
function that writes its inputs is found by the same comparison, guarded or not.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys

from specverify.core import native_cache

SOURCE = native_cache.SOURCE.parent / "write_guard.c"
PAGE_BYTES = mmap.PAGESIZE
"""The span a guard protects starts and ends on multiples of this (the mapping's base is one)."""


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled guard (built on first use); None where no C compiler builds it, and off Linux
    (where a write to a read-only shared page may raise SIGBUS, which the guard does not handle)."""
    if not sys.platform.startswith("linux"):
        return None
    lib = native_cache.loaded(SOURCE.read_bytes(), "write_guard")
    if lib is None:
        return None
    lib.sv_guard_cover.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    for function in (lib.sv_guard_cover, lib.sv_guard_release, lib.sv_guard_written):
        function.restype = ctypes.c_int
    return lib


class WriteGuard:
    """The worker's guarded span of read-only pages, one at a time.

    :meth:`cover` before a request's calls (the span is kept, without a system call, while the
    requests' layout stays the same), :meth:`untouched` after them, :meth:`release` before the
    worker does anything else with the buffer.  Spans start and end on multiples of
    :data:`PAGE_BYTES`."""

    def __init__(self) -> None:
        self.covered = False

    def cover(self, address: int, length: int) -> bool:
        """Make ``[address, address + length)`` read-only; True when it is and no write reached
        the span guarded before since the last request (False: unguarded, or a write in between,
        e.g. by a thread the function left running)."""
        if address % PAGE_BYTES or length % PAGE_BYTES:
            raise ValueError(f"address, length: expected multiples of the page size {PAGE_BYTES}, "
                             f"got {address:#x} and {length}")
        lib = library()
        if lib is None or length <= 0:
            self.release()
            return False
        opened = self.covered and lib.sv_guard_written() == 1
        self.covered = lib.sv_guard_cover(address, length) == 0
        return self.covered and not opened

    def untouched(self) -> bool:
        """Whether the covered span is still read-only: no write reached it since :meth:`cover`."""
        lib = library()
        return self.covered and lib is not None and lib.sv_guard_written() == 0

    def release(self) -> None:
        """The span writable again; nothing guarded."""
        lib = library()
        if self.covered and lib is not None:
            lib.sv_guard_release()
        self.covered = False
