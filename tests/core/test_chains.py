"""Unit tests of specverify.core.chains: laws by prefix, the state numbering, batch == scalar, validation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from specverify.core.chains import (
    Chain,
    MarkovBank,
    MarkovChain,
    PositionalBank,
    PositionalChain,
    random_markov_chain,
    random_positional_chain,
)
from specverify.core.seeding import derive_seed


def _uniform_rows(rows: int, vocab_size: int) -> np.ndarray:
    return np.full((rows, vocab_size), 1.0 / vocab_size)


# --------------------------------------------------------------------------------------------
# PositionalChain
# --------------------------------------------------------------------------------------------


def test_positional_chain_reads_laws_by_position_only():
    chain = random_positional_chain(4, 3, seed=derive_seed("positional", 4, 3))
    assert isinstance(chain, Chain)
    assert (chain.vocab_size, chain.num_draft) == (4, 3)
    for position in range(4):
        for prefix in itertools.product(range(4), repeat=position):
            np.testing.assert_array_equal(chain.target(prefix), chain.p[position])
            if position < 3:
                np.testing.assert_array_equal(chain.draft(prefix), chain.q[position])


def test_positional_chain_rejects_prefixes_beyond_the_step():
    chain = random_positional_chain(3, 2, seed=0)
    with pytest.raises(ValueError, match="prefix"):
        chain.target((0, 0, 0))
    with pytest.raises(ValueError, match="prefix"):
        chain.draft((0, 0))


def test_positional_chain_allows_zero_drafts():
    chain = PositionalChain(np.array([[0.25, 0.75]]), np.zeros((0, 2)))
    assert chain.num_draft == 0
    np.testing.assert_array_equal(chain.target(()), [0.25, 0.75])


@pytest.mark.parametrize(
    ("p", "q", "argument"),
    [
        (_uniform_rows(3, 4), _uniform_rows(3, 4), "q"),  # q needs K = 2 rows
        (_uniform_rows(3, 4), _uniform_rows(2, 5), "q"),  # vocabulary mismatch
        (np.array([[0.5, 0.6], [0.5, 0.5]]), _uniform_rows(1, 2), "p"),  # row sums to 1.1
        (_uniform_rows(2, 2), np.array([[1.5, -0.5]]), "q"),  # negative entry
        (np.array([[np.nan, 1.0], [0.5, 0.5]]), _uniform_rows(1, 2), "p"),
        (np.ones(3) / 3, _uniform_rows(1, 3), "p"),  # not 2-D
    ],
)
def test_positional_chain_validation_names_the_argument(p, q, argument):
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        PositionalChain(p, q)


# --------------------------------------------------------------------------------------------
# MarkovChain
# --------------------------------------------------------------------------------------------


def test_markov_state_numbering_is_base_v_with_the_oldest_token_most_significant():
    vocab_size, order = 3, 2
    target = np.zeros((vocab_size**order, vocab_size))
    target[np.arange(9), np.arange(9) % vocab_size] = 1.0  # row s puts its mass on token s % V
    chain = MarkovChain(target, _uniform_rows(9, 3), order, prompt=(2, 1))
    assert chain.state_of((1, 2)) == 1 * 3 + 2
    assert chain.context_after(()) == (2, 1)
    assert chain.context_after((0,)) == (1, 0)
    assert chain.context_after((0, 2, 1)) == (2, 1)
    np.testing.assert_array_equal(chain.target((0,)), target[1 * 3 + 0])
    states = chain.state_index(torch.tensor([[1, 2], [2, 0], [0, 0]]))
    assert states.tolist() == [5, 6, 0]


@pytest.mark.parametrize("order", [0, 1, 2])
@pytest.mark.parametrize("kind", ["mixture", "sparse"])
def test_markov_batch_methods_equal_the_scalar_methods(order, kind):
    vocab_size = 3
    chain = random_markov_chain(vocab_size, order, derive_seed("batch", order, kind), kind=kind)
    prefixes = [prefix for length in range(4) for prefix in itertools.product(range(vocab_size), repeat=length)]
    contexts = torch.tensor([chain.context_after(prefix) for prefix in prefixes], dtype=torch.int64).reshape(
        len(prefixes), order
    )
    target_batch, draft_batch = chain.target_batch(contexts), chain.draft_batch(contexts)
    assert target_batch.dtype == draft_batch.dtype == torch.float64
    assert target_batch.shape == (len(prefixes), vocab_size)
    for row, prefix in enumerate(prefixes):
        np.testing.assert_array_equal(target_batch[row].numpy(), chain.target(prefix))
        np.testing.assert_array_equal(draft_batch[row].numpy(), chain.draft(prefix))


def test_markov_order_zero_is_context_free():
    chain = random_markov_chain(4, 0, seed=3)
    assert chain.prompt == () and chain.context_after((1, 2, 3)) == ()
    np.testing.assert_array_equal(chain.target((1, 2)), chain.target(()))
    assert chain.target_batch(torch.zeros((5, 0), dtype=torch.int64)).shape == (5, 4)


def test_markov_laws_are_read_only():
    chain = random_markov_chain(3, 1, seed=0)
    with pytest.raises(ValueError):
        chain.target(())[0] = 1.0


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"target_table": _uniform_rows(4, 3)}, "target_table"),  # needs V**order = 3 rows
        ({"draft_table": _uniform_rows(3, 4)}, "draft_table"),
        ({"target_table": np.array([[0.5, 0.5, 0.5]] * 3)}, "target_table"),  # rows sum to 1.5
        ({"draft_table": np.array([[1.2, -0.2, 0.0]] * 3)}, "draft_table"),
        ({"prompt": (0, 1)}, "prompt"),  # needs `order` = 1 token
        ({"prompt": (3,)}, "prompt"),  # outside the vocabulary
        ({"order": -1}, "order"),
    ],
)
def test_markov_validation_names_the_argument(kwargs, argument):
    arguments = {"target_table": _uniform_rows(3, 3), "draft_table": _uniform_rows(3, 3), "order": 1, "prompt": (0,)}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        MarkovChain(**arguments)


def test_markov_draft_support_may_differ_from_the_target():
    target = np.array([[1.0, 0.0], [0.5, 0.5]])
    draft = np.array([[0.0, 1.0], [1.0, 0.0]])
    chain = MarkovChain(target, draft, 1, prompt=(0,))
    np.testing.assert_array_equal(chain.draft(()), [0.0, 1.0])


@pytest.mark.parametrize(
    "contexts",
    [torch.zeros((2, 2), dtype=torch.int64), torch.zeros((2, 1)), torch.tensor([[3]]), torch.tensor([[-1]])],
)
def test_markov_batch_validation(contexts):
    chain = random_markov_chain(3, 1, seed=0)
    with pytest.raises(ValueError, match="^contexts:"):
        chain.target_batch(contexts)


def test_markov_rejects_tokens_outside_the_vocabulary_in_a_prefix():
    chain = random_markov_chain(3, 1, seed=0)
    with pytest.raises(ValueError, match="^prefix:"):
        chain.target((0, 5))


# --------------------------------------------------------------------------------------------
# Random constructors
# --------------------------------------------------------------------------------------------


def test_random_chains_are_a_pure_function_of_the_seed():
    first, again, other = (random_markov_chain(4, 2, seed, kind="sparse") for seed in (7, 7, 8))
    np.testing.assert_array_equal(first.target_table, again.target_table)
    np.testing.assert_array_equal(first.draft_table, again.draft_table)
    assert first.prompt == again.prompt
    assert not np.array_equal(first.target_table, other.target_table)


def test_random_chain_closeness_interpolates_between_unrelated_and_equal():
    equal = random_markov_chain(5, 1, seed=1, closeness=1.0)
    np.testing.assert_allclose(equal.draft_table, equal.target_table, rtol=0, atol=1e-15)
    distances = []
    for closeness in (0.0, 0.5, 0.9):
        chain = random_markov_chain(5, 1, seed=1, closeness=closeness)
        distances.append(0.5 * np.abs(chain.target_table - chain.draft_table).sum(axis=1).mean())
    assert distances[0] > distances[1] > distances[2] > 0


def test_sparse_random_chains_have_differing_supports():
    chain = random_markov_chain(4, 2, seed=derive_seed("sparse", 4, 2), kind="sparse")
    target_zero, draft_zero = chain.target_table == 0, chain.draft_table == 0
    assert target_zero.any() and draft_zero.any()
    assert (target_zero & ~draft_zero).any() and (draft_zero & ~target_zero).any()
    np.testing.assert_allclose(chain.target_table.sum(axis=1), 1.0, rtol=0, atol=1e-12)


def test_random_positional_chain_shapes():
    chain = random_positional_chain(5, 3, seed=2, kind="sparse", concentration=0.3)
    assert chain.p.shape == (4, 5) and chain.q.shape == (3, 5)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [({"kind": "other"}, "kind"), ({"closeness": 1.5}, "closeness"), ({"concentration": 0.0}, "concentration")],
)
def test_random_chain_arguments_are_validated(kwargs, argument):
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        random_markov_chain(3, 1, 0, **kwargs)


# --------------------------------------------------------------------------------------------
# Banks: the vectorised table view of the same chains
# --------------------------------------------------------------------------------------------


def test_a_positional_bank_holds_the_same_laws_as_its_chains():
    chains = [random_positional_chain(3, 2, seed) for seed in range(3)]
    bank = PositionalBank.of(chains)
    assert (bank.num_chains, bank.num_states, bank.vocab_size, bank.num_draft) == (3, 3, 3, 2)
    state = bank.initial_state(torch.tensor([2, 0, 1]))
    for position in range(3):
        rows = bank.rows_of(state)
        for row, chain_index in enumerate([2, 0, 1]):
            np.testing.assert_array_equal(bank.target_rows[rows[row]].numpy(), chains[chain_index].p[position])
        state = bank.advance(state, torch.tensor([0, 1, 2]))
    np.testing.assert_array_equal(bank.chain(1).q, chains[1].q)


@pytest.mark.parametrize("order", [0, 1, 2])
def test_a_markov_bank_moves_rows_as_its_chains_do(order):
    chains = [random_markov_chain(3, order, seed) for seed in range(2)]
    bank = MarkovBank.of(chains)
    generated = torch.tensor([[0, 2, 1, 1], [2, 2, 0, 1]])
    state = bank.initial_state(torch.tensor([0, 1]))
    for step in range(generated.shape[1] + 1):
        rows = bank.rows_of(state)
        for row in range(2):
            prefix = tuple(generated[row, :step].tolist())
            np.testing.assert_array_equal(bank.draft_rows[rows[row]].numpy(), chains[row].draft(prefix))
        if step < generated.shape[1]:
            state = bank.advance(state, generated[:, step])
    assert bank.chain(1).prompt == chains[1].prompt


def test_banks_refuse_chains_of_different_shapes():
    with pytest.raises(ValueError, match="^chains:"):
        PositionalBank.of([random_positional_chain(3, 2, 0), random_positional_chain(3, 1, 0)])
    with pytest.raises(ValueError, match="^chains:"):
        MarkovBank.of([random_markov_chain(3, 1, 0), random_markov_chain(3, 2, 0)])
