"""Tree layouts of serving engines, and SPEC §3 adapters for verifiers written in them.

SPEC §3 describes a tree by ``parents [B, N]`` (node ``n``'s parent, ``-1`` for the root's
children) and ``tree_tokens [B, N]``.  Engines store the same tree differently:

- **SGLang-style linked layout** (as used by ``tree_speculative_sampling_target_only``, from its
  public description): node 0 is the root (the last verified token) and nodes ``1..N`` the drafts;
  ``candidates [B, N+1]`` holds the tokens (``candidates[:, 0]`` the root token),
  ``retrive_index [B, N+1]`` the flat row of each node in the ``[B·(N+1), V]`` probability buffer,
  ``retrive_next_token [B, N+1]`` each node's first child and ``retrive_next_sibling [B, N+1]`` its
  next sibling (``-1``: none).  Verification walks from the root: one coin per level, the children
  are scanned through the sibling links, and the rejection path samples the final token.
- **EAGLE-style mask layout**: ``tree_mask [B, N, N]`` (node ``i`` attends to node ``j`` iff ``j`` is
  ``i`` or one of its ancestors) and ``positions [B, N]`` (each node's depth below the root, 0 for
  the root's children), which is what a target forward pass over the tree needs.

The converters here go both ways; :func:`sglang_style_verify_tree` and
:func:`eagle_style_verify_tree` are SPEC §3 functions (built-in tree targets ``sglang-style`` and
``eagle-style``) that convert the layout and run a verifier written in it, so an engine
contributor can wrap their own kernel the same way in a few lines (docs/writing-an-adapter.md).
"""

from __future__ import annotations

import torch

from specverify.core.sampling import inverse_cdf
from specverify.core.tree_rules import (
    emit_path,
    step_uniforms,
    tree_rejection_sample,
    validate_tree_inputs,
)

# --------------------------------------------------------------------------------------------
# SGLang-style linked layout
# --------------------------------------------------------------------------------------------


