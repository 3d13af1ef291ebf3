"""Checks a battery leaves out for this function, each with the reason and the one-line fix.

A battery builds its checks from what the function offers: the exact checks need the optional
``uniforms=`` keyword of docs/spec.md, the ragged-batch checks ``num_draft_tokens=``, and the
tree level audits only the sibling schemes a function declares in ``draft_schemes``.  A check
left out silently would make a shorter audit look like the whole one, so the plan, the verdict
and every report name each omission (:class:`Omission`) with what to change to get it: the whole
note once per run (in the plan when a progress display writes one, else in the report), the
names alone in the verdict.

Each battery lists its own with :meth:`specverify.auditing.checks.Battery.omitted` (none by
default); the sampler and tree levels' are read here from the session's function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specverify.auditing.audited import AuditSession
    from specverify.auditing.checks import Battery
    from specverify.auditing.tree.battery import TreeSession

UNIFORMS_FIX = ("add a keyword argument `*, uniforms=None` (float64 [B, K+1] in [0, 1): column i < K accepts draft "
                "i iff u_i·q_i(x_i) < p_i(x_i), column K draws the final token by inverse CDF; docs/spec.md §1)")
"""The fix at the sampler level: the chain's uniform convention."""

TREE_UNIFORMS_FIX = ("add a keyword argument `*, uniforms=None` (float64 [B, N+1] in [0, 1): column n < N accepts "
                     "node n, when it is tested, iff u_n·q_n(x_n) < p(x_n), column N draws the final token by "
                     "inverse CDF; docs/spec.md §3, specverify.core.tree_rules)")
"""The fix at the tree level: the tree's uniform convention (one column per node, N nodes)."""


RAGGED_FIX = ("add a keyword argument `*, num_draft_tokens=None` (int64 [B]: row b uses only its first k_b <= K "
              "drafts, the other columns are padding to ignore; docs/spec.md §1)")


@dataclass(frozen=True)
class Omission:
    """``names``: the checks not run; ``reason``: why; ``fix``: what gives them."""

    names: tuple[str, ...]
    reason: str
    fix: str

    def names_text(self) -> str:
        """The checks not run, or their count and the first three."""
        if len(self.names) <= 4:
            return ", ".join(self.names)
        return f"{len(self.names)} checks ({', '.join(self.names[:3])}, …)"

    def line(self) -> str:
        return f"not run: {self.names_text()}: {self.reason}; to run it: {self.fix}"


def omitted_checks(battery: Battery, session: AuditSession) -> list[Omission]:
    """What ``battery`` leaves out for the function of ``session`` (see the module docstring)."""
    return list(battery.omitted(session))


def _takes(session: AuditSession, keyword: str) -> bool | None:
    """Whether the session's function takes ``keyword`` (None when there is no Python function to ask)."""
    from specverify.core.rules import accepts_keyword

    raw = session.function.raw
    if raw is None:
        return None
    try:
        return bool(accepts_keyword(raw, keyword))
    except Exception:
        return None


def _takes_uniforms(session: AuditSession) -> bool | None:
    return _takes(session, "uniforms")


def sampler_omissions(session: AuditSession) -> list[Omission]:
    """The sampler level's: the exact checks without ``uniforms=``, the ragged ones without ``num_draft_tokens=``."""
    found = []
    ragged = _takes(session, "num_draft_tokens")
    if _takes_uniforms(session) is False:
        exact = ("exact-step", "exact-ragged-drafts") if ragged else ("exact-step",)
        found.append(Omission(exact, "the function takes no `uniforms=` keyword, so its law cannot be "
                              "integrated exactly (the sampled checks still run)", UNIFORMS_FIX))
    if ragged is False:
        found.append(Omission(("ragged-drafts", "exact-ragged-drafts"), "the function takes no `num_draft_tokens=` "
                              "keyword, so batches whose rows have different draft counts are not audited",
                              RAGGED_FIX))
    return found


def tree_omissions(session: TreeSession) -> list[Omission]:
    """The tree level's: the exact check without ``uniforms=``, the schemes ``draft_schemes`` leaves out."""
    from specverify.core.tree_rules import DRAFT_SCHEMES

    found = []
    if _takes_uniforms(session) is False:
        found.append(Omission(("exact-tree-step",), "the function takes no `uniforms=` keyword, so its law cannot be "
                              "integrated exactly (the sampled checks still run)", TREE_UNIFORMS_FIX))
    schemes: Sequence[str] = session.schemes
    missing = [s for s in DRAFT_SCHEMES if s not in schemes]
    if missing and not session.scheme_error:
        names = tuple(f"tree-{kind}-{scheme}" for scheme in missing
                      for kind in ("siblings", "branches", "deep", "loop", "acceptance"))
        names += ("tree-fan-out-independent",) if "independent" in missing else ()
        declared = ", ".join(repr(s) for s in schemes)
        found.append(Omission(names, f"the function declares draft_schemes = ({declared},), so trees drafted "
                              f"{' or '.join(missing)} are not audited",
                              f"add {' and '.join(repr(s) for s in missing)} to `draft_schemes` if the function "
                              "verifies such trees (or remove the attribute to audit every scheme)"))
    return found


def omitted_names(omissions: Sequence[Omission]) -> set[str]:
    return {name for omission in omissions for name in omission.names}
