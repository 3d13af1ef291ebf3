"""The tree-level harness: drives a SPEC §3 ``verify_tree`` function with trees it drafts itself.

The harness holds R toy language models (order-``k`` Markov chains as tables, a
:class:`specverify.core.chains.MarkovBank`, walked by its integer state arithmetic), picks a chain and a tree shape
for each row (rows of one call hold different shapes: ragged trees padded with absent nodes), drafts every
node's token from the draft law at its parent's path under the sibling scheme (independent,
without replacement, deterministic top-k), reads the target law at every node's path, calls the
function (a :class:`specverify.auditing.isolation.guarded.GuardedTreeFunction`, which validates each output
against SPEC §3 with :func:`specverify.core.outputs.validate_tree_emitted`: the accepted tokens
must be a root-to-node path of the row's tree) on large batches, and extends what was emitted by target sampling.  The
checks in :mod:`specverify.auditing.tree.battery` then compare the collected tokens with the target's
exact law (Leviathan et al. 2023 Theorem 1 step by step, as in :mod:`specverify.testing.harness`).

All harness randomness comes from its own generator; the function gets its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch

from specverify.core.chains import MarkovBank

DEFAULT_TREE_ROWS = 4096
"""Rows per call of the function."""


class TreeProposal(NamedTuple):
    """SPEC §3 inputs of one call (float32 laws, as an engine would pass them)."""

    target_probs: torch.Tensor  # [B, N+1, V]
    draft_probs: torch.Tensor  # [B, N, V]
    tree_tokens: torch.Tensor  # [B, N]
    parents: torch.Tensor  # [B, N]


class Drafted(NamedTuple):
    proposal: TreeProposal
    node_states: torch.Tensor  # [B, N] Markov state after each node's path (-1 absent)


def padded_parents(shapes: Sequence[tuple[int, ...]], shape_of_row: torch.Tensor) -> torch.Tensor:
    """int64 ``[B, N]``: each row's shape, padded with -1 to the widest shape."""
    width = max(len(s) for s in shapes)
    table = torch.full((len(shapes), width), -1, dtype=torch.int64)
    for i, shape in enumerate(shapes):
        table[i, : len(shape)] = torch.tensor(shape, dtype=torch.int64)
    return table[shape_of_row]


def present_nodes(shapes: Sequence[tuple[int, ...]], shape_of_row: torch.Tensor) -> torch.Tensor:
    width = max(len(s) for s in shapes)
    sizes = torch.tensor([len(s) for s in shapes])[shape_of_row]
    return torch.arange(width)[None, :] < sizes[:, None]


def node_depths(parents: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """int64 ``[B, N]``: each present node's depth (1 for a child of the root), 0 for absent nodes."""
    depth = torch.zeros_like(parents)
    for n in range(parents.shape[1]):
        parent = parents[:, n]
        above = torch.where(parent >= 0, depth.gather(-1, parent.clamp(min=0)[:, None]).squeeze(-1), 0)
        depth[:, n] = torch.where(present[:, n], above + 1, 0)
    return depth


def sibling_ranks(parents: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """int64 ``[B, N]``: the number of earlier present siblings of each node (0 for a first child;
    0 for absent nodes)."""
    batch, width = parents.shape
    family = torch.arange(batch)[:, None] * (width + 1) + parents + 1  # (row, parent) of every node
    family = torch.where(present, family, -1).reshape(-1)
    order = torch.argsort(family, stable=True)  # by family, then by node index
    sorted_family = family[order]
    starts = torch.ones_like(sorted_family, dtype=torch.bool)
    starts[1:] = sorted_family[1:] != sorted_family[:-1]
    start_index = torch.where(starts, torch.arange(len(order)), 0).cummax(0).values
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order)) - start_index
    return torch.where(present, rank.reshape(batch, width), 0)


