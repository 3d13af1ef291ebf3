"""The tree-level harness: drives a SPEC §3 ``verify_tree`` function with trees it drafts itself.

The harness holds R toy language models (order-``k`` Markov chains as tables, a
:class:`specverify.testing.harness.ChainBank`), picks a chain and a tree shape for each row
(rows of one call hold different shapes: ragged trees padded with absent nodes), drafts every
node's token from the draft law at its parent's path under the sibling scheme (independent,
without replacement, deterministic top-k), reads the target law at every node's path, calls the
function on large batches, validates each output against SPEC §3 (the accepted tokens must be a
root-to-node path of the row's tree), and extends what was emitted by target sampling.  The
checks in :mod:`specverify.auditing.tree` then compare the collected tokens with the target's
exact law (Leviathan et al. 2023 Theorem 1 step by step, as in :mod:`specverify.testing.harness`).

All harness randomness comes from its own generator; the function gets its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from specverify.auditing.faults import Fault, call_with_deadline, mutated_arguments
from specverify.core.chains import ChainBank
from specverify.core.outputs import emitted_tensor
from specverify.auditing.guarded import CallLog

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


class TreeTables:
    """A Markov bank as torch tables, with the state arithmetic of one Markov step."""

    def __init__(self, bank: ChainBank) -> None:
        if bank.kind != "markov":
            raise ValueError("bank: the tree harness needs a Markov bank (laws keyed by the path)")
        self.bank = bank
        self.target = torch.from_numpy(bank.target)
        self.draft = torch.from_numpy(bank.draft)
        self.vocab = bank.vocab_size
        self.modulus = bank.vocab_size ** bank.order
        weights = bank.vocab_size ** np.arange(bank.order - 1, -1, -1)
        self.prompt_states = torch.from_numpy((bank.prompts * weights).sum(axis=1).astype(np.int64)) if bank.order \
            else torch.zeros(bank.num_chains, dtype=torch.int64)

    def advance(self, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """State after appending ``tokens`` (oldest digit dropped)."""
        if self.modulus == 1:
            return torch.zeros_like(states)
        return (states * self.vocab + tokens) % self.modulus


def _sample(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row from float64 weights ``[B, V]`` (inverse CDF)."""
    cumulative = weights.cumsum(-1)
    u = torch.rand(weights.shape[0], 1, generator=generator, dtype=torch.float64) * cumulative[:, -1:]
    return torch.searchsorted(cumulative, u, right=True).squeeze(-1).clamp(max=weights.shape[-1] - 1)


def draft_trees(tables: TreeTables, chain: torch.Tensor, states: torch.Tensor, parents: torch.Tensor,
                present: torch.Tensor, scheme: str, generator: torch.Generator) -> Drafted:
    """Draft one tree per row (``parents``/``present`` give its shape) from the draft law at each
    node's parent path, under ``scheme``; read the target law at every node's path."""
    batch, width = parents.shape
    vocab = tables.vocab
    tokens = torch.full((batch, width), -1, dtype=torch.int64)
    node_states = torch.full((batch, width), -1, dtype=torch.int64)
    draft = torch.zeros(batch, width, vocab, dtype=torch.float64)
    target = torch.full((batch, width + 1, vocab), 1.0 / vocab, dtype=torch.float64)
    target[:, 0] = tables.target[chain, states]
    rows = torch.arange(batch)
    for n in range(width):
        parent = parents[:, n]
        parent_state = torch.where(parent >= 0, node_states[rows, parent.clamp(min=0)], states)
        q = tables.draft[chain, parent_state].clone()
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
        token = _sample(law, generator) if scheme != "deterministic" else law.argmax(-1)
        live = present[:, n]
        tokens[:, n] = torch.where(live, token, -1)
        node_states[:, n] = torch.where(live, tables.advance(parent_state, token), -1)
        draft[:, n] = torch.where(live[:, None], law, 0.0)
        target[:, n + 1] = torch.where(live[:, None], tables.target[chain, node_states[:, n].clamp(min=0)], 1.0 / vocab)
    proposal = TreeProposal(target.to(torch.float32), draft.to(torch.float32), tokens, parents.clone())
    return Drafted(proposal, node_states)


