"""Verification rules over a draft *tree*: one step, vectorised over a batch of ragged trees.

Layout (SPEC §3): ``tree_tokens [B, N]`` and ``parents [B, N]`` int64, ``target_probs [B, N+1, V]``,
``draft_probs [B, N, V]``.  Node ``n`` of row ``b`` has parent ``parents[b, n]`` (``-1``: a child of
the root, i.e. of the context's last token; else an earlier node); ``target_probs[b, 0]`` is the
target's law after the context and ``target_probs[b, n+1]`` its law after the path root → ``n``
(node ``n`` included); ``draft_probs[b, n]`` is the law node ``n`` was drawn from.  Absent nodes
(``tree_tokens == -1``, parent ``-1``) come last.  Every rule returns
``TreeVerifyResult(emitted [B, N+1], num_accepted [B], last_node [B])``.

The lossless rule is *recursive rejection sampling* over the tree (SpecInfer's multi-step
speculative sampling, Miao et al. 2024, "SpecInfer: Accelerating Large Language Model Serving
with Tree-based Speculative Inference and Verification", §4.2 and Theorem 4.2; Jeon et al. 2024,
"Recursive Speculative Decoding: Accelerating LLM Inference via Sampling Without Replacement",
§3; Yang et al. 2024, "Multi-Candidate Speculative Decoding"):

    node := root, p := target law at the root
    for each child c of node, in index order:
        accept c with probability min(1, p(x_c) / q_c(x_c));
        if accepted: node := c, p := target law at c, and continue with c's children;
        else:        p := (p − q_c)+ / Σ (p − q_c)+
    emit the path root → node, then one token drawn from p
    (the residual after all of node's children were rejected, or the bonus law at a leaf).

Theorem (the output is distributed as target sampling).  Fix a node with current law ``p`` and
children ``c_1..c_k`` whose tokens were drawn one after another, ``x_i ~ q_i`` where ``q_i`` may
depend on ``x_1..x_{i-1}`` (independent siblings: ``q_i = q``; without replacement: ``q`` with the
earlier tokens removed, renormalised; deterministic: one-hot).  Claim: the token the node's
sibling loop settles on (an accepted child's token, or the final draw) is distributed as ``p``,
whatever the tokens drawn so far.  By induction from the last sibling: with ``r = (p − q_i)+``,
``P(settle on t) = q_i(t) min(1, p(t)/q_i(t)) + (Σ_x (q_i(x) − p(x))+) · r(t)/Σ r
= min(p(t), q_i(t)) + (p(t) − q_i(t))+ = p(t)``, because ``Σ (q_i − p)+ = Σ (p − q_i)+`` and the
later stage (induction hypothesis) draws from ``r`` normalised whatever ``x_i`` was; with no sibling
left the rule draws from ``p`` itself.  Given that the loop settled on an accepted child ``c``,
``c``'s subtree was drawn from the draft along the path to ``c`` independently of the acceptance
coins, so the argument applies again at ``c`` with ``p`` = the target's law after the path: every
emitted token follows the target given the tokens before it (Miao et al. Theorem 4.2; Jeon et al.
Theorem 3.1).  Completion by target sampling after the step then gives the target's law of any
number of tokens, and so does chaining steps.

The deterministic case (top-k children, n-gram lookups: ``q_c = onehot(x_c)``) accepts ``c`` iff
``u_c < p(x_c)`` and the residual is ``p`` without ``x_c``, renormalised: in law this is sampling
``t ~ p`` and descending into the child whose token is ``t`` (SGLang's "target only" tree
sampling).  A chain (``parents = [-1, 0, …, N-2]``) is modified rejection sampling
(:func:`specverify.core.rules.rejection_sample`), and with the same uniforms it emits the same
tokens.

Uniform convention (shared by every rule here, by :mod:`specverify.core.tree_exact` and by the
tree catalog): the randomness of one step is ``u [B, N+1]`` in ``[0, 1)``:

- column ``n < N``: the accept test of node ``n`` (used only if node ``n`` is tested, i.e. its
  parent is accepted and its earlier siblings rejected): accept iff ``u_n · q_n(x_n) < p(x_n)``;
- column ``N``: the final (correction-or-bonus) token, the first ``t`` with
  ``cumsum(r)[t] > u_N · Σ r`` for the final (unnormalised) law ``r``.

With a ``generator`` instead, a rule draws exactly
``torch.rand(B, N+1, generator=generator, dtype=torch.float64, device=target_probs.device)``.

Numerics: the current law is kept per row as an unnormalised float64 ``[B, V]`` row ``r`` with
total ``s`` (a target row as given counts as normalised, ``s = 1``, exactly as in the chain rule);
the test ``u q(x) s < r(x)`` equals ``u q(x) < r(x)/s``.  A rejection implies
``q(x) > p(x)``, so the exact residual has positive mass; if the float64 residual has none (rounding),
the law is left unchanged (an event of probability at most the rows' rounding error).

Lossy rules, kept so that users and tests see them caught (**each marked LOSSY**):
:func:`typical_acceptance_tree_verify` (Medusa), :func:`unchanged_target_tree_verify` (each child
tested against the unchanged ``p``), :func:`thresholded_tree_verify` (acceptance thresholds < 1).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import NamedTuple

import torch

from specverify.core import native_rules
from specverify.core.rules import (
    _check_device,
    _distribution_problems,
    _native_screen_limit,
    _rows_look_valid,
    check_randomness_source,
)
from specverify.core.sampling import inverse_cdf

DRAFT_SCHEMES = ("independent", "without_replacement", "deterministic")
"""The ways of drawing siblings that SPEC §3 names (``verify_tree.draft_schemes``)."""


class TreeVerifyResult(NamedTuple):
    """Outcome of one tree verification step.

    emitted: int64 ``[B, N+1]``: the accepted path's tokens, then one correction-or-bonus token, then -1.
    num_accepted: int64 ``[B]``: the accepted path's length (its depth, ``0..N``).
    last_node: int64 ``[B]``: the deepest accepted node (``-1``: none, the final token follows the root).
    """

    emitted: torch.Tensor
    num_accepted: torch.Tensor
    last_node: torch.Tensor


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def validate_tree_inputs(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    needs_randomness: bool = True,
) -> None:
    """Raise ``ValueError`` naming the argument when the inputs of a tree step are invalid.

    Structure: tensor types, dtypes (float probabilities, int64 tokens and parents), shapes
    ``[B, N+1, V]``, ``[B, N, V]``, ``[B, N]``, ``[B, N]`` with ``N >= 1``, one device.  Tree: a
    present node's parent is ``-1`` or an *earlier* node (a later or equal index is a forward
    reference; following such parents in a loop is reported as a cycle); absent nodes
    (``tree_tokens == -1``) come last and have parent ``-1``; present tokens lie in ``[0, V)``.
    Values on the rows in use (target row 0 and ``n+1``, draft row ``n`` of present nodes): no
    NaN/Inf, no negative entry, rows sum to 1 within :func:`specverify.core.rules.row_sum_tolerance`,
    and ``q_n(x_n) > 0`` (a token of draft probability 0 could not have been drawn).  With
    ``needs_randomness`` exactly one of ``generator`` and ``uniforms [B, N+1]`` (finite, in
    ``[0, 1)``) is required.
    """
    _check_tree_structure(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, needs_randomness)
    batch, positions, vocab = target_probs.shape
    num_nodes = positions - 1
    present = tree_tokens != -1
    index = torch.arange(num_nodes, device=tree_tokens.device)

    problems: list[tuple[str, torch.Tensor]] = []
    problems.append((f"tree_tokens: token ids must be -1 (absent node) or lie in [0, V) = [0, {vocab}); "
                     "map the draft's ids into the target vocabulary", (tree_tokens < -1) | (tree_tokens >= vocab)))
    problems.append(("tree_tokens: an absent node (-1) comes before a present node; absent nodes must come "
                     "last (compact each row's nodes to the front)",
                     present & ~present.to(torch.int64).cumprod(-1).bool()))
    problems.append(("parents: an absent node (tree_tokens == -1) must have parent -1", ~present & (parents != -1)))
    problems.append((f"parents: entries must be -1 or a node index in [0, N) = [0, {num_nodes})",
                     present & ((parents < -1) | (parents >= num_nodes))))
    cycle = present & _on_cycle(parents.clamp(-1, num_nodes - 1), num_nodes)
    problems.append(("parents: the parent pointers form a cycle; every node must descend from the root "
                     "(parent -1) through earlier nodes", cycle))
    problems.append(("parents: a node's parent must be an earlier node (parents[b, n] < n), so that every "
                     "node comes after its parent; reorder the nodes (e.g. breadth-first)",
                     present & ~cycle & (parents >= index)))
    safe_parents = parents.clamp(-1, num_nodes - 1)
    parent_present = torch.where(safe_parents >= 0, present.gather(-1, safe_parents.clamp(min=0)), True)
    problems.append(("parents: a present node's parent is an absent node", present & ~parent_present))

    target_used = torch.cat([torch.ones(batch, 1, dtype=torch.bool, device=present.device), present], dim=1)
    q_problem = torch.zeros_like(present)  # no draft law: no token can lack draft probability
    if draft_probs is not None:
        safe_tokens = torch.where(present & (tree_tokens >= 0) & (tree_tokens < vocab), tree_tokens, 0)
        q_at_token = draft_probs.gather(-1, safe_tokens.unsqueeze(-1)).squeeze(-1)
        q_problem = present & (tree_tokens < vocab) & (q_at_token <= 0)
    uniform_problem = ~((uniforms >= 0) & (uniforms < 1)) if uniforms is not None else None

    # The screen (one host sync): the structure masks, then per probability row a sign-bit minimum
    # and a row sum (rules._rows_look_valid: it passes only finite, non-negative rows summing to 1).
    # Only flagged inputs build the detailed row masks below, which word the first error.
    screen = [mask.any() for _, mask in problems]
    screen.append(~(_rows_look_valid(target_probs) | ~target_used).all())
    if draft_probs is not None:
        screen += [~(_rows_look_valid(draft_probs) | ~present).all(), q_problem.any()]
    if uniform_problem is not None:
        screen.append(uniform_problem.any())
    if not bool(torch.stack(screen).any()):
        return

    problems += _distribution_problems("target_probs", target_probs, target_used)
    if draft_probs is not None:
        problems += _distribution_problems("draft_probs", draft_probs, present)
        problems.append(("draft_probs: a node's token has draft probability 0, so it could not have been drawn "
                         "from draft_probs; pass the law each node was actually sampled from (one-hot for "
                         "deterministic children)", q_problem))
    if uniform_problem is not None:
        problems.append(("uniforms: values must be finite and lie in [0, 1); draw them with torch.rand",
                         uniform_problem))

    flags = torch.stack([mask.any() for _, mask in problems]).tolist()
    for (message, mask), flagged in zip(problems, flags):
        if flagged:
            first = tuple(int(i) for i in mask.nonzero()[0].tolist())
            raise ValueError(f"{message} (first offending index {first})")


def _on_cycle(parents: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """bool ``[B, N]``: node lies on (or below) a parent loop: N parent steps do not reach the root."""
    ancestor = parents.clone()
    for _ in range(num_nodes):
        ancestor = torch.where(ancestor >= 0, parents.gather(-1, ancestor.clamp(min=0)), ancestor)
    return ancestor >= 0


def _check_tree_structure(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, tree_tokens: torch.Tensor,
                          parents: torch.Tensor, generator: torch.Generator | None, uniforms: torch.Tensor | None,
                          needs_randomness: bool) -> None:
    """Types, dtypes, shapes, devices and the generator/uniforms choice (no device reads)."""
    for name, tensor in (("target_probs", target_probs), ("tree_tokens", tree_tokens), ("parents", parents)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
    if not target_probs.is_floating_point():
        raise ValueError(f"target_probs: expected a floating-point tensor of probabilities, got {target_probs.dtype}")
    if target_probs.dim() != 3:
        raise ValueError(f"target_probs: expected shape [B, N+1, V], got {list(target_probs.shape)}")
    batch, positions, vocab = target_probs.shape
    if positions < 2:
        raise ValueError(f"target_probs: N = {positions - 1} nodes; a tree step needs N >= 1 "
                         "(target_probs [B, N+1, V] with N+1 >= 2)")
    if vocab < 1:
        raise ValueError("target_probs: the vocabulary dimension V is empty")
    device, num_nodes = target_probs.device, positions - 1
    for name, tensor in (("tree_tokens", tree_tokens), ("parents", parents)):
        if tensor.dtype != torch.int64:
            raise ValueError(f"{name}: expected dtype torch.int64, got {tensor.dtype}; use .long()")
        if tuple(tensor.shape) != (batch, num_nodes):
            raise ValueError(f"{name}: expected shape [B, N] = {[batch, num_nodes]} to match target_probs "
                             f"{list(target_probs.shape)} (N+1 target rows), got {list(tensor.shape)}")
        _check_device(name, tensor.device, device)
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor) or not draft_probs.is_floating_point():
            raise ValueError("draft_probs: expected a floating-point torch.Tensor of probabilities")
        if tuple(draft_probs.shape) != (batch, num_nodes, vocab):
            raise ValueError(f"draft_probs: expected shape [B, N, V] = {[batch, num_nodes, vocab]} (one row per node; "
                             f"target_probs has N+1 rows), got {list(draft_probs.shape)}")
        _check_device("draft_probs", draft_probs.device, device)
    if needs_randomness:
        check_randomness_source(generator, uniforms, (batch, positions), device, "[B, N+1]")


# --------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------


def step_uniforms(target_probs: torch.Tensor, generator: torch.Generator | None,
                  uniforms: torch.Tensor | None) -> torch.Tensor:
    """The step's uniforms ``u [B, N+1]`` in float64: the injected ones, or exactly one draw."""
    if uniforms is not None:
        return uniforms.to(torch.float64)
    batch, positions, _ = target_probs.shape
    return torch.rand(batch, positions, generator=generator, dtype=torch.float64, device=target_probs.device)


