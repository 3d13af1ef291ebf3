"""The folder specverify keeps what it builds or computes once per machine: ``$SPECVERIFY_CACHE``,
default ``~/.cache/specverify``.  Importable without torch.

Its subfolders: ``native/`` (the compiled kernel, :mod:`specverify.core.native_cache`), ``plans/``
(the identity test's planning figures, :mod:`specverify.core.plan_cache`), and the packaged
models (:mod:`specverify.hf.packaged`).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "SPECVERIFY_CACHE"


def cache_root() -> Path:
    """``$SPECVERIFY_CACHE`` if set (``~`` expanded), else ``~/.cache/specverify``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "specverify"
