"""The reference *tree* speculative decoder, for any Hugging Face causal LM target (batch size 1).

One step (SpecInfer, Miao et al. 2024, §3–4; EAGLE-2, Li et al. 2024, for the fixed-shape top-k
trees), repeated until the request has ``max_new_tokens`` tokens:

1. **draft a tree** of a fixed shape ``parents`` (SPEC §3: node ``n``'s parent is ``-1``, a child of
   the root, or an earlier node).  A draft model is run level by level over the tree with a tree
   attention mask; the children of a node are
   - ``"deterministic"``: the draft's top-k tokens at the node (the ``i``-th child is the ``i``-th most
     likely token of the draft's processed law, ties to the lower id; ``q`` = one-hot), or
   - ``"independent"``: independent samples from the draft's processed law ``q`` at the node
     (SpecInfer's independent siblings; duplicates allowed, ``draft_probs[n] = q``);
2. **score**: ONE target forward pass over ``[last committed token, node 0 .. node N-1]`` with a
   tree attention mask (slot ``n`` attends to the committed context, to its ancestors and to
   itself) and per-node position ids ``context length + depth``, reusing the committed prefix's KV
   cache: ``target_probs [N+1, V]``, row 0 the law after the context, row ``n+1`` the law after the
   path root → ``n``;
3. **verify** with :mod:`specverify.core.tree_rules` (recursive rejection sampling; its one-hot form
   for deterministic children; greedy matching at temperature 0): emit the accepted path and one
   correction-or-bonus token, each distributed as the target's (Miao et al. Theorem 4.2);
4. **keep** the accepted path's KV entries in the target cache (a gather along the sequence axis:
   the root slot and the accepted nodes, in depth order, which are also position order) and drop
   the rest.  The draft's cache is cropped back to the committed tokens; the accepted tokens it
   has not cached are fed again at the start of the next step.

Temperature, top-k, top-p and min-p are applied to draft and target logits by the same function
(``SamplingParams.apply``), so ``q`` is the law the draft was drawn from and ``p`` the law SPEC §2
asks to sample from.  Randomness: one ``torch.Generator`` per request (batch size 1), which gives
first the step's draft samples (independent scheme: one ``torch.multinomial`` per expanded node,
in level order), then the verifier's ``N + 1`` uniforms (``torch.rand(1, N+1)``).

Batch size 1 only: a batch of trees would need the ragged cache of ``reference/kv.py`` with
gathered (not only rolled-back) columns per row.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DummyLayer

from reference.drafters import model_device, vocab_size
from specverify.core.processing import SamplingParams
from specverify.core.tree_exact import check_shape, children_of, depths
from specverify.core.tree_rules import (
    TreeVerifyResult,
    greedy_tree_verify,
    point_mass_tree_verify,
    tree_rejection_sample,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

TREE_SCHEMES = ("deterministic", "independent")
"""How the draft fills a node's children: its top-k tokens (one-hot ``q``) or independent samples of ``q``."""


