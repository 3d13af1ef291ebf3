"""specverify: prove speculative decoding lossless, or catch it when it is not.

``specverify.audit(fn)`` returns an audit report and ``specverify.assert_lossless(fn)`` raises
``AssertionError`` unless no loss was detected.  (``specverify.audit`` names the function; import
the rest of the audit module with ``from specverify.audit import ...``.)
"""

__version__ = "0.1.0"

# Imported eagerly: a lazy module __getattr__ would be shadowed by the submodule ``specverify.audit``
# as soon as anything imported it, turning ``specverify.audit(...)`` into a call of a module.
from specverify.audit import AuditReport, assert_lossless, audit  # noqa: E402

__all__ = ["__version__", "audit", "assert_lossless", "AuditReport"]
