"""The identity test's planning figures kept on disk, so that an audit computes each once per
machine.

A sample size (:func:`specverify.core.identity.identity_sample_size`) or a detectable TV
(:func:`specverify.core.identity.identity_detectable_tv`) is a deterministic function of the law,
ε or n, α, the power and the test's options: a search over the worst-case power bound that costs
seconds per law at production vocabularies.  Each figure is stored in
``$SPECVERIFY_CACHE/plans/KEY.json`` (:func:`specverify.core.cache_root.cache_root`), KEY the
SHA-256 of the figure's name, its arguments (the law by its digest), the source of the modules
that compute it and the numpy and scipy versions, so other code or other libraries never read
another's figures.  The file holds the exact value (JSON writes a float's shortest round-trip
form); it is written by an atomic rename, and a file that cannot be read, or holds no value of
the figure's type, is computed again and rewritten.  A cache that cannot be written costs only
the time.  ``SPECVERIFY_PLAN_CACHE=0`` computes every figure.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from specverify.core.cache_root import cache_root

SWITCH_ENV = "SPECVERIFY_PLAN_CACHE"
"""``0`` computes every figure (neither reads nor writes the cache)."""

_COMPUTING_MODULES = ("identity.py", "stats.py")
"""The modules of :mod:`specverify.core` whose source is part of every key."""

Figure = TypeVar("Figure", int, float)


def plans_dir() -> Path:
    """The folder of the stored figures."""
    return cache_root() / "plans"


@functools.cache
def _code_digest() -> bytes:
    """SHA-256 of the computing modules' source and the numpy and scipy versions."""
    import numpy
    import scipy

    digest = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in _COMPUTING_MODULES:
        digest.update((here / name).read_bytes())
    digest.update(f"numpy {numpy.__version__} scipy {scipy.__version__}".encode())
    return digest.digest()


def entry_path(figure: str, arguments: tuple[object, ...]) -> Path:
    """The file of ``figure`` at ``arguments`` (each written by its ``repr``)."""
    key = hashlib.sha256(_code_digest() + repr((figure, arguments)).encode()).hexdigest()
    return plans_dir() / f"{key}.json"


def _valid(value: object, kind: type) -> bool:
    if kind is int:
        return type(value) is int and value >= 1
    return type(value) is float and (value > 0 or math.isinf(value))


def remembered(figure: str, arguments: tuple[object, ...], kind: type[Figure], compute: Callable[[], Figure]) -> Figure:
    """The stored value of ``figure`` at ``arguments``, or ``compute()`` stored.

    ``kind``: ``int`` (a sample size, ≥ 1) or ``float`` (a TV, > 0, ``inf`` included)."""
    if os.environ.get(SWITCH_ENV) == "0":
        return compute()
    path = entry_path(figure, arguments)
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stored = None
    if isinstance(stored, dict) and _valid(stored.get("value"), kind):
        return kind(stored["value"])
    value = compute()
    _store(path, {"figure": figure, "arguments": repr(arguments), "value": kind(value)})
    return value


def _store(path: Path, entry: dict[str, object]) -> None:
    """Write ``entry`` to ``path`` by an atomic rename; nothing when the folder cannot be written
    (the figure is then computed again next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, suffix=".tmp", delete=False)
    except OSError:
        return
    try:
        with staged:
            json.dump(entry, staged)
        os.replace(staged.name, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(staged.name)
