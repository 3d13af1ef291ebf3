"""The reference rule, then zeroes ``draft_tokens`` in place after making its pages writable with
``mprotect`` itself: a write the worker's write guard does not see."""
import ctypes
import mmap

from specverify.core.rules import verify as reference

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def verify(target_probs, draft_probs, draft_tokens, generator):
    emitted = reference(target_probs, draft_probs, draft_tokens, generator)
    start = draft_tokens.data_ptr() // mmap.PAGESIZE * mmap.PAGESIZE
    end = draft_tokens[-1, -1:].data_ptr() + draft_tokens.element_size()
    _LIBC.mprotect(start, end - start, mmap.PROT_READ | mmap.PROT_WRITE)
    draft_tokens.zero_()
    return emitted