def to_sglang_layout(tree_tokens: torch.Tensor, parents: torch.Tensor,
                     root_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """``(candidates, retrive_index, retrive_next_token, retrive_next_sibling)``, all ``[B, N+1]``
    int64, for a SPEC §3 tree: SPEC node ``n`` is linked node ``n + 1``; children are linked in
    index order; absent nodes are unlinked (``candidates`` ``-1``)."""
    batch, width = tree_tokens.shape
    root = root_tokens if root_tokens is not None else torch.zeros(batch, dtype=torch.int64)
    candidates = torch.cat([root[:, None], tree_tokens], dim=1)
    retrive_index = torch.arange(batch * (width + 1), dtype=torch.int64).reshape(batch, width + 1)
    next_token = torch.full((batch, width + 1), -1, dtype=torch.int64)
    next_sibling = torch.full((batch, width + 1), -1, dtype=torch.int64)
    last_child = torch.full((batch, width + 1), -1, dtype=torch.int64)  # per linked parent
    rows = torch.arange(batch)
    for n in range(width):
        present = tree_tokens[:, n] >= 0
        parent = parents[:, n] + 1
        previous = last_child[rows, parent]
        first = present & (previous < 0)
        linked = n + 1
        next_token[rows[first], parent[first]] = linked
        chained = present & (previous >= 0)
        next_sibling[rows[chained], previous[chained]] = linked
        last_child[rows[present], parent[present]] = linked
    return candidates, retrive_index, next_token, next_sibling


def from_sglang_layout(candidates: torch.Tensor, retrive_next_token: torch.Tensor,
                       retrive_next_sibling: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tree_tokens, parents)`` of SPEC §3 from the linked layout (linked nodes ``1..N`` must be
    numbered so that a parent precedes its children, as SGLang's breadth-first trees are)."""
    batch, width = candidates.shape[0], candidates.shape[1] - 1
    parents = torch.full((batch, width), -1, dtype=torch.int64)
    tokens = torch.full((batch, width), -1, dtype=torch.int64)
    for b in range(batch):
        stack = [0]
        while stack:
            node = stack.pop()
            child = int(retrive_next_token[b, node])
            while child >= 0:
                parents[b, child - 1] = node - 1
                tokens[b, child - 1] = candidates[b, child]
                stack.append(child)
                child = int(retrive_next_sibling[b, child])
    return tokens, parents


def sglang_target_only_sample(candidates: torch.Tensor, retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                              retrive_next_sibling: torch.Tensor, target_probs_flat: torch.Tensor,
                              coins: torch.Tensor, final_coins: torch.Tensor, *, threshold_single: float = 1.0,
                              threshold_acc: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target-only tree sampling in the linked layout, written from the public description of
    SGLang's kernel: at the current node draw a coin ``u`` (``coins[b, node]``), scan the children
    through the sibling links accumulating their target mass ``acc``; descend into the first
    child with ``u < acc / threshold_acc`` or ``p(child) ≥ threshold_single``; if none, draw the
    final token from the target with the scanned children's tokens removed (``final_coins``).
    With both thresholds 1 this is sampling ``t ~ p`` and matching a child: lossless for
    deterministic children with distinct tokens.  Returns ``(accept_index [B, N+1]`` (linked
    nodes of the accepted path, root first, ``-1`` padded), ``accept_length [B]``,
    ``next_token [B])``."""
    batch, width = candidates.shape[0], candidates.shape[1] - 1
    rows = torch.arange(batch)
    probs = target_probs_flat.to(torch.float64)
    accept_index = torch.full((batch, width + 1), -1, dtype=torch.int64)
    accept_index[:, 0] = retrive_index[:, 0]
    accept_length = torch.zeros(batch, dtype=torch.int64)
    next_token = torch.zeros(batch, dtype=torch.int64)
    node = torch.zeros(batch, dtype=torch.int64)
    active = torch.ones(batch, dtype=torch.bool)
    for _ in range(width + 1):  # one level per iteration
        p = probs[retrive_index[rows, node]].clone()
        u = coins[rows, node].to(torch.float64)
        acc = torch.zeros(batch, dtype=torch.float64)
        child = retrive_next_token[rows, node]
        chosen = torch.full((batch,), -1, dtype=torch.int64)
        for _ in range(width):  # scan the siblings
            scanning = active & (child >= 0) & (chosen < 0)
            if not bool(scanning.any()):
                break
            token = candidates[rows, child.clamp(min=0)].clamp(min=0)
            p_token = p.gather(-1, token[:, None]).squeeze(-1)
            acc = torch.where(scanning, acc + p_token, acc)
            take = scanning & ((u < acc / threshold_acc) | (p_token >= threshold_single))
            chosen = torch.where(take, child, chosen)
            rejected = scanning & ~take
            p[rows[rejected], token[rejected]] = 0.0  # the final draw excludes the scanned children
            child = torch.where(rejected, retrive_next_sibling[rows, child.clamp(min=0)], child)
        stops = active & (chosen < 0)
        if bool(stops.any()):
            original = probs[retrive_index[rows, node]]
            weights = torch.where((p.sum(-1) > 0)[:, None], p, original)
            final = inverse_cdf(weights.clone(), final_coins.to(torch.float64), in_place=True)
            next_token = torch.where(stops, final, next_token)
        descends = active & (chosen >= 0)
        accept_length = torch.where(descends, accept_length + 1, accept_length)
        accept_index[rows[descends], accept_length[descends]] = retrive_index[rows[descends], chosen[descends]]
        node = torch.where(descends, chosen, node)
        active = descends
        if not bool(active.any()):
            break
    return accept_index, accept_length, next_token


def sglang_style_verify_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor, tree_tokens: torch.Tensor,
                             parents: torch.Tensor, generator: torch.Generator | None = None, *,
                             uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """SPEC §3 adapter of :func:`sglang_target_only_sample`: converts to the linked layout, uses
    the uniform of each node's first child as that level's coin (column ``N`` for the final
    draw), and converts the accepted linked nodes back to emitted tokens.  Lossless for
    deterministic children (declared)."""
    validate_tree_inputs(target_probs, draft_probs, tree_tokens, parents, generator, uniforms=uniforms)
    u = step_uniforms(target_probs, generator, uniforms)
    batch, width = tree_tokens.shape
    candidates, retrive_index, next_token, next_sibling = to_sglang_layout(tree_tokens, parents)
    # the coin of linked node k is the uniform of its first child (SPEC node next_token[k] - 1)
    coins = torch.where(next_token > 0, u.gather(-1, (next_token - 1).clamp(min=0)), 0.0)
    flat = target_probs.reshape(batch * (width + 1), -1)
    accept_index, accept_length, final = sglang_target_only_sample(candidates, retrive_index, next_token, next_sibling,
                                                                   flat, coins, u[:, -1])
    rows = torch.arange(batch)
    deepest = accept_index[rows, accept_length] - rows * (width + 1)  # linked node id
    return emit_path(tree_tokens, parents, deepest - 1, final)[0]


sglang_style_verify_tree.draft_schemes = ("deterministic",)  # type: ignore[attr-defined]  # read by the audit


# --------------------------------------------------------------------------------------------
# EAGLE-style mask layout
# --------------------------------------------------------------------------------------------


def to_eagle_layout(tree_tokens: torch.Tensor, parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tree_mask [B, N, N] bool, positions [B, N] int64)``: ancestor-or-self mask and depth
    below the root (0 for the root's children); absent nodes attend to nothing, position -1."""
    batch, width = parents.shape
    present = tree_tokens >= 0
    mask = torch.zeros(batch, width, width, dtype=torch.bool)
    positions = torch.full((batch, width), -1, dtype=torch.int64)
    rows = torch.arange(batch)
    for n in range(width):
        parent = parents[:, n]
        inherited = torch.where((parent >= 0)[:, None], mask[rows, parent.clamp(min=0)], False)
        mask[:, n] = inherited & present[:, n:n + 1]
        mask[:, n, n] = present[:, n]
        depth = torch.where(parent >= 0, positions[rows, parent.clamp(min=0)] + 1, 0)
        positions[:, n] = torch.where(present[:, n], depth, -1)
    return mask, positions


def from_eagle_layout(tree_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``parents [B, N]`` from the mask layout: node ``i``'s parent is its ancestor ``j ≠ i`` at
    position ``positions[i] − 1`` (-1 at position 0 and for absent nodes)."""
    width = positions.shape[1]
    ancestors = tree_mask & ~torch.eye(width, dtype=torch.bool)[None]
    one_up = ancestors & (positions[:, None, :] == positions[:, :, None] - 1)
    has_parent = one_up.any(-1)
    return torch.where(has_parent, one_up.to(torch.int64).argmax(-1), -1)


def eagle_style_verify_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor, tree_tokens: torch.Tensor,
                            parents: torch.Tensor, generator: torch.Generator | None = None, *,
                            uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """SPEC §3 adapter of a verifier that takes the EAGLE-style layout: builds ``tree_mask`` and
    ``positions``, recovers the tree from them (as such a verifier would) and runs recursive
    rejection sampling on it.  Lossless for every scheme."""
    tree_mask, positions = to_eagle_layout(tree_tokens, parents)
    recovered = from_eagle_layout(tree_mask, positions)
    return tree_rejection_sample(target_probs, draft_probs, tree_tokens, recovered, generator,
                                 uniforms=uniforms).emitted
