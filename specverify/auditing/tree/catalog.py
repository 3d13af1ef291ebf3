"""Known-bug catalog for tree verifiers (SPEC §3): buggy recursive rejection samplers.

Each entry is a :class:`BuggyTreeRule` whose ``fn`` has the SPEC §3 signature plus ``uniforms=``
(``fn(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None)``
returning ``emitted [B, N+1]``) and follows the uniform convention of
:mod:`specverify.core.tree_rules`, so its exact law is computable
(:func:`specverify.core.tree_exact.exact_tree_step_tv`).  The entries aim at the failure classes
of tree verification in real engines: the residual between siblings, the position a node's
children are scored at, the bonus node, the accepted path's bookkeeping, duplicates, the sibling
scheme the verifier assumes, thresholds and the last sibling's fallback; and six that are exact
on small trees and wrong only at production shapes (positions below depth 3, a fourth child,
depth-first layouts, V ≥ 5, calls of at most 4 rows, a parent more than 32 positions back),
built by factories (:func:`positions_capped_at`, :func:`residual_in_slots`,
:func:`target_law_cached_as_top`, :func:`small_batch_path_up_to`, :func:`parent_offset_saturating_at`)
whose other parameters give other bugs of the same classes.  ``witness`` is a small case (chain,
shape, scheme) on which the exact TV of the entry (or of its ``scale_model``) is positive; the
self-test (``properties/test_tree_catalog_selftest.py``) computes it and checks that the tree
audit kills every entry.

The correct rule, for reference: at the current node with law ``p``, test its children in index
order, accepting ``c`` iff ``u_c q_c(x_c) < p(x_c)``; after a rejection ``p ← (p − q_c)+``
normalised; an accepted child becomes the current node with the target law at *its* path
(``target_probs[c + 1]``); at the end emit the path and one token drawn from ``p`` with ``u_N``.
Every entry changes one piece, marked ``# BUG``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specverify.core.chains import MarkovChain, random_markov_chain
from specverify.core.sampling import inverse_cdf
from specverify.core.tree_rules import (
    emit_path,
    step_uniforms,
    thresholded_tree_verify,
    validate_tree_inputs,
)

__all__ = ["PARENT_WINDOW", "TREE_CATALOG", "BuggyTreeRule", "parent_offset_saturating_at", "positions_capped_at",
           "residual_in_slots", "rows_at_a_time",
           "small_batch_path_up_to", "target_law_cached_as_top", "witness_chain", "witness_rule"]


@dataclass(frozen=True)
class BuggyTreeRule:
    """One entry: ``name``, the exact mathematical error (``description``), what it is modelled on,
    its ``bug_class``, the rule ``fn``, and a ``witness`` ``(V, order, seed, closeness, parents,
    scheme)``: on :func:`witness_chain` (``random_markov_chain(V, order, seed, closeness=closeness)``)
    with trees of shape ``parents`` drawn by ``scheme`` the entry's exact TV is positive.  An
    entry wrong only on calls of few rows has ``rows_per_call``: its witness TV is that of the
    rule called on that many rows at a time (:func:`witness_rule`).  An entry wrong only on trees
    too large to integrate exactly (a parent more than 32 positions before its child: 33 nodes or
    more, and the integration grid is a product over every node's uniform) has a ``scale_model``:
    the same mistake at a scale the witness reaches, whose exact TV the witness is; the
    production-shape checks kill ``fn`` itself, and the exact check, whose trees are small, passes it."""

    name: str
    description: str
    modelled_on: str
    bug_class: str
    fn: Callable[..., torch.Tensor]
    witness: tuple[int, int, int, float, tuple[int, ...], str]
    rows_per_call: int | None = None
    scale_model: Callable[..., torch.Tensor] | None = None


def witness_chain(entry: BuggyTreeRule) -> MarkovChain:
    """The chain of an entry's witness case."""
    vocab, order, seed, closeness, _, _ = entry.witness
    return random_markov_chain(vocab, order, seed, closeness=closeness)


def witness_rule(entry: BuggyTreeRule) -> Callable[..., torch.Tensor]:
    """The entry's rule as its witness TV is computed: ``fn`` itself, ``fn`` called on
    ``rows_per_call`` rows at a time (:func:`rows_at_a_time`), or the entry's ``scale_model``."""
    if entry.scale_model is not None:
        return entry.scale_model
    return entry.fn if entry.rows_per_call is None else rows_at_a_time(entry.fn, entry.rows_per_call)


def rows_at_a_time(fn: Callable[..., torch.Tensor], rows: int) -> Callable[..., torch.Tensor]:
    """``fn`` (SPEC §3 with ``uniforms=``) applied to consecutive groups of ``rows`` rows, the
    outputs concatenated: what the rule emits when an engine calls it with small batches."""
    def grouped(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
        parts = []
        for start in range(0, tree_tokens.shape[0], rows):
            part = slice(start, start + rows)
            parts.append(fn(target_probs[part], draft_probs[part], tree_tokens[part], parents[part], generator,
                            uniforms=None if uniforms is None else uniforms[part]))
        return torch.cat(parts)

    return grouped


# ------------------------------------------------------------------------------------------------
# A walker with hooks: the correct rule when every hook has its default
# ------------------------------------------------------------------------------------------------


def _at(rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return rows.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@dataclass
class _Step:
    """What a hook sees: the inputs (float64), the node under test and the walk's state."""

    p: torch.Tensor  # [B, N+1, V]
    q: torch.Tensor  # [B, N, V]
    tokens: torch.Tensor  # [B, N]
    parents: torch.Tensor  # [B, N]
    u: torch.Tensor  # [B, N+1]
    current: torch.Tensor  # [B]
    r: torch.Tensor  # [B, V] current unnormalised law
    s: torch.Tensor  # [B] its total
    last_u: torch.Tensor  # [B] uniform of the last rejected node since the last acceptance (else u_N)
    node: int = 0


def _default_accept(step: _Step, q_row: torch.Tensor) -> torch.Tensor:
    x = step.tokens[:, step.node].clamp(min=0)
    return step.u[:, step.node] * _at(q_row, x) * step.s < _at(step.r, x)


def _default_residual(step: _Step, q_row: torch.Tensor) -> torch.Tensor:
    return (step.r - step.s[:, None] * q_row).clamp(min=0)


def _default_fresh(step: _Step) -> torch.Tensor:
    return step.p[:, step.node + 1]


def _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, *,
          q_row: Callable[[_Step], torch.Tensor] = lambda step: step.q[:, step.node],
          accept: Callable[[_Step, torch.Tensor], torch.Tensor] = _default_accept,
          residual: Callable[[_Step, torch.Tensor], torch.Tensor] = _default_residual,
          fresh: Callable[[_Step], torch.Tensor] = _default_fresh,
          tested_extra: Callable[[_Step], torch.Tensor] | None = None,
          tested: Callable[[_Step], torch.Tensor] | None = None,
          final: Callable[[_Step, torch.Tensor], torch.Tensor] | None = None,
          emit: Callable[[_Step, torch.Tensor], torch.Tensor] | None = None,
          final_uniform: Callable[[_Step], torch.Tensor] = lambda step: step.u[:, -1]) -> torch.Tensor:
    validate_tree_inputs(target_probs, draft_probs, tree_tokens, parents, generator, uniforms=uniforms)
    u = step_uniforms(target_probs, generator, uniforms)
    batch, positions, _ = target_probs.shape
    p = target_probs.to(torch.float64)
    step = _Step(p, draft_probs.to(torch.float64), tree_tokens, parents, u,
                 current=torch.full((batch,), -1, dtype=torch.int64), r=p[:, 0].clone(),
                 s=torch.ones(batch, dtype=torch.float64), last_u=u[:, -1].clone())
    p_node = step.r.clone()
    for n in range(positions - 1):
        step.node = n
        if tested is None:
            is_tested = (tree_tokens[:, n] >= 0) & (parents[:, n] == step.current)
        else:
            is_tested = (tree_tokens[:, n] >= 0) & tested(step)
        if tested_extra is not None:
            is_tested = is_tested & tested_extra(step)
        row = q_row(step)
        accepted = is_tested & accept(step, row)
        rejected = is_tested & ~accepted
        updated = residual(step, row)
        total = updated.sum(-1)
        keep = rejected & (total > 0)
        step.r = torch.where(keep[:, None], updated, step.r)
        step.s = torch.where(keep, total, step.s)
        new_law = fresh(step)
        step.current = torch.where(accepted, n, step.current)
        step.r = torch.where(accepted[:, None], new_law, step.r)
        p_node = torch.where(accepted[:, None], new_law, p_node)
        step.s = torch.where(accepted, 1.0, step.s)
        step.last_u = torch.where(rejected, u[:, n], torch.where(accepted, u[:, -1], step.last_u))
    weights = step.r.clone() if final is None else final(step, p_node)
    final_token = inverse_cdf(weights, final_uniform(step), in_place=True)
    if emit is not None:
        return emit(step, final_token)
    return emit_path(tree_tokens, parents, step.current, final_token)[0]


# ------------------------------------------------------------------------------------------------
# The entries
# ------------------------------------------------------------------------------------------------


def residual_not_updated(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """Every sibling tested against the parent's unchanged p; the final token from p too."""
    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms,
                 residual=lambda step, q_row: step.r)  # BUG: no residual update


def residual_with_previous_node_q(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """After rejecting node n the residual subtracts the draft row of node n-1 (an off-by-one)."""
    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms,
                 residual=lambda step, q_row: (step.r - step.s[:, None] * step.q[:, max(step.node - 1, 0)])
                 .clamp(min=0))  # BUG


def children_scored_at_parent_position(target_probs, draft_probs, tree_tokens, parents, generator=None, *,
                                       uniforms=None):
    """An accepted node's children (and its bonus) are scored with the target law at the node's
    parent, ``target_probs[parent + 1]``, instead of at the node, ``target_probs[n + 1]``."""
    def parent_row(step: _Step) -> torch.Tensor:
        rows = torch.arange(step.p.shape[0])
        return step.p[rows, step.parents[:, step.node] + 1]  # BUG: the parent's position

    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, fresh=parent_row)


def bonus_from_parent(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """At an accepted leaf the bonus token is drawn from the leaf's parent's law."""
    def final(step: _Step, p_node: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(step.p.shape[0])
        has_child = ((step.parents == step.current[:, None]) & (step.tokens >= 0)).any(-1)
        leaf = (step.current >= 0) & ~has_child
        parent = step.parents[rows, step.current.clamp(min=0)]
        return torch.where(leaf[:, None], step.p[rows, parent + 1], step.r)  # BUG: parent's row at a leaf

    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, final=final)


def path_jumps_branches(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """The accepted path is written out as the first ``depth`` nodes in index order (as for a
    chain) instead of following ``parents`` from the last accepted node."""
    def emit(step: _Step, final_token: torch.Tensor) -> torch.Tensor:
        _, depth = emit_path(step.tokens, step.parents, step.current, final_token)
        columns = torch.arange(step.tokens.shape[1] + 1)
        padded = torch.cat([step.tokens, torch.zeros_like(step.tokens[:, :1])], dim=1)
        emitted = torch.where(columns < depth[:, None], padded, -1)  # BUG: nodes 0..depth-1, not the path
        return torch.where(columns == depth[:, None], final_token[:, None], emitted)

    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, emit=emit)


def duplicate_sibling_counted_twice(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """Siblings with equal tokens (independent drafts) are merged: rejecting the first copy
    subtracts ``m · q`` for its ``m`` copies in one go, and the later copies are skipped."""
    def multiplicity(step: _Step) -> torch.Tensor:
        n = step.node
        same = (step.parents == step.parents[:, n:n + 1]) & (step.tokens == step.tokens[:, n:n + 1])
        return (same & (torch.arange(step.tokens.shape[1]) >= n)).sum(-1).to(torch.float64)

    def earlier_copy(step: _Step) -> torch.Tensor:
        n = step.node
        same = (step.parents[:, :n] == step.parents[:, n:n + 1]) & (step.tokens[:, :n] == step.tokens[:, n:n + 1])
        return ~same.any(-1)  # BUG: later copies are never tested

    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, tested_extra=earlier_copy,
                 residual=lambda step, q_row: (step.r - (multiplicity(step) * step.s)[:, None] * q_row)
                 .clamp(min=0))  # BUG


def _first_sibling_row(step: _Step) -> torch.Tensor:
    """The draft row of the first child of node ``n``'s parent (the unrenormalised law)."""
    n = step.node
    first = ((step.parents[:, : n + 1] == step.parents[:, n:n + 1]).to(torch.int64).argmax(-1))
    return step.q[torch.arange(step.q.shape[0]), first]


def without_replacement_as_independent(target_probs, draft_probs, tree_tokens, parents, generator=None, *,
                                       uniforms=None):
    """Siblings drawn without replacement verified as if independent: every sibling's test and
    residual use the parent's draft law (the first sibling's row), not the renormalised law it was drawn from."""
    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, q_row=_first_sibling_row)  # BUG


def residual_with_first_sibling_q(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """The accept test uses each sibling's own law, but the residual after a rejection subtracts
    the first sibling's row (a per-parent cache, right only for independent siblings)."""
    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms,
                 residual=lambda step, q_row: _default_residual(step, _first_sibling_row(step)))  # BUG


def deterministic_verified_with_soft_q(target_probs, draft_probs, tree_tokens, parents, generator=None, *,
                                       uniforms=None):
    """Deterministic (top-k) children verified with a soft draft law: every child of a node is
    taken to have been drawn from the uniform law over the node's child tokens."""
    def soft_row(step: _Step) -> torch.Tensor:
        n = step.node
        siblings = (step.parents == step.parents[:, n:n + 1]) & (step.tokens >= 0)
        law = torch.zeros_like(step.q[:, n])
        law.scatter_add_(-1, step.tokens.clamp(min=0), siblings.to(torch.float64))
        return law / law.sum(-1, keepdim=True)  # BUG: soft probabilities for one-hot drafts

    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, q_row=soft_row)