# --------------------------------------------------------------------------------------------
# The tree: shape, attention mask, positions
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeShape:
    """A fixed tree shape, with the attention structure of its verification block.

    Slot 0 of a block is the root (the last committed token), slot ``n + 1`` is node ``n``.
    ``ancestors [N+1, N+1]`` (bool): slot ``i`` may attend to slot ``j`` iff ``j`` is ``i`` or one of its
    ancestors (the root is everyone's ancestor).  ``depth [N+1]``: 0 for the root, ``depth(parent) + 1``.
    """

    parents: tuple[int, ...]
    ancestors: torch.Tensor = field(repr=False)
    depth: torch.Tensor = field(repr=False)

    @classmethod
    def of(cls, parents: Sequence[int]) -> TreeShape:
        shape = check_shape(parents)
        ancestors = torch.eye(len(shape) + 1, dtype=torch.bool)
        ancestors[:, 0] = True
        for node, parent in enumerate(shape):
            ancestors[node + 1] |= ancestors[parent + 1]
        depth = torch.tensor((0,) + depths(shape), dtype=torch.int64)
        return cls(shape, ancestors, depth)

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    def children(self, node: int) -> list[int]:
        """The children of ``node`` (``-1``: the root) in index order."""
        return children_of(self.parents).get(node, [])

    def expanded_levels(self) -> list[list[int]]:
        """The nodes that have children, grouped by depth (the draft model runs on these, level by level)."""
        levels: list[list[int]] = []
        for node in range(self.num_nodes):
            if self.children(node):
                level = int(self.depth[node + 1]) - 1
                levels.extend([] for _ in range(level + 1 - len(levels)))
                levels[level].append(node)
        return levels

    def path_to(self, node: int) -> list[int]:
        """The nodes root → ``node`` (``node`` included; empty for the root)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def tree_attention_mask(ancestors: torch.Tensor, context_length: int) -> torch.Tensor:
    """The 4-D boolean mask ``[1, 1, m, context_length + m]`` of a block whose slots attend to the whole
    committed context and to the block slots ``ancestors [m, m]`` allows (True = attend)."""
    m = ancestors.shape[0]
    context = torch.ones(m, context_length, dtype=torch.bool, device=ancestors.device)
    return torch.cat([context, ancestors], dim=1)[None, None]


def run_block(model: PreTrainedModel, cache: DynamicCache, tokens: torch.Tensor, ancestors: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
    """Append a block ``tokens [m]`` to ``cache`` under the block mask ``ancestors [m, m]`` at position ids
    ``positions [m]``; return its logits ``[m, V]``."""
    mask = tree_attention_mask(ancestors, cache.get_seq_length())
    output = model(input_ids=tokens[None], attention_mask=mask, position_ids=positions[None], cache=cache,
                   use_cache=True)
    return output.logits[0]


def keep_columns(cache: DynamicCache, columns: torch.Tensor) -> None:
    """Keep only the cache columns ``columns`` (increasing), in every layer: the accepted path's KV entries."""
    for layer in cache.layers:
        if isinstance(layer, DummyLayer):  # a layer without keys and values of its own
            continue
        if not isinstance(layer, CacheLayerMixin):
            raise ValueError(f"target: its {type(layer).__name__} cache layers hold states, not columns to keep; "
                             "the tree decoder needs attention layers")
        if layer.is_initialized and layer.keys is not None and layer.values is not None and layer.keys.numel():
            layer.keys = layer.keys.index_select(-2, columns.to(layer.keys.device))
            layer.values = layer.values.index_select(-2, columns.to(layer.values.device))


# --------------------------------------------------------------------------------------------
# 1. Drafting a tree
# --------------------------------------------------------------------------------------------


class TreeDraft(NamedTuple):
    """A drafted tree: ``tokens [N]`` int64 and ``probs [N, V]`` (the law each node was drawn from;
    ``None`` for deterministic children, whose law is one-hot)."""

    tokens: torch.Tensor
    probs: torch.Tensor | None


def top_children(law: torch.Tensor, logits: torch.Tensor, count: int, params: SamplingParams) -> torch.Tensor:
    """The ``count`` most likely tokens of the processed law ``law [V]`` (ties to the lower id; a stable
    sort); at temperature 0 (a one-hot law) ranked by the raw ``logits`` instead."""
    scores = logits.float() if params.is_greedy else law
    return torch.sort(scores, descending=True, stable=True).indices[:count]


