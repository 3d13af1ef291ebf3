"""Catalog entries with the ``uniforms=`` keyword hidden, as audit targets.

``specverify audit benchmarks/without_uniforms.py:residual_is_target`` audits the catalog's
``residual_is_target`` through a wrapper whose signature is SPEC §1's alone, so the audit cannot
integrate it exactly (no ``exact-step`` check) and must find the loss by sampling: the path every
implementation without ``uniforms=`` takes.  Used by ``benchmarks/time_to_verdict.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def without_uniforms(rule: Callable[..., Any]) -> Callable[..., Any]:
    """``rule`` behind the plain SPEC §1 signature ``verify(target_probs, draft_probs, draft_tokens, generator)``."""

    def verify(target_probs: Any, draft_probs: Any, draft_tokens: Any, generator: Any) -> Any:
        return rule(target_probs, draft_probs, draft_tokens, generator)

    verify.__name__ = verify.__qualname__ = getattr(rule, "__name__", "verify")
    return verify


def __getattr__(name: str) -> Callable[..., Any]:
    from specverify.auditing.sampler.catalog import CATALOG

    if name not in CATALOG:
        raise AttributeError(f"no catalog entry {name!r}; known: {', '.join(sorted(CATALOG))}")
    return without_uniforms(CATALOG[name].fn)