def acceptance_threshold_below_one(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """SGLang-style relaxed acceptance: ``threshold_acc = 0.7`` (accept with ``min(1, p/(0.7 q))``)."""
    return thresholded_tree_verify(target_probs, draft_probs, tree_tokens, parents, generator, uniforms=uniforms,
                                   threshold_single=1.0, threshold_acc=0.7).emitted  # BUG: threshold < 1


def last_rejection_falls_back_to_argmax(target_probs, draft_probs, tree_tokens, parents, generator=None, *,
                                        uniforms=None):
    """When every child of the final node was rejected, the token is the argmax of the residual
    instead of a draw from it (at a leaf the bonus is still sampled)."""
    def final(step: _Step, p_node: torch.Tensor) -> torch.Tensor:
        has_child = ((step.parents == step.current[:, None]) & (step.tokens >= 0)).any(-1)
        argmax = torch.nn.functional.one_hot(step.r.argmax(-1), step.r.shape[-1]).to(torch.float64)
        return torch.where(has_child[:, None], argmax, step.r)  # BUG: argmax after the last rejection

    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, final=final)


def final_token_from_unreduced_p(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """Residuals are updated between siblings, but after the last rejection the token is drawn
    from the node's original target law instead of the residual."""
    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms,
                 final=lambda step, p_node: p_node.clone())  # BUG: p, not the residual


