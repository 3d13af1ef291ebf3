"""``specverify audit --list``: the built-in targets and the known-bug catalog.

Catalog entries are shown with their bug class, their exact one-step loss and their whole
description, wrapped.  The listing imports nothing heavy (no torch: it prints in well under a
second): the entries' names, classes and descriptions are read from the source of
:mod:`specverify.auditing.sampler.catalog` (:func:`catalog_entries`; ``tests/cli/test_newuser_cli.py``
checks them against the imported ``CATALOG``) and the exact losses are stored.  The exact loss is
the total variation between the entry's completed one-step law and the target's, integrated over
the uniforms by :func:`specverify.core.exact.exact_step_tv` on
:data:`EXAMPLE` (V = 4, K = 2, the hand example of ``tests/auditing/test_catalog.py``); a
cross-row entry is measured on a row of it next to :data:`COMPANION_TARGET`, a different request
in the same batch; the two randomness entries ignore injected uniforms, so they have no exact
loss (the audit catches them by reproducibility and statistics).  Names are accepted with
hyphens or underscores (``catalog:residual-is-target``).
"""

from __future__ import annotations

import ast
import functools
import textwrap
from pathlib import Path
from typing import Any

EXAMPLE_TARGET = ((0.0, 0.2, 0.4, 0.4), (0.1, 0.2, 0.3, 0.4), (0.25, 0.25, 0.25, 0.25))
EXAMPLE_DRAFT = ((0.4, 0.4, 0.1, 0.1), (0.4, 0.3, 0.2, 0.1))
COMPANION_TARGET = ((0.0, 0.0, 0.0, 1.0), (0.1, 0.2, 0.3, 0.4), (0.25, 0.25, 0.25, 0.25))


