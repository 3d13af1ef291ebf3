"""Where the native sources (``native/*.c``) are compiled to, and their build; importable without
torch.  :mod:`specverify.core.native_rules` loads the verification kernel (``verify_kernel.c``),
:mod:`specverify.auditing.isolation.write_guard` the worker's write guard (``write_guard.c``),
``specverify doctor`` looks for the kernel; :func:`loaded` builds and loads either.

A compiled file is ``$SPECVERIFY_CACHE/native/NAME-KEY.so`` (default cache ``~/.cache/specverify``),
KEY the hash of the source, the compiler, the flags, the machine and the CPU's flags: a new source
or another CPU gets its own file.  It is renamed into place atomically, so concurrent processes
may build it at the same time.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
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


def library_path(source: bytes, compiler_path: str, flags: Sequence[str], name: str = "verify_kernel") -> Path:
    """The file ``source`` (the C file ``name``) compiled by ``compiler_path`` with ``flags`` is cached in."""
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
    return cache_dir() / f"{name}-{key}.so"


def compiled(source: bytes, name: str = "verify_kernel", flags: Sequence[str] = FLAGS) -> Path | None:
    """The shared library of the C ``source`` (the file ``name``), compiled with ``flags`` on first
    use and cached (:func:`library_path`); None when there is no compiler or it fails."""
    compiler_path = compiler()
    if compiler_path is None:
        return None
    target = library_path(source, compiler_path, flags, name)
    if target.exists():
        return target
    folder, partial = target.parent, None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(prefix=target.name, suffix=".tmp", dir=folder)
        os.close(handle)
        source_file = partial.removesuffix(".tmp") + ".c"
        Path(source_file).write_bytes(source)
        try:
            subprocess.run([compiler_path, *flags, "-o", partial, source_file], check=True, capture_output=True,
                           timeout=120)
        finally:
            os.unlink(source_file)
        os.replace(partial, target)  # atomic: a concurrent build renames an identical file
    except (OSError, subprocess.SubprocessError):
        if partial is not None and os.path.exists(partial):
            os.unlink(partial)
        return None
    return target


def loaded(source: bytes, name: str = "verify_kernel", flags: Sequence[str] = FLAGS) -> ctypes.CDLL | None:
    """The library of :func:`compiled`, loaded; None when it cannot be built or loaded."""
    built = compiled(source, name, flags)
    if built is None:
        return None
    try:
        return ctypes.CDLL(str(built))
    except OSError:
        return None
