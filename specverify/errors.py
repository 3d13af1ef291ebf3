"""The one base class of specverify's exceptions.

``except specverify.SpecverifyError`` catches every error the package raises about its inputs or the
code under audit: a malformed or impossible output (:mod:`specverify.core.outputs`), a target
that cannot be loaded (:mod:`specverify.auditing.loading`), a fault of the audited function and a
lost worker (:mod:`specverify.auditing.isolation`), a packaged model that is not installed
(:mod:`specverify.hf.packaged`).  The errors about invalid arguments also derive from
``ValueError``, so ``except ValueError`` keeps catching them.
"""

from __future__ import annotations


class SpecverifyError(Exception):
    """Base class of every exception specverify defines."""
