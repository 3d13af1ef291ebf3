"""The sampler-level harness: drives a SPEC §1 ``verify`` function with drafts it samples itself.

The harness owns every random choice except the function's own: it holds R toy language models
("chains") as tables, picks a chain for each row, samples the draft tokens from the draft law q
along each row's path, reads the target law p along the same path (so the target at position i
depends on the draft tokens before i for context-dependent chains), calls the function on large
batches (rows are independent requests), validates each output, and extends what the function
emitted with target samples.  The statistical checks in :mod:`specverify.auditing.sampler` then compare
the collected tokens with the target's exact law.

Completion (why checking a single step is enough).  Speculative decoding is lossless when the
tokens one step emits, continued by ancestral sampling from the target, are distributed as
ancestral sampling from the target (Leviathan et al. 2023, Theorem 1 applied step by step).  So
for one step the harness appends target samples after the ``m`` emitted tokens and tests the law
of a window of the completed sequence; for whole decoding loops it calls the function repeatedly
and tests the first L tokens jointly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from specverify.auditing.guarded import CallLog, GuardedFunction  # noqa: F401 - re-exported

DEFAULT_BATCH_ROWS = 4096
"""Rows per call: large batches amortise the per-call overhead of the function and the harness."""

MAX_INPUT_ELEMENTS = 1 << 24
"""Cap on the probability entries of one call (``B·(2K+1)·V``; 64 MB in float32): large
vocabularies get proportionally fewer rows per call."""


# --------------------------------------------------------------------------------------------
# Chains as tables
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainBank:
    """R toy language models over one vocabulary, stored as tables (one chain per group of rows).

    ``kind == "positional"``: the state of a row is its position i in the step; tables are
    ``[R, K+1, V]`` (row K of ``draft`` is unused), as :class:`specverify.core.chains.PositionalChain`.
    ``kind == "markov"``: the state is the last ``order`` tokens (oldest first) read as a base-V
    number; tables are ``[R, V**order, V]`` and ``prompts [R, order]`` seeds the context, as
    :class:`specverify.core.chains.MarkovChain`.
    Tables are float64 numpy arrays whose rows sum to 1 (the exact laws the checks compare to).
    """

    kind: str
    target: np.ndarray
    draft: np.ndarray
    order: int = 0
    prompts: np.ndarray = field(default_factory=lambda: np.zeros((1, 0), dtype=np.int64))

    @property
    def num_chains(self) -> int:
        return self.target.shape[0]

    @property
    def num_states(self) -> int:
        return self.target.shape[1]

    @property
    def vocab_size(self) -> int:
        return self.target.shape[2]

    def chain(self, index: int) -> Any:
        """Chain ``index`` as a :mod:`specverify.core.chains` object (for :mod:`specverify.core.exact`)."""
        from specverify.core.chains import MarkovChain, PositionalChain

        if self.kind == "positional":
            return PositionalChain(self.target[index], self.draft[index, :-1])
        return MarkovChain(self.target[index], self.draft[index], self.order, tuple(int(t) for t in self.prompts[index]))


def positional_bank(p: np.ndarray, q: np.ndarray) -> ChainBank:
    """A bank of context-free steps: ``p [R, K+1, V]`` target laws, ``q [R, K, V]`` draft laws."""
    padded_q = np.concatenate([q, p[:, -1:]], axis=1)  # the bonus position has no draft law
    return ChainBank("positional", p, padded_q)


def markov_bank(target: np.ndarray, draft: np.ndarray, order: int, prompts: np.ndarray) -> ChainBank:
    """A bank of Markov chains: tables ``[R, V**order, V]``, ``prompts [R, order]``."""
    return ChainBank("markov", target, draft, order, prompts.astype(np.int64))


class _Sampler:
    """Categorical sampling from every row of a bank's table in one vectorised call.

    Inverse CDF on a single concatenated CDF: row ``k`` (of the flattened ``[R·S, V]`` table)
    occupies ``(k, k+1]`` after adding ``k`` to its cumulative sums, so token t of row k is drawn
    for ``u ~ U[0, 1)`` iff ``k + F_k(t−1) ≤ k + u·F_k(V−1) < k + F_k(t)`` — probability p_k(t),
    and a token of probability 0 is never drawn.  No ``[N, V]`` gather is needed.  (Should rounding
    of ``k + u·F_k(V−1)``, for u within ~1e-14 of 0 or 1, cross the row's ends, the row's first or
    last token of positive probability is returned.)
    """

    def __init__(self, table: np.ndarray) -> None:
        flat = torch.from_numpy(np.ascontiguousarray(table.reshape(-1, table.shape[-1])))
        cumulative = flat.cumsum(dim=-1)
        self.totals = cumulative[:, -1].clone()
        offsets = torch.arange(flat.shape[0], dtype=torch.float64)[:, None]
        self.shifted = (cumulative + offsets).reshape(-1)
        self.vocab_size = table.shape[-1]
        positive = (flat > 0).long()
        self.first_positive = positive.argmax(dim=-1)
        self.last_positive = self.vocab_size - 1 - positive.flip(-1).argmax(dim=-1)

    def sample(self, rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        u = torch.rand(rows.shape[0], generator=generator, dtype=torch.float64)
        values = rows.to(torch.float64) + u * self.totals[rows]
        tokens = torch.searchsorted(self.shifted, values, right=True) - rows * self.vocab_size
        return torch.maximum(torch.minimum(tokens, self.last_positive[rows]), self.first_positive[rows])


class RowState(NamedTuple):
    """Per-row decoding state: chain index, tokens generated so far, and the last ``order`` tokens."""

    chain: torch.Tensor     # int64 [N]
    position: torch.Tensor  # int64 [N]
    context: torch.Tensor   # int64 [N, order]


class Tables:
    """A bank prepared for the harness: flattened float32 tables for the function's inputs and
    inverse-CDF samplers for the target and the draft."""

    def __init__(self, bank: ChainBank, dtype: torch.dtype = torch.float32) -> None:
        self.bank = bank
        self.dtype = dtype
        flat_shape = (bank.num_chains * bank.num_states, bank.vocab_size)
        self.target_rows = torch.from_numpy(bank.target.reshape(flat_shape)).to(dtype)
        self.draft_rows = torch.from_numpy(bank.draft.reshape(flat_shape)).to(dtype)
        self.target_sampler = _Sampler(bank.target)
        self.draft_sampler = _Sampler(bank.draft)
        self.prompts = torch.from_numpy(bank.prompts)
        self.digit_weights = bank.vocab_size ** torch.arange(bank.order - 1, -1, -1, dtype=torch.int64)

    def initial_state(self, chain: torch.Tensor) -> RowState:
        return RowState(chain, torch.zeros_like(chain), self.prompts[chain].reshape(chain.shape[0], self.bank.order))

    def rows_of(self, state: RowState) -> torch.Tensor:
        """Index into the flattened tables: ``chain·S + state``."""
        if self.bank.kind == "positional":
            local = state.position
        else:
            local = (state.context * self.digit_weights).sum(dim=1)
        return state.chain * self.bank.num_states + local

    def advance(self, state: RowState, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> RowState:
        """The state after appending ``tokens [N]`` (only to the rows where ``mask`` is true)."""
        if mask is None:
            mask = torch.ones_like(tokens, dtype=torch.bool)
        position = state.position + mask.long()
        context = state.context
        if self.bank.order:
            shifted = torch.cat([context[:, 1:], tokens.clamp(min=0)[:, None]], dim=1)
            context = torch.where(mask[:, None], shifted, context)
        return RowState(state.chain, position, context)


def subset(state: RowState, keep: torch.Tensor) -> RowState:
    return RowState(state.chain[keep], state.position[keep], state.context[keep])


def concat(first: RowState, second: RowState) -> RowState:
    return RowState(*(torch.cat([a, b]) for a, b in zip(first, second)))


# --------------------------------------------------------------------------------------------
# Proposal: drafts sampled from q along each row's path, target laws along the same path
# --------------------------------------------------------------------------------------------


class Proposal(NamedTuple):
    """The inputs of one call (SPEC §1), in the harness's float dtype, on the CPU."""

    target_probs: torch.Tensor  # [N, K+1, V]
    draft_probs: torch.Tensor   # [N, K, V]
    draft_tokens: torch.Tensor  # int64 [N, K]


