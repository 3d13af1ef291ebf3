"""The sampler-level harness and the guarded calls: sampling, proposals along draft paths,
completion, decoding loops, output validation, deadlines, mutation and randomness probes."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from specverify.auditing.isolation.faults import (
    Fault,
    call_with_deadline,
    preserved_global_rng,
    probe_randomness,
    seed_global_rng,
    validate_emitted,
)
from specverify.auditing.sampler.battery import markov_family_bank, positional_family_bank, step_laws
from specverify.core import exact, stats
from specverify.core.rules import verify as reference
from specverify.core.seeding import derive_seed
from specverify.testing.harness import (
    GuardedFunction,
    Proposal,
    complete,
    markov_prefix_law,
    positional_window_law,
    propose,
    rows_per_call,
    sample_runs,
    sample_steps,
)

FAMILIES = ("random", "identical", "disjoint", "zeros", "one-hot", "near-uniform", "tiny", "deep-correction")


def _target_only(target_probs, draft_probs, draft_tokens, generator):
    """Lossless without speculation: ignore the drafts and emit one target sample per step."""
    token = torch.multinomial(target_probs[:, 0].double(), 1, generator=generator)
    emitted = torch.full(draft_tokens.shape[:1] + (draft_tokens.shape[1] + 1,), -1, dtype=torch.int64)
    emitted[:, :1] = token
    return emitted


# --------------------------------------------------------------------------------------------
# Test distributions and exact window laws
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_step_law_families_are_probability_tables(family):
    p, q = step_laws(np.random.default_rng(0), family, 6, 4)
    assert p.shape == (5, 6) and q.shape == (4, 6)
    assert np.allclose(p.sum(axis=1), 1, atol=1e-12) and np.allclose(q.sum(axis=1), 1, atol=1e-12)
    assert (p >= 0).all() and (q >= 0).all()


def test_families_have_the_edge_cases_they_promise():
    rng = np.random.default_rng(1)
    p, q = step_laws(rng, "identical", 4, 3)
    assert np.array_equal(p[:3], q)
    p, q = step_laws(rng, "disjoint", 6, 2)
    assert np.minimum(p[:2], q).sum() == 0
    p, q = step_laws(rng, "zeros", 6, 3)
    assert ((p[:3] == 0) & (q > 0)).any(axis=1).all() and ((q == 0) & (p[:3] > 0)).any(axis=1).all()
    p, q = step_laws(rng, "tiny", 6, 3)
    assert np.isclose(p, 1e-8).sum(axis=1).min() == 2 and np.isclose(q, 1e-8).any(axis=1).all()
    p, q = step_laws(rng, "one-hot", 6, 3)
    assert (p.max(axis=1) >= 0.97).all()
    p, q = step_laws(rng, "zipf", 32768, 1)
    assert p.shape == (2, 32768) and 0.1 < 0.5 * np.abs(p[0] - q[0]).sum() < 0.9


def test_bank_is_fixed_by_its_name_not_by_the_audit_seed():
    first = positional_family_bank("x", "random", 4, 2, 3)
    again = positional_family_bank("x", "random", 4, 2, 3)
    other = positional_family_bank("y", "random", 4, 2, 3)
    assert np.array_equal(first.target, again.target) and not np.array_equal(first.target, other.target)


def test_positional_window_law_is_the_product_of_marginals():
    bank = positional_family_bank("w", "random", 3, 2, 1)
    law = positional_window_law(bank, 0, (0, 3), np.tile(np.arange(3), (3, 1)), 3)
    reference_law = exact.target_sequence_distribution(bank.chain(0), 3)
    for index, probability in enumerate(law):
        tokens = tuple(int(t) for t in np.unravel_index(index, (3, 3, 3)))
        assert probability == pytest.approx(reference_law.get(tokens, 0.0), abs=1e-15)


def test_markov_prefix_law_matches_exact_enumeration():
    bank = markov_family_bank("m", 3, 2, 2)
    for chain in range(2):
        law = markov_prefix_law(bank, chain, 3)
        reference_law = exact.target_sequence_distribution(bank.chain(chain), 3)
        assert law.sum() == pytest.approx(1.0)
        for index, probability in enumerate(law):
            tokens = tuple(int(t) for t in np.unravel_index(index, (3, 3, 3)))
            assert probability == pytest.approx(reference_law.get(tokens, 0.0), abs=1e-15)


# --------------------------------------------------------------------------------------------
# Sampling, proposals, completion
# --------------------------------------------------------------------------------------------


@pytest.mark.statistical
def test_inverse_cdf_sampler_follows_each_row_and_never_draws_zeros():
    bank = positional_family_bank("s", "zeros", 6, 2, 3)
    n = 60_000
    generator = torch.Generator().manual_seed(derive_seed("sampler-test"))
    rows = torch.randint(0, bank.num_chains * bank.num_states, (n,), generator=generator)
    tokens = bank.draft_sampler.sample(rows, generator)
    flat = bank.draft.reshape(-1, 6)
    assert (flat[rows.numpy(), tokens.numpy()] > 0).all()
    row = 1  # one row's frequencies against its law, at α = 1e-6
    counts = np.bincount(tokens[rows == row].numpy(), minlength=6)
    assert stats.goodness_of_fit(counts, flat[row]).pvalue > 1e-6


def test_proposal_reads_the_target_along_each_draft_path():
    bank = markov_family_bank("p", 4, 2, 2)
    chain = torch.tensor([0, 1, 1, 0, 1])
    proposal = propose(bank, bank.initial_state(chain), 3, torch.Generator().manual_seed(0))
    assert proposal.target_probs.shape == (5, 4, 4) and proposal.draft_probs.shape == (5, 3, 4)
    for row in range(5):
        chain_object = bank.chain(int(chain[row]))
        tokens = tuple(proposal.draft_tokens[row].tolist())
        for i in range(4):
            assert torch.allclose(proposal.target_probs[row, i].double(),
                                  torch.tensor(chain_object.target(tokens[:i])), atol=1e-7)
        for i in range(3):
            assert chain_object.draft(tokens[:i])[tokens[i]] > 0


def test_completion_keeps_emitted_tokens_and_fills_the_rest():
    bank = positional_family_bank("c", "random", 4, 3, 1)
    emitted = torch.tensor([[1, 2, 3, 0], [2, -1, -1, -1], [0, 1, -1, -1]])
    lengths = torch.tensor([4, 1, 2])
    state = bank.initial_state(torch.zeros(3, dtype=torch.int64))
    completed = complete(bank, state, emitted, lengths, 4, torch.Generator().manual_seed(0))
    assert completed[0].tolist() == [1, 2, 3, 0]
    assert completed[1, 0] == 2 and completed[2, :2].tolist() == [0, 1]
    assert (completed >= 0).all()


def test_rows_per_call_caps_large_vocabularies():
    assert rows_per_call(4096, 2, 4) == 4096
    assert 1 <= rows_per_call(4096, 1, 32768) < 4096


def test_sample_steps_counts_rows_and_acceptance():
    function = GuardedFunction(reference, timeout_s=30)
    bank = positional_family_bank("steps", "identical", 4, 3, 2)
    sample = sample_steps(function, bank, num_draft=3, window=(2, 2), n=1000, batch_rows=300,
                          harness_seed=1, function_seed=2, where="test")
    assert sample.window.shape == (1000, 2) and function.log.calls == 4 and function.log.rows == 1000
    assert sample.accepted.tolist() == [0, 0, 0, 1000]  # q = p: every draft accepted


def test_decoding_loop_rows_advance_by_different_amounts():
    calls = []

    def recording(target_probs, draft_probs, draft_tokens, generator):
        calls.append(draft_tokens.shape)
        return reference(target_probs, draft_probs, draft_tokens, generator)

    function = GuardedFunction(recording, timeout_s=30)
    bank = markov_family_bank("loop", 3, 1, 2)
    run = sample_runs(function, bank, length=4, draft_schedule=(2, 1, 3), n=500, batch_rows=128,
                      harness_seed=3, function_seed=4, where="test")
    assert run.tokens.shape == (500, 4) and (run.tokens >= 0).all()
    assert [shape[1] for shape in calls[:3]] == [2, 1, 3]
    assert max(shape[0] for shape in calls) == 128 and run.calls == len(calls) > 500 * 4 // (128 * 4)


@pytest.mark.statistical
def test_decoding_loop_of_a_lossless_non_speculative_step_follows_the_target():
    function = GuardedFunction(_target_only, timeout_s=30)
    bank = markov_family_bank("loop-target-only", 3, 1, 1)
    run = sample_runs(function, bank, length=3, draft_schedule=(2,), n=20_000, batch_rows=4096,
                      harness_seed=derive_seed("loop-test"), function_seed=derive_seed("loop-test-f"), where="test")
    index = (run.tokens * torch.tensor([9, 3, 1])).sum(dim=1)
    counts = torch.bincount(index, minlength=27).numpy()
    assert stats.goodness_of_fit(counts, markov_prefix_law(bank, 0, 3)).pvalue > 1e-6


# --------------------------------------------------------------------------------------------
# Output validation
# --------------------------------------------------------------------------------------------

DRAFTS = torch.tensor([[1, 2], [3, 0]])


@pytest.mark.parametrize(
    "emitted, fragment",
    [
        (torch.tensor([[1.0, float("nan"), -1], [3, 0, 1]]), "NaN"),
        (torch.tensor([[1, 2, 0], [3, 0, 1]], dtype=torch.int32), "dtype"),
        (torch.tensor([[1, 2], [3, 0]]), "shape"),
        (torch.tensor([[1, 2, 7], [3, 0, 1]]), "outside [0, 4)"),
        (torch.tensor([[1, -2, -1], [3, 0, 1]]), "outside [0, 4)"),
        (torch.tensor([[1, -1, 2], [3, 0, 1]]), "after -1"),
        (torch.tensor([[-1, -1, -1], [3, 0, 1]]), "no token"),
        ([1, 2], "returned a list"),
    ],
)
def test_malformed_outputs_are_faults(emitted, fragment):
    with pytest.raises(Fault) as caught:
        validate_emitted(emitted, DRAFTS, 4)
    assert caught.value.kind == "malformed" and fragment in caught.value.message


def test_a_non_draft_accepted_token_is_an_impossible_output():
    with pytest.raises(Fault) as caught:
        validate_emitted(torch.tensor([[2, 1, -1], [3, 0, 1]]), DRAFTS, 4)
    assert caught.value.kind == "impossible" and "accepted slot 0" in caught.value.message


def test_wellformed_output_gives_lengths():
    emitted, lengths = validate_emitted(torch.tensor([[1, 0, -1], [3, 0, 2]]), DRAFTS, 4)
    assert lengths.tolist() == [2, 3]


# --------------------------------------------------------------------------------------------
# Deadlines, exceptions, mutation, randomness
# --------------------------------------------------------------------------------------------


def _sleeps(seconds):
    time.sleep(seconds)


def test_deadline_in_the_main_thread_interrupts_the_call():
    started = time.perf_counter()
    with pytest.raises(Fault) as caught:
        call_with_deadline(_sleeps, (30,), 0.3)
    assert caught.value.kind == "timeout" and time.perf_counter() - started < 5


def test_deadline_in_a_worker_thread_stops_waiting():
    outcome = {}

    def in_thread():
        try:
            call_with_deadline(_sleeps, (30,), 0.3)
        except Fault as fault:
            outcome["kind"] = fault.kind

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(10)
    assert outcome == {"kind": "timeout"}


def test_exceptions_become_faults_and_faults_pass_through():
    def raises():
        raise KeyError("boom")

    with pytest.raises(Fault) as caught:
        call_with_deadline(raises, (), 5)
    assert caught.value.kind == "exception" and "KeyError" in caught.value.message

    def faults():
        raise Fault("malformed", "inner")

    with pytest.raises(Fault) as caught:
        call_with_deadline(faults, (), 5)
    assert caught.value.kind == "malformed"


def test_guarded_function_records_mutation_and_validates_against_its_own_copy():
    def mutating(target_probs, draft_probs, draft_tokens, generator):
        emitted = reference(target_probs, draft_probs, draft_tokens, generator)
        draft_tokens.fill_(0)
        target_probs.mul_(2)
        return emitted

    bank = positional_family_bank("mut", "random", 4, 2, 1)
    proposal = propose(bank, bank.initial_state(torch.zeros(8, dtype=torch.int64)), 2, torch.Generator().manual_seed(0))
    kept = Proposal(*(t.clone() for t in proposal))
    function = GuardedFunction(mutating, timeout_s=5)
    function(proposal, function.generator(0), where="here")
    assert function.log.mutations == ["here: modified target_probs, draft_tokens in place"]
    assert all(torch.equal(a, b) for a, b in zip(kept, proposal))


def test_randomness_probe_tells_the_sources_apart():
    inputs = torch.rand(64)

    def make_run(kind):
        def run(generator_seed, global_seed):
            seed_global_rng(global_seed)
            generator = torch.Generator().manual_seed(generator_seed)
            outputs = []
            for _ in range(2):
                if kind == "generator":
                    outputs.append(torch.rand(64, generator=generator) < inputs)
                elif kind == "global":
                    outputs.append(torch.rand(64) < inputs)
                elif kind == "reseeded":
                    outputs.append(torch.rand(64, generator=torch.Generator().manual_seed(0)) < inputs)
                else:  # entropy from the OS
                    outputs.append(torch.rand(64, generator=torch.Generator().manual_seed(int.from_bytes(
                        np.random.default_rng().bytes(4), "little"))) < inputs)
            return tuple(outputs)
        return run

    before = torch.random.get_rng_state()
    assert probe_randomness(make_run("generator"), 1, (2, 3)).uses_only_generator
    assert not probe_randomness(make_run("global"), 1, (2, 3)).independent_of_global
    assert not probe_randomness(make_run("reseeded"), 1, (2, 3)).advances
    assert not probe_randomness(make_run("entropy"), 1, (2, 3)).repeatable
    assert torch.equal(before, torch.random.get_rng_state())  # the global RNG was restored


def test_preserved_global_rng_restores_every_generator():
    import random

    with preserved_global_rng():
        seed_global_rng(5)
        expected = (torch.rand(1).item(), np.random.rand(), random.random())
    with preserved_global_rng():
        seed_global_rng(5)
        assert (torch.rand(1).item(), np.random.rand(), random.random()) == expected