def emit_path(tree_tokens: torch.Tensor, parents: torch.Tensor, last_node: torch.Tensor,
              final_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(emitted [B, N+1], depth [B])``: the tokens root → ``last_node``, then ``final_token``, then -1.

    The path is read by following ``parents`` up from ``last_node`` (at most N steps).
    """
    batch, num_nodes = tree_tokens.shape
    rows = torch.arange(batch, device=tree_tokens.device)
    reversed_path = torch.full((batch, num_nodes), -1, dtype=torch.int64, device=tree_tokens.device)
    node = last_node.clone()
    for step in range(num_nodes):
        on_path = node >= 0
        reversed_path[:, step] = torch.where(on_path, tree_tokens[rows, node.clamp(min=0)], -1)
        node = torch.where(on_path, parents[rows, node.clamp(min=0)], node)
    depth = (reversed_path >= 0).sum(-1)
    column = torch.arange(num_nodes + 1, device=tree_tokens.device)
    source = (depth[:, None] - 1 - column[:num_nodes]).clamp(0, num_nodes - 1)
    path = torch.cat([reversed_path.gather(-1, source), reversed_path.new_zeros(batch, 1)], dim=1)
    emitted = torch.where(column < depth[:, None], path, -1)
    emitted = torch.where(column == depth[:, None], final_token[:, None], emitted)
    return emitted, depth


def _at(rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``rows[b, tokens[b]]`` for ``rows [B, V]``, ``tokens [B]`` (any valid index)."""
    return rows.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


AcceptTest = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                      torch.Tensor]
"""``accept_test(r, s, p_node, x, q_x, u_n) -> bool [B]`` of :func:`_tree_walk`."""