def draft_trees(bank: MarkovBank, chain: torch.Tensor, states: torch.Tensor, parents: torch.Tensor,
                present: torch.Tensor, scheme: str | Sequence[str], generator: torch.Generator,
                scheme_of_row: torch.Tensor | None = None, buffers: dict[str, torch.Tensor] | None = None) -> Drafted:
    """Draft one tree per row (``parents``/``present`` give its shape, nodes in any order with
    every node after its parent) from the draft law at each node's parent path, under ``scheme``
    (or, for several schemes, row ``b`` under ``scheme[scheme_of_row[b]]``: one call of a
    verifier may hold requests drafted in different ways); read the target law at every node's path.

    Siblings are drawn in index order; the nodes of one depth are drawn at once (a node's law
    depends on its parent's path and its earlier siblings only):

    - ``independent``: every node from the draft row of its parent's state;
    - ``without_replacement``: the children of a node in the order of ``E_t / q(t)`` (ascending)
      for i.i.d. ``E_t ~ Exp(1)`` — the exponential race, whose order is that of drawing from
      ``q`` one token at a time without replacement (Plackett–Luce); a child's law is ``q``
      without its earlier siblings' tokens, renormalised;
    - ``deterministic``: the ``k``-th child is the ``k``-th most likely draft token (ties by the
      lower id), with a one-hot law.

    Absent nodes get token -1, a zero draft row and a uniform target row.  The float32 laws are
    written once each (one gather from the bank's tables), which is what large V costs; with
    ``buffers`` (a dict the caller keeps between calls, whose earlier proposal it no longer uses)
    they are written into the same memory every call instead of freshly mapped pages.
    """
    schemes = (scheme,) if isinstance(scheme, str) else tuple(scheme)
    unknown = [s for s in schemes if s not in ("independent", "without_replacement", "deterministic")]
    if unknown or not schemes:
        raise ValueError(f"scheme: unknown sibling scheme(s) {unknown or schemes!r}")
    batch, width = parents.shape
    if scheme_of_row is None:
        scheme_of_row = torch.zeros(batch, dtype=torch.int64)
    vocab = bank.vocab_size
    target_rows32, draft_rows32 = bank.rows_in(torch.float32)  # what the function is given
    uniform_row, zero_row = target_rows32.shape[0], draft_rows32.shape[0]  # appended below
    depth = node_depths(parents, present)
    rank = sibling_ranks(parents, present)
    tokens = torch.full((batch, width), -1, dtype=torch.int64)
    node_states = torch.full((batch, width), -1, dtype=torch.int64)
    draft_source = torch.full((batch, width), zero_row, dtype=torch.int64)  # independent nodes: their table row
    one_hot: list[tuple[torch.Tensor, torch.Tensor]] = []  # (flat node index, token) of deterministic nodes
    explicit: list[tuple[torch.Tensor, torch.Tensor]] = []  # (flat node index, law) of nodes drawn without replacement
    row_scheme = [schemes[int(k)] for k in scheme_of_row.unique()]
    if any(s != "independent" for s in row_scheme) and bool((rank >= vocab).any()):
        raise ValueError(f"parents: a node has more than V = {vocab} children, which cannot be drawn "
                         "without replacement or deterministically")
    for level in range(1, int(depth.max()) + 1):
        level_rows, level_nodes = (depth == level).nonzero(as_tuple=True)
        for index, name in enumerate(schemes):
            mine = scheme_of_row[level_rows] == index
            if not bool(mine.any()):
                continue
            rows, nodes = level_rows[mine], level_nodes[mine]
            parent = parents[rows, nodes]
            parent_state = torch.where(parent >= 0, node_states[rows, parent.clamp(min=0)], states[rows])
            table_row = bank.table_rows(chain[rows], parent_state)
            node_rank = rank[rows, nodes]
            if name == "independent":
                token = bank.draft_sampler.sample(table_row, generator)
                draft_source[rows, nodes] = table_row
            elif name == "deterministic":
                token = bank.draft_tokens_by_rank(int(node_rank.max()) + 1)[table_row, node_rank]
                one_hot.append((rows * width + nodes, token))
            else:
                token, law = _race_children(bank, table_row, rows * (width + 1) + parent + 1, node_rank, generator)
                explicit.append((rows * width + nodes, law))
            tokens[rows, nodes] = token
            node_states[rows, nodes] = bank.next_state(parent_state, token)
    draft_table = torch.cat([draft_rows32, torch.zeros(1, vocab, dtype=torch.float32)])
    draft = _gather_rows(draft_table, draft_source.reshape(-1), buffers, "draft")
    for flat, token in one_hot:
        draft[flat, token] = 1.0
    for flat, law in explicit:
        draft.index_copy_(0, flat, law)
    target_source = torch.full((batch, width + 1), uniform_row, dtype=torch.int64)
    target_source[:, 0] = bank.table_rows(chain, states)
    rows, nodes = present.nonzero(as_tuple=True)
    target_source[rows, nodes + 1] = bank.table_rows(chain[rows], node_states[rows, nodes])
    target_table = torch.cat([target_rows32, torch.full((1, vocab), 1.0 / vocab, dtype=torch.float32)])
    target = _gather_rows(target_table, target_source.reshape(-1), buffers, "target")
    proposal = TreeProposal(target.view(batch, width + 1, vocab), draft.view(batch, width, vocab), tokens,
                            parents.clone())
    return Drafted(proposal, node_states)


