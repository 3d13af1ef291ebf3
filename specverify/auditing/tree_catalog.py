"""Known-bug catalog for tree verifiers (SPEC §3): buggy recursive rejection samplers.

Each entry is a :class:`BuggyTreeRule` whose ``fn`` has the SPEC §3 signature plus ``uniforms=``
(``fn(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None)``
returning ``emitted [B, N+1]``) and follows the uniform convention of
:mod:`specverify.core.tree_rules`, so its exact law is computable
(:func:`specverify.core.tree_exact.exact_tree_step_tv`).  The entries aim at the failure classes
of tree verification in real engines: the residual between siblings, the position a node's
children are scored at, the bonus node, the accepted path's bookkeeping, duplicates, the sibling
scheme the verifier assumes, thresholds and the last sibling's fallback.  ``witness`` is a small
case (chain, shape, scheme) on which the entry's exact TV is positive; the self-test
(``properties/test_tree_catalog_selftest.py``) computes it and checks that the tree audit kills
every entry.

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

__all__ = ["TREE_CATALOG", "BuggyTreeRule", "witness_chain"]


@dataclass(frozen=True)
class BuggyTreeRule:
    """One entry: ``name``, the exact mathematical error (``description``), what it is modelled on,
    its ``bug_class``, the rule ``fn``, and a ``witness`` ``(V, order, seed, closeness, parents,
    scheme)``: on :func:`witness_chain` (``random_markov_chain(V, order, seed, closeness=closeness)``)
    with trees of shape ``parents`` drawn by ``scheme`` the entry's exact TV is positive."""

    name: str
    description: str
    modelled_on: str
    bug_class: str
    fn: Callable[..., torch.Tensor]
    witness: tuple[int, int, int, float, tuple[int, ...], str]


def witness_chain(entry: BuggyTreeRule) -> MarkovChain:
    """The chain of an entry's witness case."""
    vocab, order, seed, closeness, _, _ = entry.witness
    return random_markov_chain(vocab, order, seed, closeness=closeness)


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
    node: int = 0
    current: torch.Tensor | None = None  # [B]
    r: torch.Tensor | None = None  # [B, V] current unnormalised law
    s: torch.Tensor | None = None  # [B] its total
    last_u: torch.Tensor | None = None  # [B] uniform of the last rejected node since the last acceptance (else u_N)


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
          final: Callable[[_Step, torch.Tensor], torch.Tensor] | None = None,
          emit: Callable[[_Step, torch.Tensor], torch.Tensor] | None = None,
          final_uniform: Callable[[_Step], torch.Tensor] = lambda step: step.u[:, -1]) -> torch.Tensor:
    validate_tree_inputs(target_probs, draft_probs, tree_tokens, parents, generator, uniforms=uniforms)
    u = step_uniforms(target_probs, generator, uniforms)
    batch, positions, _ = target_probs.shape
    step = _Step(target_probs.to(torch.float64), draft_probs.to(torch.float64), tree_tokens, parents, u)
    step.current = torch.full((batch,), -1, dtype=torch.int64)
    step.r = step.p[:, 0].clone()
    step.s = torch.ones(batch, dtype=torch.float64)
    step.last_u = u[:, -1].clone()
    p_node = step.r.clone()
    for n in range(positions - 1):
        step.node = n
        tested = (tree_tokens[:, n] >= 0) & (parents[:, n] == step.current)
        if tested_extra is not None:
            tested = tested & tested_extra(step)
        row = q_row(step)
        accepted = tested & accept(step, row)
        rejected = tested & ~accepted
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
                 residual=lambda step, q_row: (step.r - step.s[:, None] * step.q[:, max(step.node - 1, 0)]).clamp(min=0))  # BUG


def children_scored_at_parent_position(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
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
                 residual=lambda step, q_row: (step.r - (multiplicity(step) * step.s)[:, None] * q_row).clamp(min=0))  # BUG


def _first_sibling_row(step: _Step) -> torch.Tensor:
    """The draft row of the first child of node ``n``'s parent (the unrenormalised law)."""
    n = step.node
    first = ((step.parents[:, : n + 1] == step.parents[:, n:n + 1]).to(torch.int64).argmax(-1))
    return step.q[torch.arange(step.q.shape[0]), first]


def without_replacement_as_independent(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """Siblings drawn without replacement verified as if independent: every sibling's test and
    residual use the parent's draft law (the first sibling's row), not the renormalised law it was drawn from."""
    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, q_row=_first_sibling_row)  # BUG


def residual_with_first_sibling_q(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
    """The accept test uses each sibling's own law, but the residual after a rejection subtracts
    the first sibling's row (a per-parent cache, right only for independent siblings)."""
    return _walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms,
                 residual=lambda step, q_row: _default_residual(step, _first_sibling_row(step)))  # BUG


def deterministic_verified_with_soft_q(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
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


def last_rejection_falls_back_to_argmax(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
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
                  "bonus gathered at the wrong node index", "bonus", bonus_from_parent, (3, 1, 1, 0.0, (-1, 0), "independent")),
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
)

TREE_CATALOG: dict[str, BuggyTreeRule] = {entry.name: entry for entry in _ENTRIES}