ResidualUpdate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``residual_update(r, s, p_node, q_row) -> [B, V]`` of :func:`_tree_walk`."""

FinalLaw = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``final_law(r, p_node) -> [B, V]`` of :func:`_tree_walk`."""


def _tree_walk(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, tree_tokens: torch.Tensor,
               parents: torch.Tensor, u: torch.Tensor, *, accept_test: AcceptTest, residual_update: ResidualUpdate,
               final_law: FinalLaw | None = None) -> TreeVerifyResult:
    """The sibling loop of recursive rejection sampling, one node index at a time for all rows.

    ``accept_test(r, s, p_node, x, q_x, u_n) -> bool [B]`` decides a tested node, where ``r``/``s``
    are the current unnormalised law and its total, ``p_node`` the unmodified target law at the
    current node; ``residual_update(r, s, p_node, q_row) -> r'`` is applied after a rejection.
    ``final_law(r, p_node) -> weights`` gives the weights of the final draw (default ``r``).
    Returns ``TreeVerifyResult``.  Node ``n`` is tested iff it is present and its parent is the
    current node: its earlier siblings were all rejected, or it would not be (a sibling's
    acceptance moves the current node to that sibling, whose children come later).
    """
    batch, positions, _ = target_probs.shape
    num_nodes = positions - 1
    device = target_probs.device
    current = torch.full((batch,), -1, dtype=torch.int64, device=device)
    p_node, r, q_buffer = _walk_buffers(batch, target_probs.shape[-1], device)  # updated in place below
    p_node.copy_(target_probs[:, 0])
    r.copy_(p_node)
    s = torch.ones(batch, dtype=torch.float64, device=device)  # a fresh target row counts as normalised
    present = tree_tokens >= 0
    ones = torch.ones(batch, dtype=torch.float64, device=device)
    for n in range(num_nodes):
        tested = present[:, n] & (parents[:, n] == current)
        x = tree_tokens[:, n].clamp(min=0)
        # q_n(x_n) read from the input row (the float64 cast is exact); the whole row only on a rejection
        q_x = _at(draft_probs[:, n], x).to(torch.float64) if draft_probs is not None else ones
        accept = tested & accept_test(r, s, p_node, x, q_x, u[:, n])
        reject = tested & ~accept
        rejecting = reject.nonzero()[:, 0]
        if rejecting.numel() == batch:  # every row: the residual of the whole batch, in place
            if draft_probs is not None:
                q_row = q_buffer.copy_(draft_probs[:, n])
            else:  # the point mass at x_n, as one_hot(x_n) in float64
                q_row = q_buffer.zero_().scatter_(-1, x[:, None], 1.0)
            updated = residual_update(r, s, p_node, q_row)  # may overwrite q_row, its scratch row
            updated_sum = updated.sum(-1)
            keep = reject & (updated_sum > 0)  # rounding fallback: leave the law unchanged
            torch.where(keep[:, None], updated, r, out=r)
            s = torch.where(keep, updated_sum, s)
        elif rejecting.numel():  # some rows: their residuals only
            s = _update_some_rows(rejecting, draft_probs, n, x, r, s, p_node, q_buffer, residual_update)
        accepted = accept.nonzero()[:, 0]
        if accepted.numel():  # only the accepting rows move to their node's target law
            fresh = target_probs[accepted, n + 1].to(torch.float64)
            current[accepted] = n
            p_node[accepted] = fresh
            r[accepted] = fresh
            s[accepted] = 1.0
    weights = r if final_law is None else final_law(r, p_node).clone()
    final_token = inverse_cdf(weights, u[:, -1], in_place=True)
    emitted, depth = emit_path(tree_tokens, parents, current, final_token)
    return TreeVerifyResult(emitted, depth, current)


