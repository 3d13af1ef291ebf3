"""The sampler-level harness: drives a SPEC §1 ``verify`` function with drafts it samples itself.

The harness owns every random choice except the function's own: it takes R toy language models
as one bank (:class:`specverify.core.chains.ChainBank`: tables plus a vectorised row state), picks
a chain for each row, samples the draft tokens from the draft law q
along each row's path, reads the target law p along the same path (so the target at position i
depends on the draft tokens before i for context-dependent chains), calls the function on large
batches (rows are independent requests), validates each output, and extends what the function
emitted with target samples.  The statistical checks in :mod:`specverify.auditing.sampler.battery` then compare
the collected tokens with the target's exact law.

Completion (why checking a single step is enough).  Speculative decoding is lossless when the
tokens one step emits, continued by ancestral sampling from the target, are distributed as
ancestral sampling from the target (Leviathan et al. 2023, Theorem 1 applied step by step).  So
for one step the harness appends target samples after the ``m`` emitted tokens and tests the law
of a window of the completed sequence; for whole decoding loops it calls the function repeatedly
and tests the first L tokens jointly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from specverify.auditing.isolation.guarded import CallLog, GuardedFunction  # noqa: F401 - re-exported
from specverify.auditing.isolation.presentation import decoy_value
from specverify.core.chains import ChainBank, MarkovBank, PositionalBank, RowState
from specverify.core.seeding import derive_seed

DEFAULT_BATCH_ROWS = 4096
"""Rows per call: large batches amortise the per-call overhead of the function and the harness."""

INPUT_DTYPE = torch.float32
"""dtype of the probabilities handed to the function (what engines pass)."""

MAX_INPUT_ELEMENTS = 1 << 24
"""Cap on the probability entries of one call (``B·(2K+1)·V``; 64 MB in float32): large
vocabularies get proportionally fewer rows per call."""


# --------------------------------------------------------------------------------------------
# Proposal: drafts sampled from q along each row's path, target laws along the same path
# --------------------------------------------------------------------------------------------


class Proposal(NamedTuple):
    """The inputs of one call (SPEC §1), in the harness's float dtype, on the CPU."""

    target_probs: torch.Tensor  # [N, K+1, V]
    draft_probs: torch.Tensor   # [N, K, V]
    draft_tokens: torch.Tensor  # int64 [N, K]


def propose(bank: ChainBank, state: RowState, num_draft: int, generator: torch.Generator,
            dtype: torch.dtype = INPUT_DTYPE) -> Proposal:
    """Sample ``x_i ~ q(· | context, x_<i)`` for i < K and read ``p(· | context, x_<i)`` for i ≤ K
    (a positional bank's drafts at once, :func:`positional_drafts`; a Markov bank's one position
    after another)."""
    target_table, draft_table = bank.rows_in(dtype)
    if isinstance(bank, PositionalBank):
        rows, drafts = positional_drafts(bank, state, num_draft, generator)
        return Proposal(gathered_rows(target_table, rows), gathered_rows(draft_table, rows[:, :num_draft]), drafts)
    path_rows, tokens = [], []
    for _ in range(num_draft):
        rows = bank.rows_of(state)
        token = bank.draft_sampler.sample(rows, generator)
        path_rows.append(rows)
        tokens.append(token)
        state = bank.advance(state, token)
    return Proposal(
        gathered_rows(target_table, torch.stack(path_rows + [bank.rows_of(state)], dim=1)),
        gathered_rows(draft_table, torch.stack(path_rows, dim=1)),
        torch.stack(tokens, dim=1),
    )