def propose(tables: Tables, state: RowState, num_draft: int, generator: torch.Generator) -> Proposal:
    """Sample ``x_i ~ q(· | context, x_<i)`` for i < K and read ``p(· | context, x_<i)`` for i ≤ K."""
    target_rows, draft_rows, tokens = [], [], []
    for _ in range(num_draft):
        rows = tables.rows_of(state)
        token = tables.draft_sampler.sample(rows, generator)
        target_rows.append(rows)
        draft_rows.append(rows)
        tokens.append(token)
        state = tables.advance(state, token)
    target_rows.append(tables.rows_of(state))
    return Proposal(
        tables.target_rows[torch.stack(target_rows, dim=1)],
        tables.draft_rows[torch.stack(draft_rows, dim=1)],
        torch.stack(tokens, dim=1),
    )


def complete(tables: Tables, state: RowState, emitted: torch.Tensor, lengths: torch.Tensor, upto: int,
             generator: torch.Generator) -> torch.Tensor:
    """int64 ``[N, upto]``: the emitted tokens, continued by target sampling after each row's
    ``lengths[b]`` emitted tokens (for positional banks ``upto ≤ K+1``)."""
    columns = []
    for position in range(upto):
        from_function = position < lengths
        token = emitted[:, position].clone() if position < emitted.shape[1] else torch.full_like(lengths, -1)
        need = (~from_function).nonzero().squeeze(-1)
        if need.numel():
            token[need] = tables.target_sampler.sample(tables.rows_of(subset(state, need)), generator)
        columns.append(token)
        state = tables.advance(state, token)
    return torch.stack(columns, dim=1)