def _update_some_rows(rows: torch.Tensor, draft_probs: torch.Tensor | None, n: int, x: torch.Tensor, r: torch.Tensor,
                      s: torch.Tensor, p_node: torch.Tensor, scratch: torch.Tensor,
                      residual_update: ResidualUpdate) -> torch.Tensor:
    """The rejection update of :func:`_tree_walk` for the rejecting ``rows`` only (``[R]``, not all
    of the batch): their residuals ``[R, V]``, written into ``r`` and their totals into ``s`` (in
    place) where they keep mass; returns ``s``.

    The totals are summed over the full ``[B, V]`` scratch buffer (the rejecting rows hold their
    residuals, the others whatever they held), not over the ``[R, V]`` residuals: a row's sum is
    read from its own entries only, but how ``torch.sum`` splits a row among threads depends on
    the tensor's shape, so summing the batch's shape keeps every total bit-identical to the
    whole-batch update."""
    if draft_probs is not None:
        q_rows = draft_probs[rows, n].to(torch.float64)
    else:  # the point mass at x_n, as one_hot(x_n) in float64
        q_rows = torch.zeros(rows.numel(), r.shape[-1], dtype=torch.float64, device=r.device)
        q_rows.scatter_(-1, x[rows, None], 1.0)
    updated = residual_update(r[rows], s[rows], p_node[rows], q_rows)
    scratch[rows] = updated
    updated_sum = scratch.sum(-1)[rows]
    keep = updated_sum > 0  # rounding fallback: leave the law unchanged
    kept = rows[keep]
    r[kept] = updated[keep]
    s[kept] = updated_sum[keep]
    return s