def validate_tree_emitted(result: Any, tree_tokens: torch.Tensor, parents: torch.Tensor,
                          vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check one call's output against SPEC §3; return ``(emitted, lengths, last_node)`` on the CPU.

    ``emitted`` must be an int64 tensor ``[B, N+1]``; row b holds ``m_b ≥ 1`` tokens in ``[0, V)``
    followed only by ``-1``, and its first ``m_b − 1`` tokens must be the tokens of a root-to-node
    path of the row's tree (with duplicate sibling tokens any matching child may continue the path;
    ``last_node`` is the lowest-index node that ends a matching path).
    Raises :class:`Fault` (``malformed``) naming the first offending row.
    """
    emitted = emitted_tensor(result).detach()
    batch, width = tree_tokens.shape
    if emitted.dtype != torch.int64:
        raise Fault("malformed", f"returned dtype {emitted.dtype}, expected torch.int64 token ids (convert with .long())")
    if tuple(emitted.shape) != (batch, width + 1):
        raise Fault("malformed", f"returned shape {tuple(emitted.shape)}, expected [B, N+1] = [{batch}, {width + 1}]")
    emitted = emitted.cpu()
    padding = emitted == -1
    out_of_range = ~padding & ((emitted < 0) | (emitted >= vocab_size))
    if bool(out_of_range.any()):
        row, col = (int(i) for i in out_of_range.nonzero()[0])
        raise Fault("malformed", f"returned token id {int(emitted[row, col])} outside [0, {vocab_size}) "
                                 f"(row {row}, slot {col}; -1 is the only allowed padding)")
    lengths = (~padding).long().cumprod(dim=-1).sum(dim=-1)
    after = ~padding & (torch.arange(width + 1) >= lengths[:, None])
    if bool(after.any()):
        row = int(after.any(dim=-1).nonzero()[0, 0])
        raise Fault("malformed", f"emitted a token after -1 padding (row {row}: {emitted[row].tolist()})")
    if bool((lengths == 0).any()):
        row = int((lengths == 0).nonzero()[0, 0])
        raise Fault("malformed", f"emitted no token in row {row} (every step emits at least the correction-or-bonus token)")
    # Candidate nodes after j accepted tokens (column 0: the root); with duplicate sibling tokens
    # a token can match several children, so every matching path is followed.
    present = tree_tokens >= 0
    reached = torch.zeros(batch, width + 1, dtype=torch.bool)
    reached[:, 0] = True
    current = torch.full((batch,), -1, dtype=torch.int64)
    for j in range(width):
        on_path = j < lengths - 1
        under_reached = reached.gather(-1, parents + 1)
        match = present & under_reached & (tree_tokens == emitted[:, j:j + 1])
        broken = on_path & ~match.any(-1)
        if bool(broken.any()):
            row = int(broken.nonzero()[0, 0])
            raise Fault("malformed", f"row {row}: emitted {emitted[row].tolist()}, whose accepted tokens are not a "
                                     f"root-to-node path of the tree (slot {j}: token {int(emitted[row, j])} is not a "
                                     f"child of the path so far; tree_tokens {tree_tokens[row].tolist()}, parents "
                                     f"{parents[row].tolist()}): only the tokens of an accepted path may precede the "
                                     "correction-or-bonus token")
        current = torch.where(on_path, match.to(torch.int64).argmax(-1), current)
        reached = torch.where(on_path[:, None], torch.cat([torch.zeros(batch, 1, dtype=torch.bool), match], 1), reached)
    return emitted, lengths, current


class GuardedTreeFunction:
    """Calls the function under audit on a :class:`TreeProposal` with every guard: a per-call
    deadline, exception capture, SPEC §3 output validation and input-mutation detection."""

    def __init__(self, fn: Callable[..., Any], *, timeout_s: float, device: str = "cpu") -> None:
        self.fn = fn
        self.timeout_s = timeout_s
        self.device = torch.device(device)
        self.log = CallLog()

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    def __call__(self, proposal: TreeProposal, generator: torch.Generator, *,
                 where: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        passed = {name: tensor.to(self.device, copy=True) for name, tensor in proposal._asdict().items()}
        started = time.perf_counter()
        result = call_with_deadline(self.fn, tuple(passed.values()) + (generator,), self.timeout_s,
                                    what=f"the function (in {where})")
        self.log.function_seconds += time.perf_counter() - started
        self.log.calls += 1
        self.log.rows += proposal.tree_tokens.shape[0]
        changed = mutated_arguments(proposal._asdict(), passed)
        if changed:
            self.log.mutations.append(f"{where}: modified {', '.join(changed)} in place")
        return validate_tree_emitted(result, proposal.tree_tokens, proposal.parents, proposal.target_probs.shape[-1])


class TreeStepSample(NamedTuple):
    chain: torch.Tensor  # [n]
    tokens: torch.Tensor  # [n, L]: emitted tokens completed by target sampling
    accepted: torch.Tensor  # [n]: accepted path length


def _complete(tables: TreeTables, chain: torch.Tensor, states: torch.Tensor, tokens: torch.Tensor,
              known: torch.Tensor, length: int, generator: torch.Generator) -> torch.Tensor:
    """Fill columns ``>= known`` of ``tokens [B, L]`` by target sampling, walking the states."""
    out = tokens.clone()
    for j in range(length):
        sampled = _sample(tables.target[chain, states], generator)
        out[:, j] = torch.where(j < known, out[:, j], sampled)
        states = tables.advance(states, out[:, j])
    return out


def sample_tree_steps(function: GuardedTreeFunction, bank: ChainBank, *, shapes: Sequence[tuple[int, ...]],
                      scheme: str, length: int, n: int, batch_rows: int, harness_seed: int, function_seed: int,
                      where: str) -> TreeStepSample:
    """``n`` single steps (rows spread over the bank's chains and ``shapes``), each completed to
    ``length`` tokens by target sampling."""
    tables = TreeTables(bank)
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
        states = tables.prompt_states[chain]
        drafted = draft_trees(tables, chain, states, parents, present, scheme, harness)
        emitted, lengths, _ = function(drafted.proposal, fn_generator, where=where)
        width = min(length, emitted.shape[1])
        tokens = torch.zeros(rows, length, dtype=torch.int64)
        tokens[:, :width] = emitted[:, :width].clamp(min=0)
        collected.append(_complete(tables, chain, states, tokens, lengths.clamp(max=length), length, harness))
        chains.append(chain)
        accepted.append(lengths - 1)
        done += rows
    return TreeStepSample(torch.cat(chains), torch.cat(collected), torch.cat(accepted))


def sample_tree_runs(function: GuardedTreeFunction, bank: ChainBank, *, shapes: Sequence[tuple[int, ...]],
                     scheme: str, length: int, n: int, batch_rows: int, harness_seed: int, function_seed: int,
                     where: str) -> TreeStepSample:
    """``n`` whole decoding loops: every call drafts fresh trees (call ``c`` uses shape ``c mod |shapes|``
    for half the rows and the next shape for the others), until each sequence has ``length`` tokens."""
    tables = TreeTables(bank)
    harness = torch.Generator().manual_seed(harness_seed)
    fn_generator = function.generator(function_seed)
    chains, collected = [], []
    done = 0
    while done < n:
        rows = min(batch_rows, n - done)
        chain = torch.arange(done, done + rows) % bank.num_chains
        states = tables.prompt_states[chain].clone()
        tokens = torch.zeros(rows, length, dtype=torch.int64)
        filled = torch.zeros(rows, dtype=torch.int64)
        call = 0
        while bool((filled < length).any()):
            live = (filled < length).nonzero().squeeze(-1)
            shape_of_row = (torch.arange(len(live)) % 2 + call) % len(shapes)
            parents = padded_parents(shapes, shape_of_row)
            present = present_nodes(shapes, shape_of_row)
            drafted = draft_trees(tables, chain[live], states[live], parents, present, scheme, harness)
            emitted, lengths, _ = function(drafted.proposal, fn_generator, where=where)
            for j in range(emitted.shape[1]):
                write = (j < lengths) & (filled[live] < length)
                target_rows = live[write]
                tokens[target_rows, filled[target_rows]] = emitted[write, j]
                states[target_rows] = tables.advance(states[target_rows], emitted[write, j])
                filled[target_rows] += 1
            call += 1
        chains.append(chain)
        collected.append(tokens)
        done += rows
    return TreeStepSample(torch.cat(chains), torch.cat(collected), torch.zeros(n, dtype=torch.int64))
