"""Toy language models ("chains") whose next-token laws depend on the prefix.

A chain pairs a *target* model with a *draft* model over a vocabulary ``{0, ..., V-1}``; both map a
prefix (the tokens generated after the prompt) to a next-token distribution, a float64 numpy
vector of length ``V``.  Speculative decoding (Leviathan et al. 2023, Algorithm 1; Chen et al.
2023, Algorithm 2) is lossless when the tokens it emits are distributed as ancestral sampling from
the target chain, whatever the draft chain is; ``specverify.core.exact`` computes both laws exactly.

- :class:`PositionalChain` is context-free within one step: the law depends only on the position
  ``len(prefix)``.  It models one verification step with arbitrary per-position distributions.
- :class:`MarkovChain` keys both laws on the last ``order`` tokens of ``prompt + prefix``, so the
  target's distribution at draft position ``i`` depends on the draft tokens before it, as in a
  real model.  ``order == 0`` gives a context-free chain.

Both have a vectorised table view for samplers that run thousands of rows at once:
:class:`PositionalBank` and :class:`MarkovBank` hold ``R`` chains of one family as stacked tables
``target, draft [R, S, V]`` (``S`` states per chain), and move a batch of rows (:class:`RowState`)
through them with ``rows_of`` (the table row each batch row reads) and ``advance`` (append a
token).  ``bank.chain(r)`` is chain ``r`` as a scalar object and ``Bank.of(chains)`` stacks scalar
chains into a bank, so both views describe the same laws.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal, NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import torch

from specverify.core.sampling import TableSampler

ROW_SUM_TOLERANCE = 1e-9
"""Largest accepted ``|sum(row) - 1|`` for a probability row of a chain's tables."""

ChainKind = Literal["mixture", "sparse"]


@runtime_checkable
class Chain(Protocol):
    """A target/draft pair of next-token laws over ``{0, ..., vocab_size-1}``."""

    vocab_size: int

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        """float64 ``[V]``: the target's law of the next token after ``prefix``."""
        ...

    def draft(self, prefix: tuple[int, ...]) -> np.ndarray:
        """float64 ``[V]``: the draft's law of the next token after ``prefix``."""
        ...


class PositionalChain:
    """One step's laws given position by position: ``target(prefix) = p[len(prefix)]``,
    ``draft(prefix) = q[len(prefix)]``.

    ``p`` is ``[K+1, V]`` (positions ``0..K``, the last one being the bonus position) and ``q`` is
    ``[K, V]``.  The tokens of the prefix do not matter, only its length, so a prefix longer than
    ``K`` (target) or ``K-1`` (draft) is an error: the chain describes a single step.
    """

    def __init__(self, p: npt.ArrayLike, q: npt.ArrayLike) -> None:
        p = _as_probability_table(p, "p")
        q = _as_probability_table(q, "q", allow_empty=True)
        if q.shape[0] != p.shape[0] - 1 or (q.shape[0] > 0 and q.shape[1] != p.shape[1]):
            raise ValueError(
                f"q: expected shape [K, V] = [{p.shape[0] - 1}, {p.shape[1]}] to match p of shape "
                f"{list(p.shape)} (p has one more row, the bonus position); got {list(q.shape)}"
            )
        self.p = p
        self.q = q.reshape(p.shape[0] - 1, p.shape[1])
        self.vocab_size = p.shape[1]
        self.num_draft = p.shape[0] - 1

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        """``p[len(prefix)]``; ``len(prefix)`` must be at most ``K``."""
        position = len(prefix)
        if position > self.num_draft:
            raise ValueError(
                f"prefix: a PositionalChain with K={self.num_draft} has target laws for prefixes of "
                f"length 0..{self.num_draft}, got length {position}; use a MarkovChain for longer runs"
            )
        return np.asarray(self.p[position])

    def draft(self, prefix: tuple[int, ...]) -> np.ndarray:
        """``q[len(prefix)]``; ``len(prefix)`` must be at most ``K-1``."""
        position = len(prefix)
        if position >= self.num_draft:
            raise ValueError(
                f"prefix: a PositionalChain with K={self.num_draft} has draft laws for prefixes of "
                f"length 0..{self.num_draft - 1}, got length {position}"
            )
        return np.asarray(self.q[position])

    def __repr__(self) -> str:
        return f"PositionalChain(K={self.num_draft}, V={self.vocab_size})"