class ModelTreeDrafter:
    """A draft model (a Hugging Face causal LM over the target's vocabulary) that fills a tree shape.

    The draft keeps a KV cache of the committed tokens it has seen.  ``propose`` runs it on the
    committed tokens it has not cached yet (the last one at least: the root) and then on each level
    of expanded nodes, with a tree mask and depth positions, exactly as the target scores the tree;
    then the cache is cropped back to the committed tokens.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model

    def start(self) -> None:
        """Begin a request: an empty cache."""
        self.cache = DynamicCache(config=self.model.config)
        self.cached = 0  # committed tokens in the draft's cache

    @torch.no_grad()
    def propose(self, sequence: torch.Tensor, shape: TreeShape, scheme: str, params: SamplingParams,
                generator: torch.Generator) -> TreeDraft:
        """Draft a tree of ``shape`` after the committed ``sequence [T]`` (see the module docstring)."""
        device = sequence.device
        pending = sequence[self.cached:]
        causal = torch.ones(len(pending), len(pending), dtype=torch.bool, device=device).tril()
        positions = torch.arange(self.cached, len(sequence), device=device)
        root_logits = run_block(self.model, self.cache, pending, causal, positions)[-1]
        self.cached = len(sequence)
        logits_at = {-1: root_logits}
        tokens = torch.full((shape.num_nodes,), -1, dtype=torch.int64, device=device)
        probs = torch.zeros(shape.num_nodes, root_logits.shape[-1], device=device)
        self._fill_children(-1, logits_at, tokens, probs, shape, scheme, params, generator)
        column: dict[int, int] = {}  # node -> its column in the draft's cache
        for level in shape.expanded_levels():
            nodes = torch.tensor(level, device=device)
            block_mask = torch.zeros(len(level), self.cache.get_seq_length() - self.cached + len(level),
                                     dtype=torch.bool, device=device)
            for row, node in enumerate(level):
                for ancestor in shape.path_to(node)[:-1]:
                    block_mask[row, column[ancestor] - self.cached] = True
                block_mask[row, -len(level) + row] = True
            tree_columns = self.cache.get_seq_length()
            mask = torch.cat([torch.ones(len(level), self.cached, dtype=torch.bool, device=device), block_mask], dim=1)
            output = self.model(input_ids=tokens[nodes][None], attention_mask=mask[None, None],
                                position_ids=(len(sequence) - 1 + shape.depth.to(device)[nodes + 1])[None],
                                cache=self.cache, use_cache=True)
            for row, node in enumerate(level):
                column[node] = tree_columns + row
                logits_at[node] = output.logits[0, row]
                self._fill_children(node, logits_at, tokens, probs, shape, scheme, params, generator)
        self.cache.crop(self.cached - self.cache.get_seq_length())  # drop the tree: keep the committed tokens
        return TreeDraft(tokens, None if scheme == "deterministic" or params.is_greedy else probs)

    @staticmethod
    def _fill_children(node, logits_at, tokens, probs, shape, scheme, params, generator) -> None:
        children = shape.children(node)
        if not children:
            return
        law = params.apply(logits_at[node].float()[None])[0]
        if scheme == "deterministic" or params.is_greedy:
            tokens[children] = top_children(law, logits_at[node], len(children), params)
        else:
            for child in children:
                tokens[child] = torch.multinomial(law, 1, generator=generator)[0]
                probs[child] = law


class PromptLookupTreeDrafter:
    """Prompt lookup for trees (deterministic children, no draft model): the children of a node are
    the distinct tokens that followed earlier occurrences of the committed text + path's last
    ``n``-gram, longest ``n`` (``max_ngram`` down to 1) and most recent occurrence first; a node with
    fewer candidates than children is filled with the smallest unused token ids (any distinct tokens
    keep the one-hot rule lossless)."""

    def __init__(self, max_ngram: int = 3) -> None:
        if max_ngram < 1:
            raise ValueError(f"max_ngram: expected >= 1, got {max_ngram}")
        self.max_ngram = max_ngram

    def start(self) -> None:
        """Begin a request (no state)."""

    def candidates(self, text: list[int], count: int) -> list[int]:
        """The first ``count`` candidate next tokens after ``text`` (see the class docstring)."""
        found: list[int] = []
        for n in range(min(self.max_ngram, len(text) - 1), 0, -1):
            suffix = text[-n:]
            for start in range(len(text) - n - 1, -1, -1):  # most recent occurrence first, the suffix itself excluded
                if text[start:start + n] == suffix and text[start + n] not in found:
                    found.append(text[start + n])
        filler = (token for token in range(count + len(found)) if token not in found)
        return (found + [next(filler) for _ in range(max(0, count - len(found)))])[:count]

    def propose(self, sequence: torch.Tensor, shape: TreeShape, scheme: str, params: SamplingParams,
                generator: torch.Generator) -> TreeDraft:
        if scheme != "deterministic":
            raise ValueError(f"scheme: prompt lookup drafts deterministic children, got {scheme!r}")
        text = sequence.tolist()
        tokens = [-1] * shape.num_nodes
        for node in [-1, *range(shape.num_nodes)]:
            children = shape.children(node)
            if children:
                path = [tokens[m] for m in shape.path_to(node)]
                for child, token in zip(children, self.candidates(text + path, len(children))):
                    tokens[child] = token
        return TreeDraft(torch.tensor(tokens, dtype=torch.int64, device=sequence.device), None)


# --------------------------------------------------------------------------------------------
# 2–4. Score, verify, keep
# --------------------------------------------------------------------------------------------


class TargetTreeCache:
    """The target's KV cache: the committed tokens but the last (the root of the next tree)."""

    @torch.no_grad()
    def __init__(self, target: PreTrainedModel, prompt: torch.Tensor) -> None:
        self.target = target
        self.cache = DynamicCache(config=target.config)
        if len(prompt) > 1:
            causal = torch.ones(len(prompt) - 1, len(prompt) - 1, dtype=torch.bool, device=prompt.device).tril()
            run_block(target, self.cache, prompt[:-1], causal, torch.arange(len(prompt) - 1, device=prompt.device))

    @torch.no_grad()
    def score(self, last: torch.Tensor, draft: TreeDraft, shape: TreeShape) -> torch.Tensor:
        """ONE target pass over ``[last, nodes]`` with the tree mask: logits ``[N+1, V]``."""
        context = self.cache.get_seq_length()
        block = torch.cat([last.view(1), draft.tokens])
        device = block.device
        return run_block(self.target, self.cache, block, shape.ancestors.to(device), context + shape.depth.to(device))

    def keep_path(self, shape: TreeShape, last_node: int) -> None:
        """Keep the committed context, the root slot and the accepted nodes' entries; drop the other nodes."""
        context = self.cache.get_seq_length() - (shape.num_nodes + 1)
        slots = [0] + [node + 1 for node in shape.path_to(last_node)]
        device = model_device(self.target)
        columns = torch.cat([torch.arange(context, device=device), context + torch.tensor(slots, device=device)])
        keep_columns(self.cache, columns)


