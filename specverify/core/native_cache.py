"""Where the native kernel (``native/verify_kernel.c``) is compiled to, importable without torch:
:mod:`specverify.core.native_rules` builds and loads it there, ``specverify doctor`` looks for it.

The compiled file is ``$SPECVERIFY_CACHE/native/verify_kernel-KEY.so`` (default cache
``~/.cache/specverify``), KEY the hash of the source, the compiler, the flags, the machine and the
CPU's flags: a new source or another CPU gets its own file.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
from collections.abc import Sequence
from pathlib import Path

from specverify.core.cache_root import cache_root

SOURCE = Path(__file__).resolve().parent / "native" / "verify_kernel.c"
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-fno-strict-aliasing", "-ffp-contract=off")


def cache_dir() -> Path:
    """The folder of the compiled kernels."""
    return cache_root() / "native"


def cpu_flags() -> str:
    """The CPU's flags line of ``/proc/cpuinfo`` (``platform.processor()`` where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def compiler() -> str | None:
    """The C compiler the kernel is built with (``$CC``, default ``cc``), None when there is none."""
    return shutil.which(os.environ.get("CC", "cc"))


def library_path(source: bytes, compiler_path: str, flags: Sequence[str]) -> Path:
    """The file ``source`` compiled by ``compiler_path`` with ``flags`` is cached in."""
    key = hashlib.sha256(
        b"\0".join(
            [
                source,
                compiler_path.encode(),
                " ".join(flags).encode(),
                platform.machine().encode(),
                cpu_flags().encode(),
            ]
        )
    ).hexdigest()[:20]
    return cache_dir() / f"verify_kernel-{key}.so"
