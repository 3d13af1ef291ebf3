"""The call each level makes (docs/spec.md), and a function whose signature cannot take it.

A function with the wrong signature raises the same ``TypeError`` in every check; an audit that
runs them all reports one error 25 times.  :func:`signature_problem` binds the level's call to the
function's signature before any check runs, so the audit stops at once with one message that
shows both signatures.  Functions without a readable signature (C extensions) are not judged
here; their calls still are.
"""

from __future__ import annotations

import inspect
from typing import Any

SPEC_SIGNATURES: dict[str, str] = {
    "sampler": "verify(target_probs, draft_probs, draft_tokens, generator)",
    "tree": "verify_tree(target_probs, draft_probs, tree_tokens, parents, generator)",
    "decoder": "generate(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p, seed)",
}
"""The signature of each level, as docs/spec.md prints it (§1, §3, §2)."""

SPEC_SECTIONS = {"sampler": "§1", "decoder": "§2", "tree": "§3"}

_CALLS: dict[str, tuple[int, tuple[str, ...]]] = {
    "sampler": (4, ()),
    "tree": (5, ()),
    "decoder": (3, ("max_new_tokens", "temperature", "top_k", "top_p", "seed")),
}
"""How the audit calls the function: positional arguments, keyword arguments."""


def expected_signature(level: str) -> str:
    """``verify(target_probs, ...) (docs/spec.md §1)`` for ``level`` ("" for a level without one)."""
    if level not in SPEC_SIGNATURES:
        return ""
    return f"{SPEC_SIGNATURES[level]} (docs/spec.md {SPEC_SECTIONS[level]})"


def signature_problem(level: str, fn: Any, name: str | None = None) -> str | None:
    """Why ``fn`` cannot take the call of ``level`` (None when it can, or when its signature
    cannot be read; a signature without parameters counts as unreadable, which is what a worker
    reports for a function it could not inspect).  ``name``: how to call the function in the message."""
    if level not in _CALLS or fn is None:
        return None
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    if not signature.parameters:
        return None
    positional, keywords = _CALLS[level]
    try:
        signature.bind(*range(positional), **{name: None for name in keywords})
    except TypeError as error:
        name = name or getattr(fn, "__name__", None) or SPEC_SIGNATURES[level].split("(")[0]
        return (f"the function's signature {name}{_shown(signature)} cannot take the {level} level's call ({error}); "
                f"the audit calls {expected_signature(level)}. Wrap the function in an adapter with that "
                "signature (docs/writing-an-adapter.md)")
    return None


def _shown(signature: inspect.Signature) -> str:
    """The signature without annotations (what a reader compares with the spec's)."""
    parameters = [parameter.replace(annotation=inspect.Parameter.empty) for parameter in signature.parameters.values()]
    return str(signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty))


def is_call_type_error(message: str) -> bool:
    """Whether a check's error message is a ``TypeError`` raised by the function (often a call
    the signature cannot take, where the signature could not be read beforehand)."""
    return "raised TypeError" in message