def verify(target_probs: torch.Tensor, draft: TreeDraft, shape: TreeShape, params: SamplingParams,
           generator: torch.Generator) -> TreeVerifyResult:
    """The lossless tree rule for the draft: greedy at temperature 0, the one-hot form for deterministic
    children, recursive rejection sampling for sampled ones (batch of one tree)."""
    parents = torch.tensor(shape.parents, dtype=torch.int64, device=target_probs.device)[None]
    if params.is_greedy:
        return greedy_tree_verify(target_probs[None], draft.tokens[None], parents)
    if draft.probs is None:
        return point_mass_tree_verify(target_probs[None], draft.tokens[None], parents, generator)
    return tree_rejection_sample(target_probs[None], draft.probs[None], draft.tokens[None], parents, generator)


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


@dataclass
class TreeStats:
    """Per-request statistics: target passes, emitted tokens, and how deep each step's accepted path went.

    ``accepted_lengths[i]``: the accepted path length of step ``i`` (0..depth).
    """

    depth: int
    accepted_lengths: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0

    @property
    def target_passes(self) -> int:
        return len(self.accepted_lengths)

    @property
    def tokens_per_pass(self) -> float:
        """Emitted tokens (accepted + 1 per step, before truncation to ``max_new_tokens``) per target pass."""
        return (sum(self.accepted_lengths) + self.target_passes) / max(self.target_passes, 1)

    @property
    def acceptance_by_depth(self) -> tuple[float, ...]:
        """``P(accepted length >= d)`` for ``d = 1..depth``: the fraction of steps that reached depth ``d``."""
        passes = max(self.target_passes, 1)
        return tuple(sum(a >= d for a in self.accepted_lengths) / passes for d in range(1, self.depth + 1))


