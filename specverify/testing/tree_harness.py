"""The tree-level harness: drives a SPEC §3 ``verify_tree`` function with trees it drafts itself.

The harness holds R toy language models (order-``k`` Markov chains as tables, a
:class:`specverify.core.chains.MarkovBank`, walked by its integer state arithmetic), picks a chain and a tree shape for each row
(rows of one call hold different shapes: ragged trees padded with absent nodes), drafts every
node's token from the draft law at its parent's path under the sibling scheme (independent,
without replacement, deterministic top-k), reads the target law at every node's path, calls the
function (a :class:`specverify.auditing.guarded.GuardedTreeFunction`, which validates each output
against SPEC §3 with :func:`specverify.core.outputs.validate_tree_emitted`: the accepted tokens
must be a root-to-node path of the row's tree) on large batches, and extends what was emitted by target sampling.  The
checks in :mod:`specverify.auditing.tree` then compare the collected tokens with the target's
exact law (Leviathan et al. 2023 Theorem 1 step by step, as in :mod:`specverify.testing.harness`).

All harness randomness comes from its own generator; the function gets its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from specverify.core.chains import MarkovBank
from specverify.core.sampling import sample

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


def draft_trees(bank: MarkovBank, chain: torch.Tensor, states: torch.Tensor, parents: torch.Tensor,
                present: torch.Tensor, scheme: str, generator: torch.Generator) -> Drafted:
    """Draft one tree per row (``parents``/``present`` give its shape) from the draft law at each
    node's parent path, under ``scheme``; read the target law at every node's path."""
    batch, width = parents.shape
    vocab = bank.vocab_size
    target_rows, draft_rows = bank.rows_in(torch.float64)
    tokens = torch.full((batch, width), -1, dtype=torch.int64)
    node_states = torch.full((batch, width), -1, dtype=torch.int64)
    draft = torch.zeros(batch, width, vocab, dtype=torch.float64)
    target = torch.full((batch, width + 1, vocab), 1.0 / vocab, dtype=torch.float64)
    target[:, 0] = target_rows[bank.table_rows(chain, states)]
    rows = torch.arange(batch)
    for n in range(width):
        parent = parents[:, n]
        parent_state = torch.where(parent >= 0, node_states[rows, parent.clamp(min=0)], states)
        q = draft_rows[bank.table_rows(chain, parent_state)]
        siblings = (parents[:, :n] == parent[:, None]) & present[:, :n]
        if scheme == "independent":
            law = q
        elif scheme == "without_replacement":
            removed = torch.zeros(batch, vocab, dtype=torch.int64)
            removed.scatter_add_(-1, tokens[:, :n].clamp(min=0), siblings.to(torch.int64))
            law = torch.where(removed > 0, 0.0, q)
            law = law / law.sum(-1, keepdim=True)
        elif scheme == "deterministic":
            rank = siblings.sum(-1)
            order = torch.sort(-q, dim=-1, stable=True).indices
            token = order[rows, rank.clamp(max=vocab - 1)]
            law = torch.nn.functional.one_hot(token, vocab).to(torch.float64)
        else:
            raise ValueError(f"scheme: unknown sibling scheme {scheme!r}")
        token = sample(law, generator) if scheme != "deterministic" else law.argmax(-1)
        live = present[:, n]
        tokens[:, n] = torch.where(live, token, -1)
        node_states[:, n] = torch.where(live, bank.next_state(parent_state, token), -1)
        draft[:, n] = torch.where(live[:, None], law, 0.0)
        target[:, n + 1] = torch.where(live[:, None], target_rows[bank.table_rows(chain, node_states[:, n].clamp(min=0))], 1.0 / vocab)
    proposal = TreeProposal(target.to(torch.float32), draft.to(torch.float32), tokens, parents.clone())
    return Drafted(proposal, node_states)


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


def sample_tree_steps(function: Any, bank: MarkovBank, *, shapes: Sequence[tuple[int, ...]],
                      scheme: str, length: int, n: int, batch_rows: int, harness_seed: int, function_seed: int,
                      where: str) -> TreeStepSample:
    """``n`` single steps (rows spread over the bank's chains and ``shapes``), each completed to
    ``length`` tokens by target sampling."""
    _check_markov(bank)
    harness = torch.Generator().manual_seed(harness_seed)
    fn_generator = function.generator(function_seed)
    chains, collected, accepted = [], [], []
    done = 0
    while done < n:
        rows = min(batch_rows, n - done)
        index = torch.arange(done, done + rows)
        chain = index % bank.num_chains
        shape_of_row = (index // bank.num_chains) % len(shapes)
        parents = padded_parents(shapes, shape_of_row)
        present = present_nodes(shapes, shape_of_row)
        states = bank.prompt_states(chain)
        drafted = draft_trees(bank, chain, states, parents, present, scheme, harness)
        emitted, lengths, _ = function(drafted.proposal, fn_generator, where=where)
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