def _ratio_accept(r: torch.Tensor, s: torch.Tensor, p_node: torch.Tensor, x: torch.Tensor,
                  q_x: torch.Tensor, u_n: torch.Tensor) -> torch.Tensor:
    return u_n * q_x * s < _at(r, x)


def _residual(r: torch.Tensor, s: torch.Tensor, p_node: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """``(r - s q)+`` (the product rounded, then the difference, as ``r - s[:, None] * q_row``),
    written over ``q_row``, the walk's scratch row."""
    return torch.sub(r, q_row.mul_(s[:, None]), out=q_row).clamp_(min=0)


WALK_BUFFER_CACHE_BYTES = 64 << 20
"""Largest size (64 MiB) of the three float64 ``[B, V]`` rows of :func:`_tree_walk` kept per thread
between calls on CPU; larger ones are allocated per call."""

_BUFFERS = threading.local()


def _walk_buffers(batch: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three float64 ``[B, V]`` scratch rows (``p_node``, ``r``, the draft row) for :func:`_tree_walk`.

    On CPU, up to :data:`WALK_BUFFER_CACHE_BYTES` they are kept per thread and reused: fresh
    buffers of this size are mapped anew on every call, and faulting their pages in costs more
    than the arithmetic done in them."""
    size = batch * vocab
    if device.type != "cpu" or 3 * size * 8 > WALK_BUFFER_CACHE_BYTES:
        p_node, r, q = (torch.empty(batch, vocab, dtype=torch.float64, device=device) for _ in range(3))
        return p_node, r, q
    cached = getattr(_BUFFERS, "walk", None)
    if cached is None or cached.shape[1] < size:
        cached = _BUFFERS.walk = torch.empty(3, size, dtype=torch.float64)
    p_node, r, q = (cached[i, :size].view(batch, vocab) for i in range(3))
    return p_node, r, q


def _native_walk(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, tree_tokens: torch.Tensor,
                 parents: torch.Tensor, generator: torch.Generator | None, uniforms: torch.Tensor | None,
                 validate: bool) -> TreeVerifyResult | None:
    """:func:`_tree_walk` with the exact rule's tests and residuals on the native kernel
    (:func:`specverify.core.native_rules.tree_verify`), or ``None`` when it does not apply (the
    caller then runs its torch code).  With ``validate`` the structure checks of
    :func:`validate_tree_inputs` run first (no device reads); the kernel screens the structure and
    the rows in use; when it flags anything, :func:`validate_tree_inputs` words the error (or finds
    none, and the torch walk runs)."""
    if not native_rules.tree_applies(target_probs, draft_probs, tree_tokens, parents, uniforms, generator):
        return None
    if validate:
        _check_tree_structure(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, True)
    batch, _, vocab = target_probs.shape
    outcome = native_rules.tree_verify(
        target_probs, draft_probs, tree_tokens, parents, lambda: step_uniforms(target_probs, generator, uniforms),
        uniforms, validate, _native_walk_buffers(batch, vocab), limit=_native_screen_limit(target_probs.dtype, vocab))
    if outcome is None:
        if validate:
            validate_tree_inputs(target_probs, draft_probs, tree_tokens, parents, generator, uniforms=uniforms)
        return None
    return TreeVerifyResult(outcome.emitted, outcome.num_accepted, outcome.last_node)


NATIVE_BUFFER_CACHE_BYTES = 256 << 20
"""Largest size (256 MiB: B = 64 at V = 256k) of the native walk's two float64 ``[B, V]`` residual
buffers kept per thread between calls (:func:`_native_walk_buffers`); larger ones are allocated per call."""


def _native_walk_buffers(batch: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two float64 ``[B, V]`` CPU buffers for the native walk's residuals, kept per thread up to
    :data:`NATIVE_BUFFER_CACHE_BYTES` (faulting fresh pages in costs about as much as the walk)."""
    size = batch * vocab
    if 2 * size * 8 > NATIVE_BUFFER_CACHE_BYTES:
        return torch.empty(batch, vocab, dtype=torch.float64), torch.empty(batch, vocab, dtype=torch.float64)
    cached = getattr(_BUFFERS, "native", None)
    if cached is None or cached.shape[1] < size:
        cached = _BUFFERS.native = torch.empty(2, size, dtype=torch.float64)
    return cached[0, :size].view(batch, vocab), cached[1, :size].view(batch, vocab)


# --------------------------------------------------------------------------------------------
# Lossless rules
# --------------------------------------------------------------------------------------------


def tree_rejection_sample(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    validate: bool = True,
) -> TreeVerifyResult:
    """Recursive rejection sampling over a tree, the lossless rule (see the module docstring for
    the algorithm, the theorem and the uniform convention; Miao et al. 2024 §4.2, Jeon et al. 2024).

    Exact for every sibling scheme as long as ``draft_probs[b, n]`` is the law node ``n`` was drawn
    from given its path and earlier siblings (SPEC §3): independent siblings (SpecInfer), sampling
    without replacement (Recursive Speculative Decoding), one-hot for deterministic children
    (top-k, n-gram; equivalent in law to sampling from the target and matching a child).
    Duplicate sibling tokens under independent drawing need no special case: a rejected token
    has ``q(x) > p(x)``, so the residual gives it 0 and its duplicates are rejected too.
    Vectorised over rows (ragged trees, absent nodes last); a loop over the N node indices.  On
    contiguous CPU float32/bfloat16 inputs the walk's tests, residuals and final draw run on the
    native kernel (:func:`_native_walk`), with the totals still taken by ``torch.sum``: the same outputs.
    """
    fast = _native_walk(target_probs, draft_probs, tree_tokens, parents, generator, uniforms, validate)
    if fast is not None:
        return fast
    if validate:
        validate_tree_inputs(target_probs, draft_probs, tree_tokens, parents, generator, uniforms=uniforms)
    u = step_uniforms(target_probs, generator, uniforms)
    return _tree_walk(target_probs, draft_probs, tree_tokens, parents, u,
                      accept_test=_ratio_accept, residual_update=_residual)


def point_mass_tree_verify(
    target_probs: torch.Tensor,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    validate: bool = True,
) -> TreeVerifyResult:
    """Recursive rejection sampling with one-hot drafts (``q_c = onehot(x_c)``): lossless for
    children chosen deterministically, or any way independent of the step's uniforms *with
    distinct sibling tokens*; ``draft_probs`` is not needed.  Accept ``c`` iff ``u_c < p(x_c)``;
    after a rejection ``p`` loses ``x_c`` and is renormalised.  In law: sample ``t ~ p`` at each
    node and descend into the child holding ``t`` (SGLang's target-only tree sampling).  Native on
    contiguous CPU float32/bfloat16 inputs, as :func:`tree_rejection_sample`.
    """
    fast = _native_walk(target_probs, None, tree_tokens, parents, generator, uniforms, validate)
    if fast is not None:
        return fast
    if validate:
        validate_tree_inputs(target_probs, None, tree_tokens, parents, generator, uniforms=uniforms)
    u = step_uniforms(target_probs, generator, uniforms)
    return _tree_walk(target_probs, None, tree_tokens, parents, u,
                      accept_test=_ratio_accept, residual_update=_residual)


def greedy_tree_verify(
    target_probs: torch.Tensor,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    *,
    validate: bool = True,
) -> TreeVerifyResult:
    """Greedy tree verification: from the root, descend into the first child whose token is the
    target's argmax at the current node, while one exists; then emit that node's argmax.  The
    emitted tokens are always a prefix of the target's greedy decoding (the temperature-0 limit of
    :func:`tree_rejection_sample`).  ``argmax`` is ``torch.argmax`` (first maximal index).  No randomness.
    Native on contiguous CPU float32/bfloat16 inputs (:func:`specverify.core.native_rules.tree_greedy`:
    the screen and the argmax of the rows visited only), with the same outputs.
    """
    if native_rules.tree_applies(target_probs, None, tree_tokens, parents, None, None):
        if validate:
            _check_tree_structure(target_probs, None, tree_tokens, parents, None, None, False)
        fast = native_rules.tree_greedy(target_probs, tree_tokens, parents, validate,
                                        limit=_native_screen_limit(target_probs.dtype, target_probs.shape[-1]))
        if fast is not None:
            return TreeVerifyResult(*fast)
    if validate:
        validate_tree_inputs(target_probs, None, tree_tokens, parents, needs_randomness=False)
    batch, positions, _ = target_probs.shape
    greedy = target_probs.argmax(-1)  # [B, N+1]
    rows = torch.arange(batch, device=target_probs.device)
    current = torch.full((batch,), -1, dtype=torch.int64, device=target_probs.device)
    for n in range(positions - 1):
        tested = (tree_tokens[:, n] >= 0) & (parents[:, n] == current)
        accept = tested & (tree_tokens[:, n] == greedy[rows, current + 1])
        current = torch.where(accept, n, current)
    emitted, depth = emit_path(tree_tokens, parents, current, greedy[rows, current + 1])
    return TreeVerifyResult(emitted, depth, current)


# --------------------------------------------------------------------------------------------
# Lossy rules
# --------------------------------------------------------------------------------------------


def typical_acceptance_tree_verify(
    target_probs: torch.Tensor,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    threshold: float = 0.09,
    alpha: float = 0.3,
    validate: bool = True,
) -> TreeVerifyResult:
    """Medusa typical acceptance on a tree (Cai et al. 2024, "Medusa", §2.3.1). **LOSSY.**

    At the current node descend into the first child (index order) with
    ``p(x_c) > min(threshold, alpha · exp(−H(p)))`` (``p`` the target at the node, never updated);
    when no child passes, emit a token drawn from ``p`` at the node (column ``N``).  The accept
    columns are unused.  The first token's law is ``P(t) = P(t is the first passing child) +
    P(no child passes) p(t)``, not ``p``.
    """
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold: expected a finite number >= 0 (Medusa uses 0.09), got {threshold!r}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha: expected a finite number >= 0 (Medusa uses 0.3), got {alpha!r}")
    if validate:
        validate_tree_inputs(target_probs, None, tree_tokens, parents, generator, uniforms=uniforms)
    u = step_uniforms(target_probs, generator, uniforms)

    def passes(r: torch.Tensor, s: torch.Tensor, p_node: torch.Tensor, x: torch.Tensor,
               q_x: torch.Tensor, u_n: torch.Tensor) -> torch.Tensor:
        entropy = torch.special.entr(p_node).sum(-1)
        return _at(p_node, x) > torch.clamp(alpha * torch.exp(-entropy), max=threshold)

    return _tree_walk(target_probs, None, tree_tokens, parents, u, accept_test=passes,
                      residual_update=lambda r, s, p_node, q_row: r, final_law=lambda r, p_node: p_node)


def unchanged_target_tree_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    validate: bool = True,
) -> TreeVerifyResult:
    """Each child tested against the unchanged target law ``p`` of its parent. **LOSSY.**

    A chain rule applied to each sibling in turn: accept ``c`` iff ``u_c q_c(x_c) < p(x_c)``
    with ``p`` never replaced by the residual; when every child is rejected the token is drawn
    from ``(p − q_last)+`` of the last rejected child.  With two independent siblings the first
    token has ``P(t) = min(p, q)(t) + β min(p, q)(t) + β² (p − q)+(t)/β`` for ``β = Σ (q − p)+``:
    ``min(p, q)`` is counted twice.
    """
    if validate:
        validate_tree_inputs(target_probs, draft_probs, tree_tokens, parents, generator, uniforms=uniforms)
    u = step_uniforms(target_probs, generator, uniforms)

    def test_against_parent(r: torch.Tensor, s: torch.Tensor, p_node: torch.Tensor, x: torch.Tensor,
                            q_x: torch.Tensor, u_n: torch.Tensor) -> torch.Tensor:
        return u_n * q_x < _at(p_node, x)

    def residual_of_last(r: torch.Tensor, s: torch.Tensor, p_node: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
        return (p_node - q_row).clamp(min=0)

    return _tree_walk(target_probs, draft_probs, tree_tokens, parents, u,
                      accept_test=test_against_parent, residual_update=residual_of_last)


def thresholded_tree_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    threshold_single: float = 0.9,
    threshold_acc: float = 0.9,
    validate: bool = True,
) -> TreeVerifyResult:
    """Recursive rejection sampling with relaxed acceptance, as SGLang's ``threshold_single`` /
    ``threshold_acc`` options. **LOSSY whenever a threshold is below 1** (exact at 1, 1).

    Accept ``c`` iff ``p(x_c) >= threshold_single`` or ``u_c q_c(x_c) threshold_acc < p(x_c)``
    (probability ``min(1, p/(threshold_acc · q))``); otherwise the residual update of the exact
    rule.  Accepting more than ``min(p, q)`` of the mass skews every emitted token towards the
    drafts.
    """
    for name, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if not (math.isfinite(value) and 0 < value <= 1):
            raise ValueError(f"{name}: expected a number in (0, 1] (1 is lossless), got {value!r}")
    if validate:
        validate_tree_inputs(target_probs, draft_probs, tree_tokens, parents, generator, uniforms=uniforms)
    u = step_uniforms(target_probs, generator, uniforms)

    def relaxed(r: torch.Tensor, s: torch.Tensor, p_node: torch.Tensor, x: torch.Tensor,
                q_x: torch.Tensor, u_n: torch.Tensor) -> torch.Tensor:
        p_x = _at(r, x) / s
        return (p_x >= threshold_single) | (u_n * q_x * threshold_acc < p_x)

    return _tree_walk(target_probs, draft_probs, tree_tokens, parents, u,
                      accept_test=relaxed, residual_update=_residual)


# --------------------------------------------------------------------------------------------
# SPEC §3 functions: (target_probs, draft_probs, tree_tokens, parents, generator) -> emitted [B, N+1].
# Each also takes ``uniforms=`` so that specverify.core.tree_exact can drive it exactly.
# --------------------------------------------------------------------------------------------


def verify_tree(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """The built-in ``reference`` tree target (SPEC §3): :func:`tree_rejection_sample`'s emitted tokens."""
    return tree_rejection_sample(target_probs, draft_probs, tree_tokens, parents, generator, uniforms=uniforms).emitted


verify_tree.draft_schemes = DRAFT_SCHEMES  # type: ignore[attr-defined]  # declared on the function, read by the audit


def point_mass_verify_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor, tree_tokens: torch.Tensor,
                           parents: torch.Tensor, generator: torch.Generator | None = None, *,
                           uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """SPEC §3 function of :func:`point_mass_tree_verify` (``draft_probs`` ignored); declared for
    deterministic children only."""
    return point_mass_tree_verify(target_probs, tree_tokens, parents, generator, uniforms=uniforms).emitted


point_mass_verify_tree.draft_schemes = ("deterministic",)  # type: ignore[attr-defined]  # as above


def greedy_verify_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor, tree_tokens: torch.Tensor,
                       parents: torch.Tensor, generator: torch.Generator | None = None, *,
                       uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """SPEC §3 function of :func:`greedy_tree_verify` (lossless only at temperature 0; under sampling it
    emits the argmax and is caught)."""
    return greedy_tree_verify(target_probs, tree_tokens, parents).emitted


def typical_verify_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor, tree_tokens: torch.Tensor,
                        parents: torch.Tensor, generator: torch.Generator | None = None, *,
                        uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """SPEC §3 function of :func:`typical_acceptance_tree_verify` (LOSSY, Medusa defaults)."""
    return typical_acceptance_tree_verify(target_probs, tree_tokens, parents, generator, uniforms=uniforms).emitted


def unchanged_target_verify_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor, tree_tokens: torch.Tensor,
                                 parents: torch.Tensor, generator: torch.Generator | None = None, *,
                                 uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """SPEC §3 function of :func:`unchanged_target_tree_verify` (LOSSY)."""
    return unchanged_target_tree_verify(target_probs, draft_probs, tree_tokens, parents, generator,
                                        uniforms=uniforms).emitted


def thresholded_verify_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor, tree_tokens: torch.Tensor,
                            parents: torch.Tensor, generator: torch.Generator | None = None, *,
                            uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """SPEC §3 function of :func:`thresholded_tree_verify` (LOSSY, thresholds 0.9 / 0.9)."""
    return thresholded_tree_verify(target_probs, draft_probs, tree_tokens, parents, generator,
                                   uniforms=uniforms).emitted


# The tree rules compute in float64 (as the chain rules do), so the exact check holds them to the
# float64 bound (specverify.core.rounding).
for _rule in (verify_tree, point_mass_verify_tree, greedy_verify_tree, typical_verify_tree,
              unchanged_target_verify_tree, thresholded_verify_tree):
    _rule.arithmetic = "float64"  # type: ignore[attr-defined]  # declared on the function (rounding.py)
del _rule