def final_draw_reuses_accept_uniform(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """After a rejection the final token is drawn with the rejected child's accept uniform
    (conditioned on ``u ≥ p/q``) instead of the fresh column ``N``."""
    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms,
                 final_uniform=lambda step: step.last_u)  # BUG: reuses a conditioned uniform


# ------------------------------------------------------------------------------------------------
# Production shapes: wrong only beyond small trees (deep paths, many children, depth-first
# layouts, V > 4, small batches)
# ------------------------------------------------------------------------------------------------


def _depth(parents: torch.Tensor) -> torch.Tensor:
    """``[B, N]``: each node's depth (1 for a child of the root)."""
    depth = torch.zeros_like(parents)
    for n in range(parents.shape[1]):
        parent = parents[:, n]
        depth[:, n] = torch.where(parent >= 0, depth.gather(-1, parent.clamp(min=0)[:, None]).squeeze(-1), 0) + 1
    return depth


def positions_capped_at(cap: int) -> Callable[..., torch.Tensor]:
    """The rule whose node positions are computed with at most ``cap`` parent hops: an accepted
    node at depth d > ``cap`` continues with the law of its ancestor at depth ``cap``."""
    def rule(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
        depth = _depth(parents)
        ancestor = torch.arange(parents.shape[1]).expand_as(parents).clone()
        for _ in range(parents.shape[1]):  # climb every node deeper than the cap to its ancestor at the cap
            deep = depth.gather(-1, ancestor) > cap
            ancestor = torch.where(deep, parents.gather(-1, ancestor).clamp(min=0), ancestor)

        def capped_row(step: _Step) -> torch.Tensor:
            rows = torch.arange(step.p.shape[0])
            return step.p[rows, ancestor[:, step.node] + 1]  # BUG: the capped ancestor's law

        return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, fresh=capped_row)

    return rule


