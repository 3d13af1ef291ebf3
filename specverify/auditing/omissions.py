"""Checks a battery leaves out for this function, each with the reason and the one-line fix.

A battery builds its checks from what the function offers: the exact checks need the optional
``uniforms=`` keyword of docs/spec.md, and the tree level audits only the sibling schemes a
function declares in ``draft_schemes``.  A check left out silently would make a shorter audit
look like the whole one, so the plan, the verdict and every report name each omission
(:class:`Omission`) with what to change to get it.

A battery may list its own with ``omitted(session) -> list[Omission]``; the built-in levels are
read here from the session, without changing their batteries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

UNIFORMS_FIX = ("add a keyword argument `*, uniforms=None` (float64 [B, K+1] in [0, 1): column i < K accepts draft "
                "i iff u_i·q_i(x_i) < p_i(x_i), column K draws the final token by inverse CDF; docs/spec.md §1)")


@dataclass(frozen=True)
class Omission:
    """``names``: the checks not run; ``reason``: why; ``fix``: what gives them."""

    names: tuple[str, ...]
    reason: str
    fix: str

    def line(self) -> str:
        shown = (", ".join(self.names) if len(self.names) <= 4
                 else f"{len(self.names)} checks ({', '.join(self.names[:3])}, …)")
        return f"not run: {shown}: {self.reason}; to run it: {self.fix}"


def omitted_checks(level: str, battery: Any, session: Any) -> list[Omission]:
    """What ``battery`` leaves out for the function of ``session`` (see the module docstring)."""
    own = getattr(battery, "omitted", None)
    if callable(own):
        return list(own(session))
    if level == "sampler":
        return _sampler(session)
    if level == "tree":
        return _tree(session)
    return []


def _takes_uniforms(session: Any) -> bool | None:
    from specverify.core.rules import accepts_uniforms

    raw = getattr(session, "raw", None)
    if raw is None:
        return None
    try:
        return bool(accepts_uniforms(raw))
    except Exception:
        return None


def _sampler(session: Any) -> list[Omission]:
    if _takes_uniforms(session) is not False:
        return []
    return [Omission(("exact-step",), "the function takes no `uniforms=` keyword, so its law cannot be integrated "
                     "exactly (the sampled checks still run)", UNIFORMS_FIX)]


def _tree(session: Any) -> list[Omission]:
    from specverify.core.tree_rules import DRAFT_SCHEMES

    found = []
    if _takes_uniforms(session) is False:
        found.append(Omission(("exact-tree-step",), "the function takes no `uniforms=` keyword, so its law cannot be "
                              "integrated exactly (the sampled checks still run)",
                              UNIFORMS_FIX.replace("docs/spec.md §1", "docs/spec.md §1 and §3")))
    schemes: Sequence[str] = tuple(getattr(session, "schemes", DRAFT_SCHEMES))
    missing = [s for s in DRAFT_SCHEMES if s not in schemes]
    if missing and not getattr(session, "scheme_error", None):
        names = tuple(f"tree-{kind}-{scheme}" for scheme in missing
                      for kind in ("siblings", "branches", "deep", "loop", "acceptance"))
        declared = ", ".join(repr(s) for s in schemes)
        found.append(Omission(names, f"the function declares draft_schemes = ({declared},), so trees drafted "
                              f"{' or '.join(missing)} are not audited",
                              f"add {' and '.join(repr(s) for s in missing)} to `draft_schemes` if the function "
                              "verifies such trees (or remove the attribute to audit every scheme)"))
    return found


def omitted_names(omissions: Sequence[Omission]) -> set[str]:
    return {name for omission in omissions for name in omission.names}