class MarkovChain:
    """Target and draft laws keyed by the last ``order`` tokens of ``prompt + prefix``.

    Row ``s`` of ``target_table`` / ``draft_table`` (both ``[V**order, V]``) is the next-token law
    in *state* ``s``.  The state of a context ``(c_0, ..., c_{order-1})`` (oldest token first) is
    the base-``V`` number whose most significant digit is the oldest token:
    ``s = sum_j c_j * V**(order - 1 - j)``.  ``prompt`` (length ``order``) supplies the context
    before any token is generated; prefixes given to :meth:`target` / :meth:`draft` are the tokens
    generated after it.  The draft's support may differ from the target's (zeros are allowed
    anywhere as long as every row sums to 1).
    """

    def __init__(
        self,
        target_table: np.ndarray,
        draft_table: np.ndarray,
        order: int,
        prompt: tuple[int, ...] = (),
    ) -> None:
        if not isinstance(order, (int, np.integer)) or isinstance(order, bool) or order < 0:
            raise ValueError(f"order: expected a non-negative integer, got {order!r}")
        order = int(order)
        target_table = _as_probability_table(target_table, "target_table")
        draft_table = _as_probability_table(draft_table, "draft_table")
        vocab_size = target_table.shape[1]
        num_states = vocab_size**order
        if target_table.shape[0] != num_states:
            raise ValueError(
                f"target_table: expected shape [V**order, V] = [{num_states}, {vocab_size}] for "
                f"order={order}, got {list(target_table.shape)}"
            )
        if draft_table.shape != target_table.shape:
            raise ValueError(
                f"draft_table: expected the target_table's shape {list(target_table.shape)}, "
                f"got {list(draft_table.shape)}"
            )
        prompt = tuple(int(t) for t in prompt)
        if len(prompt) != order:
            raise ValueError(f"prompt: expected {order} tokens (one per context slot), got {len(prompt)}")
        _check_tokens(prompt, vocab_size, "prompt")
        self.target_table = target_table
        self.draft_table = draft_table
        self.order = order
        self.prompt = prompt
        self.vocab_size = vocab_size
        self._target_tensor = torch.from_numpy(target_table.copy())
        self._draft_tensor = torch.from_numpy(draft_table.copy())

    def context_after(self, prefix: tuple[int, ...]) -> tuple[int, ...]:
        """The last ``order`` tokens of ``prompt + prefix`` (oldest first)."""
        _check_tokens(prefix, self.vocab_size, "prefix")
        if self.order == 0:
            return ()
        return (self.prompt + tuple(prefix))[-self.order :]

    def state_of(self, context: tuple[int, ...]) -> int:
        """The table row of one context: ``sum_j context[j] * V**(order - 1 - j)``."""
        state = 0
        for token in context:
            state = state * self.vocab_size + token
        return state

    def state_index(self, contexts: torch.Tensor) -> torch.Tensor:
        """int64 ``[N]``: the table rows of a batch of contexts ``[N, order]`` (oldest token first)."""
        self._check_contexts(contexts)
        return _context_states(contexts, self.vocab_size)

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        """The target's next-token law after ``prompt + prefix`` (a read-only float64 row)."""
        return np.asarray(self.target_table[self.state_of(self.context_after(prefix))])

    def draft(self, prefix: tuple[int, ...]) -> np.ndarray:
        """The draft's next-token law after ``prompt + prefix`` (a read-only float64 row)."""
        return np.asarray(self.draft_table[self.state_of(self.context_after(prefix))])

    def target_batch(self, contexts: torch.Tensor) -> torch.Tensor:
        """float64 ``[N, V]``: the target's laws for a batch of contexts ``[N, order]``, on their device."""
        states = self.state_index(contexts)
        return self._target_tensor.to(contexts.device)[states]

    def draft_batch(self, contexts: torch.Tensor) -> torch.Tensor:
        """float64 ``[N, V]``: the draft's laws for a batch of contexts ``[N, order]``, on their device."""
        states = self.state_index(contexts)
        return self._draft_tensor.to(contexts.device)[states]

    def _check_contexts(self, contexts: torch.Tensor) -> None:
        if not isinstance(contexts, torch.Tensor) or contexts.dtype.is_floating_point or contexts.dtype == torch.bool:
            raise ValueError("contexts: expected an integer (int64) torch tensor of shape [N, order]")
        if contexts.dim() != 2 or contexts.shape[1] != self.order:
            raise ValueError(f"contexts: expected shape [N, {self.order}], got {list(contexts.shape)}")
        if contexts.numel() and (int(contexts.min()) < 0 or int(contexts.max()) >= self.vocab_size):
            raise ValueError(f"contexts: tokens must lie in 0..{self.vocab_size - 1}")

    def __repr__(self) -> str:
        return f"MarkovChain(V={self.vocab_size}, order={self.order}, prompt={self.prompt})"