def _module_level(fn: Callable[..., torch.Tensor], name: str, doc: str) -> Callable[..., torch.Tensor]:
    """``fn`` named as the module attribute it is bound to (so that it pickles by reference into
    the audit's worker), with its own docstring."""
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


positions_capped_at_depth_three = _module_level(positions_capped_at(3), "positions_capped_at_depth_three", """\
A node's target row is found through its position, computed with at most three parent
hops: an accepted node at depth d ≥ 4 continues with the law of its ancestor at depth 3.""")


def residual_in_slots(slots: int) -> Callable[..., torch.Tensor]:
    """The rule whose children's test laws live in ``slots`` per-node slots (p and the residuals
    after the first ``slots − 1`` rejections): children after the ``slots``-th are tested against
    the last slot, and the final draw after them uses that slot's residual."""
    def rule(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
        slot = {}

        def law(step: _Step) -> tuple[torch.Tensor, torch.Tensor]:
            n = step.node
            rank = ((step.parents[:, :n] == step.parents[:, n:n + 1]) & (step.tokens[:, :n] >= 0)).sum(-1)
            if "r" not in slot:
                slot["r"], slot["s"] = step.r.clone(), step.s.clone()
            tested = (step.parents[:, n] == step.current) & (step.tokens[:, n] >= 0)
            last = tested & (rank == slots - 1)
            slot["r"] = torch.where(last[:, None], step.r, slot["r"])
            slot["s"] = torch.where(last, step.s, slot["s"])
            late = rank >= slots  # BUG: no further slot
            return torch.where(late[:, None], slot["r"], step.r), torch.where(late, slot["s"], step.s)

        def accept(step: _Step, q_row: torch.Tensor) -> torch.Tensor:
            r, s = law(step)
            x = step.tokens[:, step.node].clamp(min=0)
            return step.u[:, step.node] * _at(q_row, x) * s < _at(r, x)

        def residual(step: _Step, q_row: torch.Tensor) -> torch.Tensor:
            r, s = law(step)
            return (r - s[:, None] * q_row).clamp(min=0)

        return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, accept=accept,
                     residual=residual)

    return rule