class TreeGeneration(NamedTuple):
    """``tokens [max_new_tokens]`` int64 (the new tokens) and the request's :class:`TreeStats`."""

    tokens: torch.Tensor
    stats: TreeStats


@torch.no_grad()
def tree_speculative_generate(
    target: PreTrainedModel,
    drafter: ModelTreeDrafter | PromptLookupTreeDrafter,
    prompt: torch.Tensor,
    *,
    parents: Sequence[int],
    scheme: str = "deterministic",
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    seed: int = 0,
) -> TreeGeneration:
    """Generate ``max_new_tokens`` tokens after ``prompt [T]`` (1-D int64) by tree speculative decoding.

    ``parents``: the tree shape drafted every step (e.g. ``specverify.core.tree_exact.binary_shape(6)``).
    ``scheme``: ``"deterministic"`` (top-k children) or ``"independent"`` (sampled children).
    ``temperature == 0`` is greedy decoding (the output equals the target's greedy output).
    """
    params = check_tree_inputs(target, prompt, scheme, max_new_tokens, temperature, top_k, top_p, min_p)
    shape = TreeShape.of(parents)
    device = model_device(target)
    generator = torch.Generator(device=device).manual_seed(int(seed))
    sequence = prompt.to(device)
    target_kv = TargetTreeCache(target, sequence)
    drafter.start()
    stats = TreeStats(depth=int(shape.depth.max()))

    while len(sequence) - len(prompt) < max_new_tokens:
        start = time.perf_counter()
        draft = drafter.propose(sequence, shape, scheme, params, generator)  # 1. draft a tree
        middle = time.perf_counter()
        logits = target_kv.score(sequence[-1], draft, shape)  # 2. score: one target pass
        result = verify(params.apply(logits.float()), draft, shape, params, generator)  # 3. verify
        target_kv.keep_path(shape, int(result.last_node[0]))  # 4. keep the accepted path's KV entries
        accepted = int(result.num_accepted[0])
        sequence = torch.cat([sequence, result.emitted[0, :accepted + 1]])
        stats.accepted_lengths.append(accepted)
        stats.draft_seconds += middle - start
        stats.target_seconds += time.perf_counter() - middle

    return TreeGeneration(sequence[len(prompt):len(prompt) + max_new_tokens], stats)


def check_tree_inputs(
    target: PreTrainedModel, prompt: torch.Tensor, scheme: str, max_new_tokens: int, temperature: float,
    top_k: int | None, top_p: float | None, min_p: float | None,
) -> SamplingParams:
    """Raise ``ValueError`` naming the argument for invalid input; return the sampling parameters."""
    if not isinstance(target, torch.nn.Module) or target.training:
        raise ValueError("target: expected a Hugging Face causal LM in eval mode")
    if not isinstance(prompt, torch.Tensor) or prompt.dtype != torch.int64 or prompt.dim() != 1 or len(prompt) == 0:
        raise ValueError("prompt: expected a non-empty 1-D int64 tensor (batch size 1)")
    if bool((prompt < 0).any() or (prompt >= vocab_size(target)).any()):
        raise ValueError(f"prompt: token ids outside the target's vocabulary [0, {vocab_size(target)})")
    if scheme not in TREE_SCHEMES:
        raise ValueError(f"scheme: expected one of {TREE_SCHEMES}, got {scheme!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


def generate(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
    parents: Sequence[int] = (-1, -1, 0, 0, 1, 1),
    scheme: str = "deterministic",
    min_p: float | None = None,
) -> torch.Tensor:
    """SPEC §2: ``max_new_tokens`` new tokens for ``input_ids [1, T]`` by tree speculative decoding with the
    draft model ``draft`` (default tree: binary, 6 nodes).  Extensions: ``parents``, ``scheme``, ``min_p``."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError("input_ids: expected an int64 tensor [1, T] (the tree decoder runs batch size 1)")
    generation = tree_speculative_generate(
        target, ModelTreeDrafter(draft), input_ids[0].to(model_device(target)), parents=parents, scheme=scheme,
        max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
    )
    return generation.tokens.to(input_ids.device)
