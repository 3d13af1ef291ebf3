"""Presets: named budgets for a gate, each a named budget plus the checks it runs at every level.

A preset is what a user picks for a place in their workflow: ``pre-commit`` (seconds: the exact and
contract checks and the quickest statistical ones, at ``quick``) or ``nightly`` (the whole battery
the function's declarations give, at ``thorough``, every check run).  Its statistical checks are
sized by a named budget like any other (:class:`specverify.auditing.checks.SampleBudget`), so each
detects the budget's TV with power 0.99 at its Bonferroni share of α and the verdict states that
TV: a preset never passes a run too small to detect what it claims, and the power rule
(:mod:`specverify.auditing.power`) holds as for a budget.  What a preset leaves out is named in
the plan and the report, with the preset that runs it.

Importable without torch (the CLI's parser reads :data:`PRESETS`).  ``specverify audit --preset
NAME``, ``audit(fn, preset=NAME)``, ``assert_lossless(fn, preset=NAME)``, ``--specverify-preset NAME``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """``budget``: the named budget its statistical checks are sized by; ``checks``: per level, the
    check names it runs (``fnmatch`` patterns: ``tree-siblings-*`` is that check under every
    declared sibling scheme), None for the whole battery; ``fail_fast``: its default (None: the
    budget's); ``covers``: what it is for, one sentence."""

    name: str
    budget: str
    checks: Mapping[str, tuple[str, ...] | None]
    fail_fast: bool | None
    covers: str

    def select(self, level: str, available: Sequence[str]) -> list[str] | None:
        """The names among ``available`` (the battery's checks for this function, with those it
        leaves out) this preset runs at ``level``, in the battery's order; None for all."""
        patterns = self.checks.get(level)
        if patterns is None:
            return None
        return [name for name in available if any(fnmatch.fnmatchcase(name, p) for p in patterns)]

    def note(self, level: str, selected: Sequence[str], left_out: Sequence[str]) -> str:
        """The plan's line: what the preset runs at ``level`` and what it leaves out."""
        line = f"preset {self.name}: {self.covers}; budget {self.budget}"
        if not left_out:
            return f"{line}; every check of the battery"
        return (
            f"{line}; {len(selected)} checks; left out: {', '.join(left_out)} "
            f"(`--preset nightly` or `--budget {self.budget}` without --checks runs them)"
        )


EXACT_SAMPLER = ("randomness-source", "exact-step", "exact-ragged-drafts", "inputs-unchanged", "outputs-unaliased")
EXACT_TREE = ("randomness-source", "exact-tree-step", "inputs-unchanged", "outputs-unaliased")
EXACT_DECODER = ("determinism", "seed-sensitivity", "greedy-identity", "inputs-unchanged", "models-unchanged")

PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            name="pre-commit",
            budget="quick",
            checks={
                # the exact and contract checks; step-K2 (a draft, its correction and the bonus jointly) and the
                # two locating checks, each sized for TV 0.05 at its share of α
                "sampler": (*EXACT_SAMPLER, "step-K2", "bonus-position", "correction-position"),
                # siblings and the acceptance law under every declared scheme, TV 0.05
                "tree": (*EXACT_TREE, "tree-siblings-*", "tree-acceptance-*"),
                # exact checks only: position-laws (2,019 generate calls at quick) is nightly's
                "decoder": EXACT_DECODER,
                # whole-sequence greedy identity and the sampled law by PIT at T = 1 (TV 0.1)
                "endpoint": ("greedy-identity", "pit-T1-top8"),
            },
            fail_fast=True,
            covers="the exact and contract checks and the quickest statistical ones, for seconds before a commit "
            "(no production shapes, batching, late calls or decoding loops; at the decoder level no sampled "
            "law)",
        ),
        Preset(
            name="nightly",
            budget="thorough",
            checks={"sampler": None, "tree": None, "decoder": None, "endpoint": None},
            fail_fast=False,
            covers="every check the function's declarations give (uniforms=, num_draft_tokens=, draft_schemes), "
            "each run to the end, at the thorough budget",
        ),
    )
}


def resolve_preset(name: str) -> Preset:
    """The :class:`Preset` named ``name``; ``ValueError`` naming ``preset`` and the known names."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in PRESETS:
        raise ValueError(f"preset: expected one of {', '.join(PRESETS)}, got {name!r}")
    return PRESETS[key]