residual_in_three_slots = _module_level(residual_in_slots(3), "residual_in_three_slots", """\
The laws a node's children are tested against live in three per-node slots (p and the
residuals after the first and second rejections): the 4th and later children are tested
against the third slot, and the final draw after them uses that slot's residual.""")


def siblings_assumed_contiguous(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """The children of the current node are taken to be the ``k`` nodes from its first child on
    (``k`` its number of children), as in a breadth-first layout: in a depth-first layout the
    first child's descendants are tested as siblings and the later children never."""
    def contiguous(step: _Step) -> torch.Tensor:
        is_child = (step.parents == step.current[:, None]) & (step.tokens >= 0)
        count = is_child.sum(-1)
        first = is_child.to(torch.int64).argmax(-1)
        return (count > 0) & (step.node >= first) & (step.node < first + count)  # BUG: siblings adjacent

    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, tested=contiguous)


def target_law_cached_as_top(entries: int) -> Callable[..., torch.Tensor]:
    """The rule that caches each node's target law as its top ``entries`` entries, renormalised."""
    def rule(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
        top = target_probs.to(torch.float64).topk(min(entries, target_probs.shape[-1]), dim=-1)
        cached = torch.zeros_like(target_probs, dtype=torch.float64).scatter_(-1, top.indices, top.values)  # BUG
        return _walk(cached / cached.sum(-1, keepdim=True), draft_probs, tree_tokens, parents, generator, uniforms)

    return rule


target_law_cached_as_top_entries = _module_level(target_law_cached_as_top(4), "target_law_cached_as_top_entries", """\
Each node's target law is cached as its top 4 entries, renormalised (a sparse cache sized
for small vocabularies): exact for V ≤ 4, for V ≥ 5 the tokens outside a law's top 4 are
never accepted nor drawn.""")


def small_batch_path_up_to(rows: int) -> Callable[..., torch.Tensor]:
    """The rule whose calls of at most ``rows`` rows take a latency path that draws the final
    token after a rejection from the node's target law p instead of the residual."""
    def rule(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
        if tree_tokens.shape[0] <= rows:
            return final_token_from_unreduced_p(target_probs, draft_probs, tree_tokens, parents, generator,
                                                uniforms=uniforms)  # BUG: on the small-batch path
        return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms)

    return rule


SMALL_BATCH_ROWS = 4
"""Calls of at most this many rows take the separate path of :func:`small_batch_path`."""

small_batch_path = _module_level(small_batch_path_up_to(SMALL_BATCH_ROWS), "small_batch_path", """\
Calls of at most 4 rows take a separate latency path whose final token after a rejection is
drawn from the node's target law p instead of the residual; larger calls are exact.""")


def parent_offset_saturating_at(window: int) -> Callable[..., torch.Tensor]:
    """The rule that reads each node's parent as an offset of at most ``window`` positions back
    (the root at position 0, node ``n`` at ``n + 1``): a node more than ``window`` positions after
    its parent (``n − parents[n] > window``, the root's index being −1) is taken as a child of node
    ``n − window``, so it is tested when that node is current, never under its own parent; the
    accepted path is emitted along the real parents."""
    def rule(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
        nodes = torch.arange(parents.shape[1])
        read = torch.where(nodes - parents > window, nodes - window, parents)  # BUG: the offset saturates

        def tested(step: _Step) -> torch.Tensor:
            return read[:, step.node] == step.current

        return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, tested=tested)

    return rule


PARENT_WINDOW = 32
"""The window of offsets :func:`parent_offset_saturates_at_32` reads parents in: trees of 33 nodes or more show it."""

parent_offset_saturates_at_32 = _module_level(parent_offset_saturating_at(PARENT_WINDOW),
                                              "parent_offset_saturates_at_32", """\
Each node's parent is read as an offset of at most 32 positions back: a node more than 32
positions after its parent (the root at position 0, node n at n + 1) is tested as a child of
node n − 32 instead (exact on trees of up to 32 nodes).""")

_ENTRIES = (
    BuggyTreeRule("residual_not_updated", "Each child tested against the parent's unchanged p, the final token "
                  "drawn from p: min(p, q) is accepted once per sibling, so drafted tokens are over-emitted.",
                  "chain verification applied to each sibling in turn", "residual", residual_not_updated,
                  (4, 1, 1, 0.0, (-1, -1), "independent")),
    BuggyTreeRule("residual_with_previous_node_q", "The residual after rejecting node n subtracts q_{n-1} instead "
                  "of q_n: the next sibling is tested against (p − q_{n−1})+, not (p − q_n)+.",
                  "an off-by-one in the sibling loop's draft index", "residual", residual_with_previous_node_q,
                  (3, 1, 1, 0.0, (-1, 0, 0), "independent")),
    BuggyTreeRule("children_scored_at_parent_position", "An accepted node's children and bonus use target_probs"
                  "[parent + 1] (the law one level up) instead of target_probs[n + 1].",
                  "a tree position-id / gather off by one level", "indexing", children_scored_at_parent_position,
                  (3, 1, 1, 0.0, (-1, 0), "independent")),
    BuggyTreeRule("bonus_from_parent", "At an accepted leaf the bonus token is drawn from the parent's law "
                  "target_probs[parent + 1] instead of the leaf's target_probs[leaf + 1].",
                  "bonus gathered at the wrong node index", "bonus", bonus_from_parent,
                  (3, 1, 1, 0.0, (-1, 0), "independent")),
    BuggyTreeRule("path_jumps_branches", "The accepted path is emitted as nodes 0..depth−1 in index order, so an "
                  "accepted second branch is reported with the first branch's tokens.",
                  "tree paths written out as if the tree were a chain", "indexing", path_jumps_branches,
                  (3, 1, 1, 0.0, (-1, -1, 1), "independent")),
    BuggyTreeRule("duplicate_sibling_counted_twice", "Equal sibling tokens are merged: rejecting the first copy "
                  "subtracts m·q at once and the copies are skipped, so the residual is (p − m q)+ instead of "
                  "((p − q)+/Z − q)+.", "deduplicated candidates with multiplicity", "duplicates",
                  duplicate_sibling_counted_twice, (3, 0, 3, 0.0, (-1, -1, -1), "independent")),
    BuggyTreeRule("without_replacement_as_independent", "Siblings drawn without replacement verified with the "
                  "parent's draft law q for every sibling, not the renormalised law each was drawn from.",
                  "a verifier built for SpecInfer-style i.i.d. siblings fed RSD-style drafts", "scheme",
                  without_replacement_as_independent, (3, 0, 3, 0.0, (-1, -1), "without_replacement")),
    BuggyTreeRule("residual_with_first_sibling_q", "Accept tests use each sibling's own law but every residual "
                  "subtracts the first sibling's row (a per-parent cache): wrong under sampling without replacement.",
                  "caching q per parent node", "residual", residual_with_first_sibling_q,
                  (4, 0, 2, 0.0, (-1, -1, -1), "without_replacement")),
    BuggyTreeRule("deterministic_verified_with_soft_q", "Top-k children (one-hot drafts) verified as draws from "
                  "the uniform law over the child tokens: accept min(1, k p(x)), residual (p − 1/k)+.",
                  "deterministic drafts verified with the draft's soft probabilities", "scheme",
                  deterministic_verified_with_soft_q, (3, 1, 2, 0.0, (-1, -1), "deterministic")),
    BuggyTreeRule("acceptance_threshold_below_one", "Accept with min(1, p/(0.7 q)) (SGLang threshold_acc = 0.7): "
                  "more than min(p, q) of each drafted token is accepted.",
                  "SGLang speculative_accept_threshold_acc < 1", "thresholds", acceptance_threshold_below_one,
                  (4, 1, 1, 0.0, (-1, -1), "independent")),
    BuggyTreeRule("last_rejection_falls_back_to_argmax", "After the last sibling's rejection the token is the "
                  "residual's argmax instead of a draw from it.", "greedy fallback in a sampling path",
                  "correction", last_rejection_falls_back_to_argmax, (4, 0, 2, 0.0, (-1,), "independent")),
    BuggyTreeRule("final_token_from_unreduced_p", "After the last rejection the token is drawn from the node's "
                  "target law p instead of the residual (p − q_last)+ chain.", "residual dropped at the end",
                  "correction", final_token_from_unreduced_p, (4, 1, 1, 0.0, (-1, -1), "independent")),
    BuggyTreeRule("final_draw_reuses_accept_uniform", "After the last rejection the final token is drawn by inverse "
                  "CDF with the rejected child's accept uniform, which is conditioned on u ≥ p(x)/q(x).",
                  "one random number reused for the test and the correction", "randomness",
                  final_draw_reuses_accept_uniform, (4, 0, 2, 0.5, (-1,), "independent")),
    BuggyTreeRule("positions_capped_at_depth_three", "Node positions computed with at most three parent hops: "
                  "an accepted node at depth d ≥ 4 continues (its children's tests, the bonus) with the target law "
                  "of its depth-3 ancestor instead of target_probs[n + 1].",
                  "a position / depth table sized for shallow trees", "indexing", positions_capped_at_depth_three,
                  (2, 1, 3, 0.9, (-1, 0, 1, 2), "independent")),
    BuggyTreeRule("residual_in_three_slots", "A node's test laws live in three slots (p, the residuals after the "
                  "1st and 2nd rejections): the 4th and later children are tested against the 2nd residual and "
                  "the final draw after them starts from it, instead of the running residual.",
                  "a per-node residual buffer of fixed size", "residual", residual_in_three_slots,
                  (5, 1, 1, 0.0, (-1, -1, -1, -1), "deterministic")),
    BuggyTreeRule("siblings_assumed_contiguous", "The current node's children are taken to be the k nodes from its "
                  "first child on (k = its number of children): right in breadth-first layouts; in depth-first ones "
                  "descendants of the first child are tested as its siblings and later children never.",
                  "child ranges [first_child, first_child + num_children) of a breadth-first kernel", "indexing",
                  siblings_assumed_contiguous, (3, 1, 1, 0.0, (-1, 0, -1), "independent")),
    BuggyTreeRule("target_law_cached_as_top_entries", "Every target row is replaced by its top 4 entries, "
                  "renormalised: tokens outside a law's top 4 are never accepted nor drawn (exact for V ≤ 4).",
                  "a sparse top-k cache of the target's probabilities", "vocabulary",
                  target_law_cached_as_top_entries, (5, 1, 1, 0.0, (-1,), "independent")),
    BuggyTreeRule("small_batch_path", "Calls of at most 4 rows take a latency path whose final token after a "
                  "rejection is drawn from the node's target law p instead of the residual; larger calls are exact.",
                  "a separate small-batch kernel", "batch", small_batch_path, (4, 1, 1, 0.0, (-1,), "independent"),
                  rows_per_call=SMALL_BATCH_ROWS),
    BuggyTreeRule("parent_offset_saturates_at_32", "A node's parent is read as an offset of at most 32 positions "
                  "back (the root at position 0, node n at n + 1): a node more than 32 positions after its parent is "
                  "tested as a child of node n − 32 (against that node's law, when it is current) and never under "
                  "its own parent; exact on trees of up to 32 nodes.",
                  "parent pointers packed as offsets into a window of 32 nodes (a 32-bit ancestor mask per node), "
                  "saturating for farther parents", "indexing", parent_offset_saturates_at_32,
                  (3, 1, 1, 0.0, (-1, -1, 0), "independent"), scale_model=parent_offset_saturating_at(1)),
)

TREE_CATALOG: dict[str, BuggyTreeRule] = {entry.name: entry for entry in _ENTRIES}
