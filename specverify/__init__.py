"""specverify: prove speculative decoding lossless, or catch it when it is not.

``specverify.audit(fn)`` returns an audit report and ``specverify.assert_lossless(fn)`` raises
``AssertionError`` unless no loss was detected.  The package is grouped by purpose:
``specverify.core`` (rules, exact laws, statistics), ``specverify.testing`` (strategies, harness,
pytest plugin), ``specverify.auditing`` (checks, levels, catalog, reports), ``specverify.cli`` and
``specverify.hf`` (Hugging Face adapters and models); docs/ARCHITECTURE.md maps every module.
"""

__version__ = "0.2.0"

_LAZY = ("audit", "assert_lossless", "AuditReport")


def __getattr__(name: str):
    """``audit``, ``assert_lossless`` and ``AuditReport`` import the audit machinery (torch, scipy)
    on first use, so that ``specverify speedup`` and ``specverify models list`` start instantly."""
    if name in _LAZY:
        from specverify.auditing import runner

        value = getattr(runner, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'specverify' has no attribute {name!r}")


__all__ = ["__version__", "audit", "assert_lossless", "AuditReport"]