RACE_MAX_VOCAB = 4096
"""Up to this V children drawn without replacement race (V clocks per parent); above it each is
drawn from ``q`` until its token is not an earlier sibling's (rejection; the removed mass is small)."""


def _gather_rows(table: torch.Tensor, index: torch.Tensor, buffers: dict[str, torch.Tensor] | None,
                 name: str) -> torch.Tensor:
    """``table[index]`` (``[len(index), V]``), written into ``buffers[name]`` when given (grown as needed)."""
    if buffers is None:
        return table.index_select(0, index)
    size = len(index) * table.shape[1]
    if name not in buffers or buffers[name].numel() < size:
        buffers[name] = torch.empty(size, dtype=table.dtype)
    out = buffers[name][:size].view(len(index), table.shape[1])
    return torch.index_select(table, 0, index, out=out)


def _race_children(bank: MarkovBank, table_row: torch.Tensor, family_key: torch.Tensor, node_rank: torch.Tensor,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and float32 laws of children drawn without replacement (``family_key``: one value
    per parent; ``node_rank``: each child's place among its siblings).

    V ≤ :data:`RACE_MAX_VOCAB`: the exponential race of :func:`draft_trees`, one race per parent,
    child ``k`` taking its ``k``-th arrival.  Larger V: the children of one level all have
    different parents' races in one go is too much memory, so each child is drawn from ``q``
    again and again until its token is none of its earlier siblings' (the law of ``q`` given
    that event: ``q`` without those tokens, renormalised); the earlier siblings of a node are on
    the same level, so the level's children are drawn rank by rank."""
    _, draft_rows = bank.rows_in(torch.float64)
    vocab = draft_rows.shape[1]
    if vocab <= RACE_MAX_VOCAB:
        family, member = torch.unique(family_key, return_inverse=True)
        family_q = draft_rows[table_row[_first_member(member, len(family))]]
        clocks = -torch.log1p(-torch.rand(len(family), vocab, generator=generator, dtype=torch.float64))
        arrival = torch.where(family_q > 0, clocks / family_q, torch.inf)  # q = 0: never arrives
        first = int(node_rank.max()) + 1  # the race's first places are all a level needs
        race = torch.topk(arrival, first, dim=-1, largest=False, sorted=True).indices
        token = race[member, node_rank]
        earlier = race[member]  # [M, first]: the tokens of the earlier siblings come first
        kept = torch.arange(first)[None, :] >= node_rank[:, None]
    else:
        token = torch.full_like(node_rank, -1)
        for place in range(int(node_rank.max()) + 1):  # siblings of lower rank are drawn first
            at = (node_rank == place).nonzero().squeeze(-1)
            siblings = _earlier_siblings(family_key, node_rank, token, at, place)
            pending = at
            while len(pending):
                drawn = bank.draft_sampler.sample(table_row[pending], generator)
                clash = ((siblings[:, :place] == drawn[:, None]).any(-1) if place
                         else torch.zeros_like(drawn, dtype=torch.bool))
                token[pending[~clash]] = drawn[~clash]
                pending, siblings = pending[clash], siblings[clash]
        earlier = _earlier_siblings(family_key, node_rank, token, torch.arange(len(token)), int(node_rank.max()) + 1)
        kept = earlier < 0
    law = draft_rows.index_select(0, table_row)
    child, column = (~kept).nonzero(as_tuple=True)
    law[child, earlier[child, column]] = 0.0  # the earlier siblings' tokens
    total = law.sum(-1, keepdim=True)
    if bool((total <= 0).any()):
        raise ValueError("bank: a node has more children than its draft law has tokens of positive "
                         "probability, so they cannot be drawn without replacement")
    return token, (law / total).to(torch.float32)


def _earlier_siblings(family_key: torch.Tensor, node_rank: torch.Tensor, token: torch.Tensor, at: torch.Tensor,
                      places: int) -> torch.Tensor:
    """int64 ``[len(at), places]``: for the children ``at``, the tokens of their siblings of rank
    ``0..places-1`` below their own rank (-1 elsewhere, and where not drawn yet)."""
    _, member = torch.unique(family_key, return_inverse=True)
    by_family = torch.full((int(member.max()) + 1, places), -1, dtype=torch.int64)
    low = node_rank < places
    by_family[member[low], node_rank[low]] = token[low]
    table = by_family[member[at]]
    return torch.where(torch.arange(places)[None, :] < node_rank[at, None], table, -1)


def _first_member(member: torch.Tensor, groups: int) -> torch.Tensor:
    """For ``member [M]`` (group ids ``0..groups-1``): the index of one element of each group."""
    first = torch.full((groups,), len(member), dtype=torch.int64)
    return first.scatter_reduce_(0, member, torch.arange(len(member)), reduce="amin")


def _check_markov(bank: Any) -> None:
    if getattr(bank, "kind", None) != "markov":
        raise ValueError("bank: the tree harness needs a MarkovBank (laws keyed by the path)")


class TreeStepSample(NamedTuple):
    chain: torch.Tensor  # [n]
    tokens: torch.Tensor  # [n, L]: emitted tokens completed by target sampling
    accepted: torch.Tensor  # [n]: accepted path length


def _complete(bank: MarkovBank, chain: torch.Tensor, states: torch.Tensor, tokens: torch.Tensor,
              known: torch.Tensor, length: int, generator: torch.Generator) -> torch.Tensor:
    """Fill columns ``>= known`` of ``tokens [B, L]`` by target sampling, walking the states."""
    out = tokens.clone()
    for j in range(length):
        sampled = bank.target_sampler.sample(bank.table_rows(chain, states), generator)
        out[:, j] = torch.where(j < known, out[:, j], sampled)
        states = bank.next_state(states, out[:, j])
    return out


def call_in_groups(function: Any, proposal: TreeProposal, generator: Any, sizes: Iterator[int],
                   where: str, strided: Iterator[bool] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass ``proposal``'s rows to ``function`` as consecutive groups of the sizes ``sizes``
    yields (one call per group, one generator throughout), each group cut to its own largest
    tree (``N`` = its rows' most present nodes), as an engine passes a batch of the requests it
    holds; ``strided`` (when given) says for each call whether its inputs arrive as views of
    wider buffers (:mod:`specverify.auditing.isolation.presentation`).  Returns ``(emitted [B, N+1]``
    padded with -1, ``lengths [B])``."""
    batch, width = proposal.tree_tokens.shape
    emitted = torch.full((batch, width + 1), -1, dtype=torch.int64)
    lengths = torch.zeros(batch, dtype=torch.int64)
    nodes = (proposal.tree_tokens >= 0).sum(-1)
    start = 0
    while start < batch:
        stop = min(batch, start + next(sizes))
        used = max(1, int(nodes[start:stop].max()))
        part = TreeProposal(proposal.target_probs[start:stop, : used + 1].contiguous(),
                            proposal.draft_probs[start:stop, :used].contiguous(),
                            proposal.tree_tokens[start:stop, :used].contiguous(),
                            proposal.parents[start:stop, :used].contiguous())
        if strided is None:
            out, count, _ = function(part, generator, where=where)
        else:
            out, count, _ = function(part, generator, where=where, strided=next(strided))
        emitted[start:stop, : used + 1] = out
        lengths[start:stop] = count
        start = stop
    return emitted, lengths


def sample_tree_steps(function: Any, bank: MarkovBank, *, shapes: Sequence[tuple[int, ...]],
                      scheme: str | Sequence[str], length: int, n: int, batch_rows: int, harness_seed: int,
                      function_seed: int, where: str, call_rows: Sequence[int] | None = None,
                      strided: Sequence[bool] | None = None) -> TreeStepSample:
    """``n`` single steps (rows spread over the bank's chains, ``shapes`` and schemes: row ``i``
    has chain ``i mod R``, shape ``(i // R) mod len(shapes)`` and, for several schemes, scheme
    ``(i // (R · len(shapes))) mod len(schemes)``), each completed to ``length`` tokens by target
    sampling.  Rows are drafted ``batch_rows`` at a time; each such batch is one call, or, with
    ``call_rows``, calls of those sizes in turn (:func:`call_in_groups`; the cycle runs on across
    batches), each presented contiguous or strided as ``strided`` says in turn (cycled too)."""
    _check_markov(bank)
    schemes = (scheme,) if isinstance(scheme, str) else tuple(scheme)
    harness = torch.Generator().manual_seed(harness_seed)
    fn_generator = function.generator(function_seed)
    sizes = itertools.cycle(call_rows) if call_rows else None
    presentations = itertools.cycle(strided) if strided else None
    buffers: dict[str, torch.Tensor] = {}  # each batch's laws overwrite the previous batch's
    chains, collected, accepted = [], [], []
    done = 0
    while done < n:
        rows = min(batch_rows, n - done)
        index = torch.arange(done, done + rows)
        chain = index % bank.num_chains
        shape_of_row = (index // bank.num_chains) % len(shapes)
        scheme_of_row = (index // (bank.num_chains * len(shapes))) % len(schemes)
        parents = padded_parents(shapes, shape_of_row)
        present = present_nodes(shapes, shape_of_row)
        states = bank.prompt_states(chain)
        drafted = draft_trees(bank, chain, states, parents, present, schemes, harness, scheme_of_row, buffers)
        if sizes is None:
            emitted, lengths, _ = function(drafted.proposal, fn_generator, where=where)
        else:
            emitted, lengths = call_in_groups(function, drafted.proposal, fn_generator, sizes, where, presentations)
        width = min(length, emitted.shape[1])
        tokens = torch.zeros(rows, length, dtype=torch.int64)
        tokens[:, :width] = emitted[:, :width].clamp(min=0)
        collected.append(_complete(bank, chain, states, tokens, lengths.clamp(max=length), length, harness))
        chains.append(chain)
        accepted.append(lengths - 1)
        done += rows
    return TreeStepSample(torch.cat(chains), torch.cat(collected), torch.cat(accepted))


def sample_tree_runs(function: Any, bank: MarkovBank, *, shapes: Sequence[tuple[int, ...]],
                     scheme: str, length: int, n: int, batch_rows: int, harness_seed: int, function_seed: int,
                     where: str) -> TreeStepSample:
    """``n`` whole decoding loops: every call drafts fresh trees (call ``c`` uses shape ``c mod |shapes|``
    for half the rows and the next shape for the others), until each sequence has ``length`` tokens."""
    _check_markov(bank)
    harness = torch.Generator().manual_seed(harness_seed)
    fn_generator = function.generator(function_seed)
    chains, collected = [], []
    done = 0
    while done < n:
        rows = min(batch_rows, n - done)
        chain = torch.arange(done, done + rows) % bank.num_chains
        states = bank.prompt_states(chain).clone()
        tokens = torch.zeros(rows, length, dtype=torch.int64)
        filled = torch.zeros(rows, dtype=torch.int64)
        call = 0
        while bool((filled < length).any()):
            live = (filled < length).nonzero().squeeze(-1)
            shape_of_row = (torch.arange(len(live)) % 2 + call) % len(shapes)
            parents = padded_parents(shapes, shape_of_row)
            present = present_nodes(shapes, shape_of_row)
            drafted = draft_trees(bank, chain[live], states[live], parents, present, scheme, harness)
            emitted, lengths, _ = function(drafted.proposal, fn_generator, where=where)
            for j in range(emitted.shape[1]):
                write = (j < lengths) & (filled[live] < length)
                target_rows = live[write]
                tokens[target_rows, filled[target_rows]] = emitted[write, j]
                states[target_rows] = bank.next_state(states[target_rows], emitted[write, j])
                filled[target_rows] += 1
            call += 1
        chains.append(chain)
        collected.append(tokens)
        done += rows
    return TreeStepSample(torch.cat(chains), torch.cat(collected), torch.zeros(n, dtype=torch.int64))
