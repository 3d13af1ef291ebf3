"""specverify: prove speculative decoding lossless, or catch it when it is not.

``specverify.audit(fn)`` returns an audit report and ``specverify.assert_lossless(fn)`` raises
``AssertionError`` unless no loss was detected.  The package is grouped by purpose:
``specverify.core`` (rules, exact laws, statistics), ``specverify.testing`` (strategies, harness,
pytest plugin), ``specverify.auditing`` (checks, levels, catalog, reports), ``specverify.cli`` and
``specverify.hf`` (Hugging Face adapters and models); docs/ARCHITECTURE.md maps every module.
Every exception the package defines derives from ``specverify.SpecverifyError``
(:mod:`specverify.errors`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from specverify.errors import SpecverifyError

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers
    from specverify.auditing.audit_report import AuditReport
    from specverify.auditing.loading import LoadError
    from specverify.auditing.runner import assert_lossless, audit
    from specverify.core.outputs import ImpossibleOutput, MalformedOutput
    from specverify.hf.packaged import ModelNotInstalledError

__version__ = "0.2.0"

_LAZY = {
    "audit": "specverify.auditing.runner",
    "assert_lossless": "specverify.auditing.runner",
    "AuditReport": "specverify.auditing.audit_report",
    "LoadError": "specverify.auditing.loading",
    "MalformedOutput": "specverify.core.outputs",
    "ImpossibleOutput": "specverify.core.outputs",
    "ModelNotInstalledError": "specverify.hf.packaged",
}
"""Public name -> the module that defines it, imported on first use."""


def __getattr__(name: str) -> Any:
    """The audit entry points and the exceptions users catch import their modules (torch, scipy)
    on first use, so that ``specverify speedup`` and ``specverify models list`` start instantly."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'specverify' has no attribute {name!r}")


__all__ = ["__version__", "audit", "assert_lossless", "AuditReport", "SpecverifyError", "LoadError",
           "MalformedOutput", "ImpossibleOutput", "ModelNotInstalledError"]