# --------------------------------------------------------------------------------------------
# Guarded calls
# --------------------------------------------------------------------------------------------


# GuardedFunction and CallLog live in specverify.auditing.guarded (worker-process isolation); the
# names are re-exported here for the harness's callers.


def rows_per_call(batch_rows: int, num_draft: int, vocab_size: int) -> int:
    """Rows per call: ``batch_rows``, fewer when one call's inputs would exceed MAX_INPUT_ELEMENTS."""
    return max(1, min(batch_rows, MAX_INPUT_ELEMENTS // ((2 * num_draft + 1) * vocab_size)))


# --------------------------------------------------------------------------------------------
# Sampling runs
# --------------------------------------------------------------------------------------------


class StepSample(NamedTuple):
    """Outcome of :func:`sample_steps`: one verification step per row.

    chain: int64 [n], the chain of each row; window: int64 [n, W], the completed tokens at
    positions ``start..start+W−1``; accepted: int64 [K+1], rows with 0..K leading tokens equal to
    the drafts before the final token (emitted length − 1); first_is_draft: rows whose first
    emitted token equals their first draft token.
    """

    chain: torch.Tensor
    window: torch.Tensor
    accepted: torch.Tensor
    first_is_draft: int


def sample_steps(function: GuardedFunction, tables: Tables, *, num_draft: int, window: tuple[int, int], n: int,
                 batch_rows: int, harness_seed: int, function_seed: int, where: str) -> StepSample:
    """Run ``n`` independent single steps with K = ``num_draft`` drafts, rows spread uniformly at
    random over the bank's chains, and collect each row's completed tokens in ``window``
    (``(start, length)``)."""
    start, length = window
    generator = torch.Generator().manual_seed(harness_seed)
    function_generator = function.generator(function_seed)
    per_call = rows_per_call(batch_rows, num_draft, tables.bank.vocab_size)
    chains, windows = [], []
    accepted = torch.zeros(num_draft + 1, dtype=torch.int64)
    first_is_draft = 0
    for offset in range(0, n, per_call):
        rows = min(per_call, n - offset)
        chain = torch.randint(tables.bank.num_chains, (rows,), generator=generator)
        state = tables.initial_state(chain)
        proposal = propose(tables, state, num_draft, generator)
        emitted, lengths = function(proposal, function_generator, where=where)
        completed = complete(tables, state, emitted, lengths, start + length, generator)
        chains.append(chain)
        windows.append(completed[:, start:])
        accepted += torch.bincount(lengths - 1, minlength=num_draft + 1)
        first_is_draft += int((emitted[:, 0] == proposal.draft_tokens[:, 0]).sum())
    return StepSample(torch.cat(chains), torch.cat(windows), accepted, first_is_draft)


class RunSample(NamedTuple):
    """Outcome of :func:`sample_runs`: ``tokens [n, L]`` are the first L tokens of each sequence,
    ``chain [n]`` its chain; ``calls`` the number of calls made."""

    chain: torch.Tensor
    tokens: torch.Tensor
    calls: int


def sample_runs(function: GuardedFunction, tables: Tables, *, length: int, draft_schedule: tuple[int, ...], n: int,
                batch_rows: int, harness_seed: int, function_seed: int, where: str) -> RunSample:
    """Generate the first ``length`` tokens of ``n`` sequences by whole speculative decoding loops.

    Continuous batching: a batch holds up to ``batch_rows`` sequences at different stages; each
    call runs one step for every sequence in it with K = ``draft_schedule[call % len]`` drafts
    (K changes from call to call, as with adaptive drafting); a sequence keeps its per-row context
    and advances by however many tokens its step emitted (truncated at ``length``); finished
    sequences leave the batch and new ones take their place.
    """
    generator = torch.Generator().manual_seed(harness_seed)
    function_generator = function.generator(function_seed)
    chain = torch.randint(tables.bank.num_chains, (n,), generator=generator)
    tokens = torch.full((n, length), -1, dtype=torch.int64)
    produced = torch.zeros(n, dtype=torch.int64)
    active = torch.arange(min(batch_rows, n))
    next_sequence = active.numel()
    state = tables.initial_state(chain[active])
    calls = 0
    while active.numel():
        num_draft = draft_schedule[calls % len(draft_schedule)]
        proposal = propose(tables, state, num_draft, generator)
        emitted, lengths = function(proposal, function_generator, where=f"{where}, call {calls}")
        calls += 1
        take = torch.minimum(lengths, length - produced[active])
        for slot in range(num_draft + 1):
            mask = slot < take
            if not bool(mask.any()):
                break
            sequences = active[mask]
            tokens[sequences, produced[sequences]] = emitted[mask, slot]
            produced[sequences] += 1
            state = tables.advance(state, emitted[:, slot], mask)
        keep = produced[active] < length
        active, state = active[keep], subset(state, keep)
        joining = torch.arange(next_sequence, min(n, next_sequence + batch_rows - active.numel()))
        next_sequence += joining.numel()
        active = torch.cat([active, joining])
        state = concat(state, tables.initial_state(chain[joining]))
    return RunSample(chain, tokens, calls)


# --------------------------------------------------------------------------------------------
# Exact target laws of the tested windows
# --------------------------------------------------------------------------------------------


def positional_window_law(bank: ChainBank, chain: int, window: tuple[int, int], cell_maps: np.ndarray,
                          cells_per_position: int) -> np.ndarray:
    """Target law of the cells of positions ``start..start+W−1`` of one positional chain.

    Under the target the tokens of a context-free step are independent across positions, so the
    law of the window is the product of the per-position laws, each pooled into cells by
    ``cell_maps [W, V]`` (token -> cell at that position): ``P(c_0..c_{W−1}) = Π_j Σ_{t: map_j(t)=c_j} p_{start+j}(t)``.
    Returns a flat float64 vector of ``cells_per_position**W`` entries (first position most significant).
    """
    start, length = window
    law = np.ones(1)
    for j in range(length):
        pooled = np.bincount(cell_maps[j], weights=bank.target[chain, start + j], minlength=cells_per_position)
        law = np.outer(law, pooled).reshape(-1)
    return law


def markov_prefix_law(bank: ChainBank, chain: int, length: int) -> np.ndarray:
    """Target law of the first ``length`` generated tokens of one Markov chain, by enumeration:
    ``P(t_1..t_L) = Π_i p(t_i | prompt, t_<i)`` for all V**L sequences (first token most significant)."""
    vocab, order = bank.vocab_size, bank.order
    weights = vocab ** np.arange(order - 1, -1, -1)
    law = np.ones(1)
    contexts = bank.prompts[chain][None, :].copy()
    for _ in range(length):
        states = (contexts * weights).sum(axis=1) if order else np.zeros(len(contexts), dtype=np.int64)
        law = (law[:, None] * bank.target[chain, states]).reshape(-1)
        tokens = np.tile(np.arange(vocab), len(contexts))
        contexts = np.repeat(contexts, vocab, axis=0)
        if order:
            contexts = np.concatenate([contexts[:, 1:], tokens[:, None]], axis=1)
    return law