def positional_drafts(bank: PositionalBank, state: RowState, num_draft: int,
                      generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``[N, K+1]``, the table rows of each row's positions ``position … position + K``, and
    ``[N, K]``, its drafts ``x_i ~ q_i``: a positional bank's law at a position does not depend on
    the tokens before it, so the drafts are drawn at once, one uniform per (row, position) in
    row-major order."""
    rows = bank.table_rows(state.chain[:, None], state.position[:, None] + torch.arange(num_draft + 1))
    drafts = bank.draft_sampler.sample(rows[:, :num_draft].reshape(-1), generator)
    return rows, drafts.view(rows.shape[0], num_draft)


def gathered_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for a table ``[R, V]`` and int64 ``index`` of any shape: ``[*index.shape, V]``,
    by ``index_select`` (at a small V several times faster than advanced indexing)."""
    return table.index_select(0, index.reshape(-1)).view(*index.shape, table.shape[1])


class RaggedProposal(NamedTuple):
    """The inputs of one call with ragged rows (docs/spec.md §1, ``num_draft_tokens=``): row b's
    drafts ``0..k_b-1`` and targets ``0..k_b`` are real; the rest is padding the function must ignore."""

    target_probs: torch.Tensor      # [N, K+1, V]
    draft_probs: torch.Tensor       # [N, K, V]
    draft_tokens: torch.Tensor      # int64 [N, K]
    num_draft_tokens: torch.Tensor  # int64 [N], entries 0..K


def propose_ragged(bank: ChainBank, state: RowState, num_draft_tokens: torch.Tensor, width: int,
                   generator: torch.Generator, dtype: torch.dtype = INPUT_DTYPE) -> RaggedProposal:
    """:func:`propose` with ``width`` = K draft columns, of which row b keeps its first
    ``num_draft_tokens[b] = k_b``.  The padding holds a valid decoy
    (:func:`~specverify.auditing.isolation.presentation.decoy_value`: uniform laws, the last token
    id), so a function that reads it as drafts (every decoy draft passes ``u·q < p``) or takes the
    bonus at position K instead of k_b emits tokens of the wrong law."""
    full = propose(bank, state, width, generator, dtype)
    vocab = bank.vocab_size
    columns = torch.arange(width + 1)
    padded_target = columns[None, :] > num_draft_tokens[:, None]
    padded_draft = columns[None, :width] >= num_draft_tokens[:, None]
    target = torch.where(padded_target[..., None], decoy_value("target_probs", vocab), full.target_probs)
    draft = torch.where(padded_draft[..., None], decoy_value("draft_probs", vocab), full.draft_probs)
    tokens = torch.where(padded_draft, decoy_value("draft_tokens", vocab), full.draft_tokens)
    return RaggedProposal(target.to(dtype), draft.to(dtype), tokens, num_draft_tokens.clone())


def complete(bank: ChainBank, state: RowState, emitted: torch.Tensor, lengths: torch.Tensor, upto: int,
             generator: torch.Generator) -> torch.Tensor:
    """int64 ``[N, upto]``: the emitted tokens, continued by target sampling after each row's
    ``lengths[b]`` emitted tokens (for positional banks ``upto ≤ K+1``).  A positional bank's law
    at a position does not depend on the tokens before it: its completions are drawn at once, one
    uniform per completed (row, position) in row-major order; a Markov bank's position by position."""
    if isinstance(bank, PositionalBank):
        return _complete_positional(bank, state, emitted, lengths, upto, generator)
    columns = []
    for position in range(upto):
        from_function = position < lengths
        token = emitted[:, position].clone() if position < emitted.shape[1] else torch.full_like(lengths, -1)
        need = (~from_function).nonzero().squeeze(-1)
        if need.numel():
            token[need] = bank.target_sampler.sample(bank.rows_of(state.take(need)), generator)
        columns.append(token)
        state = bank.advance(state, token)
    return torch.stack(columns, dim=1)


def _complete_positional(bank: PositionalBank, state: RowState, emitted: torch.Tensor, lengths: torch.Tensor,
                         upto: int, generator: torch.Generator) -> torch.Tensor:
    """:func:`complete` for a positional bank: row ``b``'s token at column ``j ≥ lengths[b]`` drawn
    from its chain's target law at position ``position[b] + j``."""
    rows = lengths.shape[0]
    completed = torch.full((rows, upto), -1, dtype=torch.int64)
    kept = min(upto, emitted.shape[1])
    completed[:, :kept] = emitted[:, :kept]
    need = torch.arange(upto)[None, :] >= lengths[:, None]
    row, column = need.nonzero(as_tuple=True)
    if row.numel():
        table = bank.table_rows(state.chain[row], state.position[row] + column)
        completed[row, column] = bank.target_sampler.sample(table, generator)
    return completed


# --------------------------------------------------------------------------------------------
# Guarded calls
# --------------------------------------------------------------------------------------------


# GuardedFunction and CallLog live in specverify.auditing.isolation.guarded (worker-process isolation); the
# names are re-exported here for the harness's callers.


class ProposalFunction(Protocol):
    """What :func:`sample_steps` and :func:`sample_runs` call: :class:`GuardedFunction`, or the property
    suite's in-process ``specverify.properties.sampled_checks.DirectCall``."""

    def generator(self, seed: int) -> Any:
        """A fresh generator of the function's, seeded with ``seed``."""

    def __call__(self, proposal: Proposal, generator: Any, *, where: str) -> tuple[torch.Tensor, torch.Tensor]:
        """One call on the whole proposal; returns ``(emitted, lengths)``."""

    def call_each(self, items: Iterable[tuple[Any, Proposal]], generator: Any, *,
                  where: str) -> Iterator[tuple[Any, torch.Tensor, torch.Tensor]]:
        """One call on each ``(tag, proposal)`` in order, yielding ``(tag, emitted, lengths)``; the
        next proposal may be taken from ``items`` before an output is yielded."""


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


def sample_steps(function: ProposalFunction, bank: ChainBank, *, num_draft: int, window: tuple[int, int], n: int,
                 batch_rows: int, harness_seed: int, function_seed: int, where: str,
                 chains: torch.Tensor | None = None) -> StepSample:
    """Run ``n`` independent single steps with K = ``num_draft`` drafts and collect each row's
    completed tokens in ``window`` (``(start, length)``).  Row ``b`` belongs to chain ``chains[b]``
    (int64 ``[n]``); by default rows are spread uniformly at random over the bank's chains.  The
    rows and proposals are drawn from ``harness_seed``, the completions from a seed derived from
    it, so that the next call's proposal can be built while the function runs
    (:meth:`ProposalFunction.call_each`) without changing any draw."""
    start, length = window
    proposing = torch.Generator().manual_seed(harness_seed)
    completing = torch.Generator().manual_seed(derive_seed(harness_seed, "completion"))
    function_generator = function.generator(function_seed)
    per_call = rows_per_call(batch_rows, num_draft, bank.vocab_size)
    if chains is not None and tuple(chains.shape) != (n,):
        raise ValueError(f"chains: expected the chain of each of the n = {n} rows, got shape {list(chains.shape)}")

    def proposals() -> Iterator[tuple[tuple[torch.Tensor, RowState, torch.Tensor], Proposal]]:
        for offset in range(0, n, per_call):
            rows = min(per_call, n - offset)
            chain = (torch.randint(bank.num_chains, (rows,), generator=proposing) if chains is None
                     else chains[offset : offset + rows])
            state = bank.initial_state(chain)
            proposal = propose(bank, state, num_draft, proposing)
            yield (chain, state, proposal.draft_tokens[:, 0]), proposal

    chain_list, windows = [], []
    accepted = torch.zeros(num_draft + 1, dtype=torch.int64)
    first_is_draft = 0
    for (chain, state, first_drafts), emitted, lengths in function.call_each(proposals(), function_generator,
                                                                              where=where):
        completed = complete(bank, state, emitted, lengths, start + length, completing)
        chain_list.append(chain)
        windows.append(completed[:, start:])
        accepted += torch.bincount(lengths - 1, minlength=num_draft + 1)
        first_is_draft += int((emitted[:, 0] == first_drafts).sum())
    return StepSample(torch.cat(chain_list), torch.cat(windows), accepted, first_is_draft)


class RaggedSample(NamedTuple):
    """Outcome of :func:`sample_ragged_steps`: per row its chain, start position, draft count
    ``k_b`` and completed tokens ``window [n, K+1]`` at positions ``start..start+K`` (the row's law
    is judged on its first ``k_b + 1``)."""

    chain: torch.Tensor
    start: torch.Tensor
    num_draft_tokens: torch.Tensor
    window: torch.Tensor


def sample_ragged_steps(function: GuardedFunction, bank: ChainBank, *, width: int, draft_counts: tuple[int, ...],
                        starts: tuple[int, ...], n: int, pattern: tuple[int, ...], harness_seed: int,
                        function_seed: int, where: str) -> RaggedSample:
    """Run ``n`` single steps on ragged batches: each row draws its chain, its start position (from
    ``starts``) and its draft count ``k_b`` (from ``draft_counts``) uniformly; calls take
    consecutive groups of rows of the sizes in ``pattern`` (cycled), each passing
    ``num_draft_tokens=``.  Rows are completed by target sampling up to ``K+1`` tokens."""
    generator = torch.Generator().manual_seed(harness_seed)
    function_generator = function.generator(function_seed)
    counts, first_positions = torch.tensor(draft_counts), torch.tensor(starts)
    sizes = itertools.cycle(pattern)
    per_call = max(1, MAX_INPUT_ELEMENTS // ((2 * width + 1) * bank.vocab_size))
    chains, start_list, drafts, windows = [], [], [], []
    for offset in range(0, n, per_call):
        rows = min(per_call, n - offset)
        chain = torch.randint(bank.num_chains, (rows,), generator=generator)
        start = first_positions[torch.randint(len(starts), (rows,), generator=generator)]
        num_draft_tokens = counts[torch.randint(len(draft_counts), (rows,), generator=generator)]
        initial = bank.initial_state(chain)
        state = RowState(initial.chain, start.clone(), initial.context)
        proposal = propose_ragged(bank, state, num_draft_tokens, width, generator)
        groups = group_sizes(sizes, rows)
        emitted, lengths = function.call_groups(proposal, function_generator, groups, where=where)
        windows.append(complete(bank, state, emitted, lengths, width + 1, generator))
        chains.append(chain)
        start_list.append(start)
        drafts.append(num_draft_tokens)
    return RaggedSample(torch.cat(chains), torch.cat(start_list), torch.cat(drafts), torch.cat(windows))


def group_sizes(sizes: Iterator[int], rows: int) -> list[int]:
    """Consecutive group sizes from ``sizes`` covering ``rows`` (the last one cut to fit)."""
    groups: list[int] = []
    grouped = 0
    while grouped < rows:
        groups.append(min(next(sizes), rows - grouped))
        grouped += groups[-1]
    return groups


class RunSample(NamedTuple):
    """Outcome of :func:`sample_runs`: ``tokens [n, L]`` are the first L tokens of each sequence,
    ``chain [n]`` its chain; ``calls`` the number of calls made."""

    chain: torch.Tensor
    tokens: torch.Tensor
    calls: int


def sample_runs(function: ProposalFunction, bank: ChainBank, *, length: int, draft_schedule: tuple[int, ...], n: int,
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
    chain = torch.randint(bank.num_chains, (n,), generator=generator)
    tokens = torch.full((n, length), -1, dtype=torch.int64)
    produced = torch.zeros(n, dtype=torch.int64)
    active = torch.arange(min(batch_rows, n))
    next_sequence = active.numel()
    state = bank.initial_state(chain[active])
    calls = 0
    while active.numel():
        num_draft = draft_schedule[calls % len(draft_schedule)]
        proposal = propose(bank, state, num_draft, generator)
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
            state = bank.advance(state, emitted[:, slot], mask)
        keep = produced[active] < length
        active, state = active[keep], state.take(keep)
        joining = torch.arange(next_sequence, min(n, next_sequence + batch_rows - active.numel()))
        next_sequence += joining.numel()
        active = torch.cat([active, joining])
        state = state.cat(bank.initial_state(chain[joining]))
    return RunSample(chain, tokens, calls)


# --------------------------------------------------------------------------------------------
# Exact target laws of the tested windows
# --------------------------------------------------------------------------------------------


def positional_window_law(bank: PositionalBank, chain: int, window: tuple[int, int], cell_maps: np.ndarray,
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


def markov_prefix_law(bank: MarkovBank, chain: int, length: int) -> np.ndarray:
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