def _context_states(contexts: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int64 ``[N]``: the base-``V`` number of each context ``[N, order]`` (oldest token most significant)."""
    order = contexts.shape[1]
    weights = vocab_size ** torch.arange(order - 1, -1, -1, dtype=torch.int64, device=contexts.device)
    return (contexts.to(torch.int64) * weights).sum(dim=1)


# --------------------------------------------------------------------------------------------
# Banks: R chains of one family as tables, for vectorised samplers
# --------------------------------------------------------------------------------------------


class RowState(NamedTuple):
    """Where each row of a batch is: its chain, the tokens generated so far, and the last ``order``
    tokens (oldest first; ``[N, 0]`` for context-free chains)."""

    chain: torch.Tensor     # int64 [N]
    position: torch.Tensor  # int64 [N]
    context: torch.Tensor   # int64 [N, order]

    def take(self, rows: torch.Tensor) -> RowState:
        """The state of the listed rows (an index or a boolean mask)."""
        return RowState(self.chain[rows], self.position[rows], self.context[rows])

    def cat(self, other: RowState) -> RowState:
        """This batch's rows followed by ``other``'s."""
        return RowState(*(torch.cat([a, b]) for a, b in zip(self, other)))


class ChainBank:
    """``R`` chains of one family over one vocabulary as float64 tables ``target, draft [R, S, V]``:
    row ``s`` of chain ``r`` is the next-token law in state ``s``.  A batch of rows moves through the
    tables by :meth:`rows_of` and :meth:`advance`; :attr:`target_sampler` / :attr:`draft_sampler`
    draw from chosen rows by inverse CDF (:class:`specverify.core.sampling.TableSampler`).

    Subclasses say what a state is (:meth:`local_state`) and which scalar chain a bank row is
    (:meth:`chain`); ``kind`` names the family in reports.
    """

    kind: ClassVar[str]

    def __init__(self, target: np.ndarray, draft: np.ndarray, order: int, prompts: np.ndarray) -> None:
        target, draft = np.asarray(target, dtype=np.float64), np.asarray(draft, dtype=np.float64)
        if target.ndim != 3:
            raise ValueError("target: expected tables [R, S, V] (chains, states, tokens), "
                             f"got shape {list(target.shape)}")
        if draft.shape != target.shape:
            raise ValueError(f"draft: expected the target's shape {list(target.shape)}, got {list(draft.shape)}")
        self.target, self.draft, self.order = target, draft, order
        self.prompts = np.asarray(prompts, dtype=np.int64).reshape(target.shape[0], order)
        flat_shape = (self.num_chains * self.num_states, self.vocab_size)
        self.target_rows = torch.from_numpy(np.ascontiguousarray(target.reshape(flat_shape)))
        self.draft_rows = torch.from_numpy(np.ascontiguousarray(draft.reshape(flat_shape)))
        self.target_sampler = TableSampler(target)
        self.draft_sampler = TableSampler(draft)
        self._prompt_tensor = torch.from_numpy(self.prompts)
        self._rows_in: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
        self._by_rank: torch.Tensor | None = None

    @property
    def num_chains(self) -> int:
        return int(self.target.shape[0])

    @property
    def num_states(self) -> int:
        return int(self.target.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.target.shape[2])

    def rows_in(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The flattened target and draft tables ``[R·S, V]`` in ``dtype`` (converted once)."""
        if dtype not in self._rows_in:
            self._rows_in[dtype] = (self.target_rows.to(dtype), self.draft_rows.to(dtype))
        return self._rows_in[dtype]

    def draft_tokens_by_rank(self, ranks: int) -> torch.Tensor:
        """int64 ``[R·S, ranks]``: per flattened draft row its ``ranks`` most likely tokens in
        decreasing probability, ties by the lower id (a stable sort, computed once per bank)."""
        if self._by_rank is None or self._by_rank.shape[1] < min(ranks, self.vocab_size):
            self._by_rank = torch.sort(-self.draft_rows, dim=-1, stable=True).indices
        return self._by_rank[:, :ranks]

    def initial_state(self, chain: torch.Tensor) -> RowState:
        """Rows of the given chains ``[N]`` before any token is generated."""
        return RowState(chain, torch.zeros_like(chain), self._prompt_tensor[chain].reshape(chain.shape[0], self.order))

    def local_state(self, state: RowState) -> torch.Tensor:
        """int64 ``[N]``: each row's state within its chain's table."""
        raise NotImplementedError

    def rows_of(self, state: RowState) -> torch.Tensor:
        """int64 ``[N]``: each row's index into the flattened tables, ``chain·S + local state``."""
        return self.table_rows(state.chain, self.local_state(state))

    def table_rows(self, chain: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """int64: the flattened-table index ``chain·S + local`` of local states ``local`` of the
        given chains (any matching shapes)."""
        return chain * self.num_states + local

    def advance(self, state: RowState, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> RowState:
        """The state after appending ``tokens [N]`` (only to the rows where ``mask`` is true)."""
        if mask is None:
            mask = torch.ones_like(tokens, dtype=torch.bool)
        context = state.context
        if self.order:
            shifted = torch.cat([context[:, 1:], tokens.clamp(min=0)[:, None]], dim=1)
            context = torch.where(mask[:, None], shifted, context)
        return RowState(state.chain, state.position + mask.long(), context)

    def chain(self, index: int) -> Chain:
        """Chain ``index`` as a scalar object (for :mod:`specverify.core.exact`)."""
        raise NotImplementedError


class PositionalBank(ChainBank):
    """``R`` context-free steps (:class:`PositionalChain`): the state of a row is its position ``i``
    in the step.  ``p [R, K+1, V]`` target laws, ``q [R, K, V]`` draft laws; ``draft`` is stored
    ``[R, K+1, V]`` with the unused bonus row equal to ``p[:, K]``."""

    kind = "positional"

    def __init__(self, p: np.ndarray, q: np.ndarray) -> None:
        p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
        padded_q = np.concatenate([q, p[:, -1:]], axis=1)  # the bonus position has no draft law
        super().__init__(p, padded_q, 0, np.zeros((p.shape[0], 0), dtype=np.int64))

    @classmethod
    def of(cls, chains: Sequence[PositionalChain]) -> PositionalBank:
        """The bank of scalar chains with equal ``K`` and ``V``."""
        shapes = {(chain.num_draft, chain.vocab_size) for chain in chains}
        if len(shapes) != 1:
            raise ValueError(f"chains: expected equal K and V for every chain, got {sorted(shapes)}")
        return cls(np.stack([chain.p for chain in chains]), np.stack([chain.q for chain in chains]))

    @property
    def num_draft(self) -> int:
        return self.num_states - 1

    def local_state(self, state: RowState) -> torch.Tensor:
        return state.position

    def chain(self, index: int) -> PositionalChain:
        return PositionalChain(self.target[index], self.draft[index, :-1])


class MarkovBank(ChainBank):
    """``R`` Markov chains (:class:`MarkovChain`) of one ``order``: tables ``[R, V**order, V]``, the
    state of a row is its last ``order`` tokens read as a base-``V`` number, ``prompts [R, order]``
    the context before the first generated token."""

    kind = "markov"

    @classmethod
    def of(cls, chains: Sequence[MarkovChain]) -> MarkovBank:
        """The bank of scalar chains with equal ``V`` and ``order``."""
        shapes = {(chain.vocab_size, chain.order) for chain in chains}
        if len(shapes) != 1:
            raise ValueError(f"chains: expected equal V and order for every chain, got {sorted(shapes)}")
        order = chains[0].order
        prompts = np.array([chain.prompt for chain in chains], dtype=np.int64).reshape(len(chains), order)
        return cls(np.stack([c.target_table for c in chains]), np.stack([c.draft_table for c in chains]), order,
                   prompts)

    def local_state(self, state: RowState) -> torch.Tensor:
        return _context_states(state.context, self.vocab_size)

    def prompt_states(self, chain: torch.Tensor) -> torch.Tensor:
        """int64 ``[N]``: the local state of each listed chain's prompt (before any token)."""
        return self.local_state(self.initial_state(chain))

    def next_state(self, local: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The local state after appending ``tokens`` to contexts in local state ``local`` (same
        shapes): the base-``V`` number of the last ``order`` tokens, ``(s·V + t) mod V**order``,
        the oldest digit dropped (always 0 for order 0).  For walking many paths at once (trees)
        without a :class:`RowState` per path."""
        return (local * self.vocab_size + tokens) % self.num_states

    def chain(self, index: int) -> MarkovChain:
        return MarkovChain(self.target[index], self.draft[index], self.order,
                           tuple(int(t) for t in self.prompts[index]))


def random_markov_chain(
    vocab_size: int,
    order: int,
    seed: int,
    *,
    kind: ChainKind = "mixture",
    concentration: float = 1.0,
    closeness: float = 0.5,
    prompt: tuple[int, ...] | None = None,
) -> MarkovChain:
    """A random :class:`MarkovChain`, a pure function of its arguments (numpy ``Generator(seed)``).

    Every target row is ``Dirichlet(concentration * 1)``; the draft row in the same state is
    ``closeness * target_row + (1 - closeness) * noise`` with an independent Dirichlet ``noise``, so
    ``closeness = 1`` gives draft == target and ``closeness = 0`` an unrelated draft.  Small
    concentrations give peaked rows.  ``kind="sparse"`` then zeroes a random subset of the entries
    of every target row and, independently, of every draft row (each entry with probability 1/2,
    keeping at least one) and renormalises, so that the draft proposes tokens the target forbids
    and misses tokens the target allows — the edge cases of the rejection rule.
    ``prompt`` defaults to ``order`` random tokens.
    """
    _check_random_arguments(vocab_size, concentration, closeness, kind)
    rng = np.random.default_rng(seed)
    num_states = vocab_size**order
    target_table, draft_table = _random_law_pairs(rng, num_states, vocab_size, kind, concentration, closeness)
    if prompt is None:
        prompt = tuple(int(t) for t in rng.integers(0, vocab_size, size=order))
    return MarkovChain(target_table, draft_table, order, prompt)


def random_positional_chain(
    vocab_size: int,
    num_draft: int,
    seed: int,
    *,
    kind: ChainKind = "mixture",
    concentration: float = 1.0,
    closeness: float = 0.5,
) -> PositionalChain:
    """A random :class:`PositionalChain` with ``K = num_draft``, drawn as in :func:`random_markov_chain`
    (one target/draft pair per position; the bonus position ``K`` has a target law only)."""
    _check_random_arguments(vocab_size, concentration, closeness, kind)
    if num_draft < 0:
        raise ValueError(f"num_draft: expected a non-negative integer, got {num_draft}")
    rng = np.random.default_rng(seed)
    p, q = _random_law_pairs(rng, num_draft + 1, vocab_size, kind, concentration, closeness)
    return PositionalChain(p, q[:num_draft])


def _random_law_pairs(
    rng: np.random.Generator, rows: int, vocab_size: int, kind: ChainKind, concentration: float, closeness: float
) -> tuple[np.ndarray, np.ndarray]:
    alpha = np.full(vocab_size, concentration)
    target = rng.dirichlet(alpha, size=rows)
    noise = rng.dirichlet(alpha, size=rows)
    draft = closeness * target + (1.0 - closeness) * noise
    if kind == "sparse":
        target = target * _random_support(rng, rows, vocab_size)
        draft = draft * _random_support(rng, rows, vocab_size)
    return _normalise_rows(target, rng), _normalise_rows(draft, rng)


def _random_support(rng: np.random.Generator, rows: int, vocab_size: int) -> np.ndarray:
    keep = rng.random((rows, vocab_size)) < 0.5
    forced = rng.integers(0, vocab_size, size=rows)
    keep[np.arange(rows), forced] = True
    return keep.astype(np.float64)


def _normalise_rows(table: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rows divided by their sums; a row that underflowed to all zeros becomes a random point mass."""
    sums = table.sum(axis=1)
    for row in np.flatnonzero(sums <= 0):
        table[row] = 0.0
        table[row, rng.integers(0, table.shape[1])] = 1.0
        sums[row] = 1.0
    return np.asarray(table / sums[:, None])


def _check_random_arguments(vocab_size: int, concentration: float, closeness: float, kind: str) -> None:
    if vocab_size < 1:
        raise ValueError(f"vocab_size: expected at least 1, got {vocab_size}")
    if not concentration > 0:
        raise ValueError(f"concentration: expected a positive Dirichlet concentration, got {concentration}")
    if not 0.0 <= closeness <= 1.0:
        raise ValueError(f"closeness: expected a weight in [0, 1] (1 = draft equals target), got {closeness}")
    if kind not in ("mixture", "sparse"):
        raise ValueError(f"kind: expected 'mixture' or 'sparse', got {kind!r}")


def _as_probability_table(table: npt.ArrayLike, name: str, *, allow_empty: bool = False) -> np.ndarray:
    """Validate a ``[rows, V]`` table of probability rows and return it as read-only float64."""
    array = np.array(table, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array [rows, V], got {array.ndim} dimensions")
    if array.shape[0] == 0 and allow_empty:
        array.setflags(write=False)
        return array
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{name}: expected at least one row and one token, got shape {list(array.shape)}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: contains NaN or infinite entries")
    if np.any(array < 0):
        raise ValueError(f"{name}: probabilities must be non-negative, found {array.min()}")
    row_sums = array.sum(axis=1)
    worst = int(np.argmax(np.abs(row_sums - 1.0)))
    if abs(row_sums[worst] - 1.0) > ROW_SUM_TOLERANCE:
        raise ValueError(
            f"{name}: every row must sum to 1 (tolerance {ROW_SUM_TOLERANCE}); row {worst} sums to "
            f"{row_sums[worst]!r} — normalise it"
        )
    array.setflags(write=False)
    return array


def _check_tokens(tokens: Sequence[int], vocab_size: int, name: str) -> None:
    for token in tokens:
        if not 0 <= token < vocab_size:
            raise ValueError(f"{name}: token {token} is outside the vocabulary 0..{vocab_size - 1}")