def _with_companion_row(rule: Any) -> Any:
    """``rule`` called with every row followed by a companion request (target COMPANION_TARGET,
    same drafts and uniforms); returns the original rows only."""
    import torch

    companion = torch.tensor(COMPANION_TARGET, dtype=torch.float64)

    def paired(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
        targets = target_probs.repeat_interleave(2, dim=0)
        targets[1::2] = companion.to(targets.dtype)
        emitted = rule(targets, draft_probs.repeat_interleave(2, dim=0), draft_tokens.repeat_interleave(2, dim=0),
                       generator, uniforms=uniforms.repeat_interleave(2, dim=0))
        return emitted[0::2]

    return paired


STORED_EXACT_TV: dict[str, float | None] = {
    "zero_uniform_accepts": 0.003125, "residual_is_target": 0.12, "residual_softmax": 0.255334,
    "residual_absolute": 0.3, "bonus_from_draft": 0.048, "bonus_from_previous_position": 0.048,
    "target_off_by_one": 0.165, "inverted_ratio": 0.6275, "correction_one_position_late": 0.19,
    "shared_accept_uniform": 0.04, "correction_reuses_accept_uniform": 0.12,
    "draft_temperature_in_acceptance": 0.018746, "batch_rows_rolled": 0.3,
    "greedy_acceptance_when_sampling": 0.06, "counts_every_passing_test": 0.36, "global_torch_rng": None,
    "reseeded_every_call": None, "typical_acceptance": 0.32,
}
""":func:`exact_tv` of every entry, rounded to 6 decimals and stored so that ``--list`` is instant
(the integration takes ~10 s of CPU); ``tests/cli/test_newuser_cli.py`` recomputes them."""

RAGGED_EXACT_TV: dict[str, float | None] = {
    "ragged_bonus_at_padded_position": 0.3, "ragged_offsets_from_padded_width": None,
    "ragged_empty_row_takes_next_bonus": None, "ragged_last_row_padding_read": None,
}
"""The ragged-row entries (exact on full rows): ``exact.exact_step_tv(fn, example, 0, width=2)``, the
law of a row of :data:`EXAMPLE_TARGET` with no drafts among two padded columns
(tests/auditing/test_ragged.py recomputes it); None where that row alone shows no loss."""

PRODUCTION_EXACT_TV: dict[str, float | None] = {
    "vocabulary_tile_drops_high_ids": 0.128464, "partial_last_tile_dropped": 0.011581,
    "half_precision_cdf_at_large_vocab": 0.000229, "bonus_library_top_k": 0.005356,
    "bonus_tempered_at_large_vocab": 0.000198,
    "draft_length_specialised_kernel": 0.247955, "draft_length_specialised_to_16": 0.217026,
    "bfloat16_cdf_path": 0.003471,
    "row_block_offset_dropped": None, "contiguous_stride_reads": None,
}
"""The production-shape entries (exact TV 0 on the toy example): the exact TV that the
``exact-large-vocabulary`` check integrates (its largest case; tests/auditing/test_audit.py
recomputes them); None for the entries it cannot integrate one row at a time (a row block of
256 rows; reads through a padded view), which the production step checks catch."""


@functools.cache
def exact_tv(name: str) -> float | None:
    """Exact one-step TV of catalog entry ``name`` on :data:`EXAMPLE` (None if not integrable)."""
    import numpy as np

    from specverify.auditing.sampler.catalog import CATALOG
    from specverify.core import exact
    from specverify.core.chains import PositionalChain

    entry = CATALOG[name]
    if not entry.integrable:
        return None
    rule = entry.fn if entry.min_batch_size == 1 else _with_companion_row(entry.fn)
    return exact.exact_step_tv(rule, PositionalChain(np.array(EXAMPLE_TARGET), np.array(EXAMPLE_DRAFT)), 2)


CATALOG_SOURCE = Path(__file__).resolve().parents[1] / "auditing" / "sampler" / "catalog.py"
DECODER_CATALOG_SOURCE = Path(__file__).resolve().parents[1] / "auditing" / "decoder" / "catalog.py"
"""The catalog's source, read by :func:`catalog_entries` (importing it would import torch)."""

DESCRIPTION_WIDTH = 100
"""Columns of a wrapped catalog description (indented under its entry)."""


def catalog_entries(source: Path = CATALOG_SOURCE,
                    positional: tuple[str, ...] = ("name", "description", "bug_class")) -> list[tuple[str, str, str]]:
    """``(name, bug_class, description)`` of every ``BuggyRule(...)`` in the catalog's ``_ENTRIES``,
    in order, evaluated from the source: string literals, and f-strings over the module's
    upper-case constants."""
    return [(fields["name"], fields["bug_class"], fields["description"])
            for fields in _entry_fields(source, positional)]


def decoder_catalog_tvs(source: Path = DECODER_CATALOG_SOURCE) -> dict[str, float | None]:
    """The ``tv=`` of every ``BuggyDecoder(...)`` of the decoder catalog's source, by name (None: not given)."""
    return {fields["name"]: fields.get("tv") for fields in _entry_fields(source, ("name", "description", "bug_class"))}


def _entry_fields(source: Path, positional: tuple[str, ...]) -> list[dict[str, Any]]:
    """The literal fields (name, bug_class, description, tv) of every call in the source's ``_ENTRIES``."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    constants: dict[str, Any] = {}
    entries: list[dict[str, Any]] = []
    for node in tree.body:
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            target = node.target  # `_ENTRIES += [...]`
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = node.targets[0]
        else:
            continue
        name = target.id
        if name == "_ENTRIES" and isinstance(node.value, (ast.List, ast.Tuple)):
            for call in node.value.elts:
                assert isinstance(call, ast.Call)
                fields = {field: _evaluate(value, constants) for field, value in zip(positional, call.args)
                          if field in ("name", "bug_class", "description")}
                fields.update({k.arg: _evaluate(k.value, constants) for k in call.keywords
                               if k.arg in ("name", "bug_class", "description", "tv")})
                entries.append(fields)
        elif name.isupper():
            constants[name] = _evaluate(node.value, constants)
    return entries


def _evaluate(node: ast.expr, constants: dict[str, Any]) -> Any:
    """The value of a constant expression of the catalog's source (None where it is not one)."""
    try:
        return eval(compile(ast.Expression(node), str(CATALOG_SOURCE), "eval"), {"__builtins__": {}}, dict(constants))
    except Exception:
        return None


def listing() -> str:
    """The text ``specverify audit --list`` prints."""
    from specverify.auditing.loading import BUILTINS

    lines = ["Built-in targets (specverify audit NAME [--level LEVEL]):"]
    for level, names in BUILTINS.items():
        for name, location in names.items():
            lines.append(f"  {name:<33} {level:<8} {location}")
    lines += ["", "Known-bug catalog (specverify audit catalog:NAME; hyphens or underscores). Exact TV: the exact "
              "loss of one step on the V = 4, K = 2 example (specverify.cli.listing):",
              f"  {'name':<33} {'class':<16} {'exact TV':>9}", "      what is wrong"]
    for name, bug_class, description in catalog_entries():
        if name in RAGGED_EXACT_TV:
            tv = RAGGED_EXACT_TV[name]
            shown = "—‡" if tv is None else f"{tv:.4f}‡"
        elif name in PRODUCTION_EXACT_TV:
            tv = PRODUCTION_EXACT_TV[name]
            shown = "—†" if tv is None else f"{tv:.4f}*"
        else:
            tv = STORED_EXACT_TV[name] if name in STORED_EXACT_TV else exact_tv(name)
            shown = "—" if tv is None else f"{tv:.4f}"
        lines.append(f"  {name.replace('_', '-'):<33} {bug_class:<16} {shown:>9}")
        lines += textwrap.wrap(description, DESCRIPTION_WIDTH, initial_indent="      ", subsequent_indent="      ",
                               break_long_words=False, break_on_hyphens=False)
    lines.append("  (—: a randomness bug; it ignores injected uniforms, so it has no exact loss and is caught by "
                 "the randomness-source check)")
    lines.append("  (*: a production-shape bug, exact on the toy example; its exact TV at the production case of "
                 "exact-large-vocabulary; —†: not integrable one row at a time, caught by the production-* checks)")
    lines.append("  (‡: a ragged-row bug (num_draft_tokens=), exact on full rows; its exact TV on a row of the "
                 "example with k = 0 drafts padded to K = 2; —‡: it emits impossible outputs there or needs other "
                 "rows, caught by exact-ragged-drafts and ragged-drafts)")
    lines += ["", "Decoder catalog (specverify audit --level decoder catalog:NAME): the reference decoder with one "
              "mistake; ε̄: its TV on the position-law check, by Monte Carlo (—: emits tokens top-k/top-p forbid, "
              "a certain loss):",
              f"  {'name':<36} {'class':<11} {'ε̄':>6}", "      what is wrong"]
    tvs = decoder_catalog_tvs()
    for name, bug_class, description in catalog_entries(DECODER_CATALOG_SOURCE):
        tv = tvs[name]
        lines.append(f"  {name.replace('_', '-'):<36} {bug_class:<11} {'—' if tv is None else f'{tv:.3f}':>6}")
        lines += textwrap.wrap(description, DESCRIPTION_WIDTH, initial_indent="      ", subsequent_indent="      ",
                               break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines)
