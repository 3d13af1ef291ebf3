"""Deterministic properties of the reference decoder (exact checks, no sampling tolerance).

- Greedy identity: at temperature 0 the decoder's tokens equal ``target.generate(do_sample=False)``
  token for token (fp32 tiny models), for every drafter, several γ, batch sizes 1 and 3 with
  prompts of different lengths; and the check fails when the KV rollback is broken.
- The ragged KV cache: after any sequence of ragged appends and rollbacks, each row's logits equal
  a plain forward pass over that row's tokens alone.
- Prompt lookup equals a plain loop implementation of its definition.
- Early exit is a view: it shares the target's weights and computes lm_head(norm(h_k)).
- Same seed, same tokens; EOS stops a row and pads it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers", reason="the reference decoder's properties run tiny transformers "
                    "models: pip install 'specverify[hf]'")

import reference.kv
from reference.decoder import generate, speculative_generate
from reference.drafters import (
    MATCH_POLICIES,
    Drafter,
    EarlyExitDrafter,
    ModelDrafter,
    MTPDrafter,
    MTPHead,
    PromptLookupDrafter,
    truncated_view,
)
from reference.kv import RaggedCache
from reference.sequences import TokenSequences
from specverify.core.processing import SamplingParams
from specverify.hf.tiny_models import tiny_target_and_draft

VOCAB = 16
NEW_TOKENS = 24
PROMPTS = ((3, 1, 4, 1, 5, 9, 2, 6), (7,), (2, 7, 1, 8, 2, 8))


@pytest.fixture(scope="module")
def models():
    return tiny_target_and_draft(vocab_size=VOCAB, hidden_size=32, seed=3)


def make_drafter(name: str, target, draft) -> Drafter:
    makers: dict[str, Callable[[], Drafter]] = {
        "model": lambda: ModelDrafter(draft), "lookup": PromptLookupDrafter,
        "early-exit": lambda: EarlyExitDrafter(target, num_layers=1), "mtp": lambda: MTPDrafter(MTPHead(target)),
    }
    return makers[name]()


def target_greedy(target, prompt) -> list[int]:
    ids = torch.tensor([prompt])
    output = target.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0)
    return output[0, len(prompt):].tolist()


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("drafter", ["model", "lookup", "early-exit", "mtp"])
def test_greedy_equals_target_generate(drafter, gamma, batch_size, models):
    target, draft = models
    prompts = PROMPTS[:batch_size]
    generation = speculative_generate(
        target, make_drafter(drafter, target, draft), [torch.tensor(p) for p in prompts],
        max_new_tokens=NEW_TOKENS, gamma=gamma, temperature=0.0,
    )
    for row, prompt in enumerate(prompts):
        assert generation.tokens[row].tolist() == target_greedy(target, prompt), f"row {row}"
    accepted = sum(generation.stats.pooled().accepted_by_position)
    print(f"{drafter} γ={gamma} B={batch_size}: tokens/pass {generation.stats.pooled().tokens_per_pass:.3f}, "
          f"accepted drafts {accepted}")


@pytest.mark.parametrize("draft_is_model", [True, False])
def test_spec_adapter_greedy_equals_target_generate(draft_is_model, models):
    target, draft = models
    tokens = generate(target, draft if draft_is_model else None, torch.tensor([PROMPTS[0]]), max_new_tokens=NEW_TOKENS,
                      temperature=0, top_k=None, top_p=None, seed=0)
    assert tokens.dtype == torch.int64 and tokens.shape == (NEW_TOKENS,)
    assert tokens.tolist() == target_greedy(target, PROMPTS[0])


def test_greedy_check_fails_when_rollback_keeps_a_rejected_draft(models, monkeypatch):
    """A target cache whose rollback leaves the last rejected draft visible (its positions are
    rolled back, its key/value is not): greedy identity must break."""
    target, draft = models
    correct_forget = RaggedCache.forget

    def forget_one_too_few(self, counts):
        if self.model is not target:
            return correct_forget(self, counts)
        correct_forget(self, (counts - 1).clamp(min=0))
        self.lengths = self.lengths - (counts > 0).to(torch.int64)  # as if every rejected draft were gone

    monkeypatch.setattr(reference.kv.RaggedCache, "forget", forget_one_too_few)
    generation = speculative_generate(target, ModelDrafter(draft), [torch.tensor(p) for p in PROMPTS],
                                      max_new_tokens=NEW_TOKENS, gamma=4, temperature=0.0)
    rows_equal = [generation.tokens[row].tolist() == target_greedy(target, p) for row, p in enumerate(PROMPTS)]
    assert not all(rows_equal)


# ------------------------------------------------------------------------------------------------
# The ragged KV cache
# ------------------------------------------------------------------------------------------------


@st.composite
def ragged_schedules(draw):
    """Prompts of 1..6 tokens for 1..4 rows, then rounds of (block of new tokens, rollback counts)."""
    batch = draw(st.integers(1, 4))
    token = st.integers(0, VOCAB - 1)
    prompts = [draw(st.lists(token, min_size=1, max_size=6)) for _ in range(batch)]
    rounds = []
    for _ in range(draw(st.integers(1, 4))):
        width = draw(st.integers(1, 4))
        counts = [draw(st.integers(0, width)) for _ in range(batch)]
        block = [draw(st.lists(token, min_size=width, max_size=width)) for _ in range(batch)]
        forget = [draw(st.integers(0, count)) for count in counts]
        rounds.append((block, counts, forget))
    return prompts, rounds


def ragged_logits_and_alone(schedule, target) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run a schedule through a RaggedCache; per row, (its next-token logits from the batch, from a
    plain forward over its tokens alone)."""
    prompts, rounds = schedule
    sequences = TokenSequences([torch.tensor(p) for p in prompts], torch.device("cpu"))
    kv = RaggedCache(target, len(prompts), torch.device("cpu"))
    kv.extend(*sequences.tail(torch.zeros_like(sequences.lengths)))
    rows = [list(p) for p in prompts]
    for block, counts, forget in rounds:
        kv.extend(torch.tensor(block), torch.tensor(counts))
        kv.forget(torch.tensor(forget))
        for row, (tokens, count, dropped) in enumerate(zip(block, counts, forget)):
            rows[row] += tokens[: count - dropped]
    last = torch.tensor([[1]] * len(prompts))
    logits = kv.extend(last, torch.ones(len(prompts), dtype=torch.int64))[:, 0]
    assert kv.lengths.tolist() == [len(row) + 1 for row in rows]
    return [(logits[row], target(input_ids=torch.tensor([tokens + [1]])).logits[0, -1]) for row,
            tokens in enumerate(rows)]


@settings(max_examples=25)
@given(schedule=ragged_schedules())
def test_ragged_cache_rows_equal_their_own_forward_pass(schedule, models):
    """After ragged appends (left-aligned blocks with padding) and per-row rollbacks, the next-token
    logits of every row equal those of a plain forward over that row's tokens alone."""
    with torch.no_grad():
        for batched, alone in ragged_logits_and_alone(schedule, models[0]):
            torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-5)


def test_ragged_cache_check_fails_when_rollback_leaves_no_hole(models, monkeypatch):
    """Rolling back only the lengths (the rejected keys stay visible) must be caught."""

    def forget_without_holes(self, counts):
        self.lengths = self.lengths - counts

    monkeypatch.setattr(reference.kv.RaggedCache, "forget", forget_without_holes)
    schedule = ([[1, 2, 3], [4]], [([[5, 6, 7], [8, 9, 10]], [3, 2], [2, 0])])
    with torch.no_grad():
        pairs = ragged_logits_and_alone(schedule, models[0])
    assert not all(torch.allclose(batched, alone, rtol=1e-5, atol=1e-5) for batched, alone in pairs)


# ------------------------------------------------------------------------------------------------
# Prompt lookup and early exit
# ------------------------------------------------------------------------------------------------


def lookup_by_loop(context: list[int], gamma: int, max_ngram: int, min_ngram: int,
                   match: str = "earliest") -> list[int]:
    """The definition, written as a loop.  ``earliest``/``latest``: longest n first, then the
    first/most recent earlier occurrence; ``longest``: the end position whose preceding tokens
    agree longest with the context's last ones (up to LONGEST_CONTEXT), the first among equals."""
    if match == "longest":
        best, chosen = 0, None
        for end in range(1, len(context)):
            agree = 0
            while (agree < max(max_ngram, PromptLookupDrafter.LONGEST_CONTEXT) and agree < end
                   and context[end - 1 - agree] == context[-1 - agree]):
                agree += 1
            if agree >= min_ngram and agree > best:
                best, chosen = agree, end
        return [] if chosen is None else context[chosen : chosen + gamma]
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= len(context):
            continue
        starts = range(len(context) - n - 1, -1, -1) if match == "latest" else range(len(context) - n)
        for start in starts:
            if context[start : start + n] == context[-n:]:
                return context[start + n : start + n + gamma]
    return []


@settings(max_examples=200)
@given(
    contexts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=14), min_size=1, max_size=4),
    gamma=st.integers(1, 5),
    ngram=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    match=st.sampled_from(MATCH_POLICIES),
)
def test_prompt_lookup_matches_its_definition(contexts, gamma, ngram, match):
    max_ngram, min_ngram = ngram[0], max(1, ngram[0] - ngram[1])
    sequences = TokenSequences([torch.tensor(c) for c in contexts], torch.device("cpu"))
    gammas = torch.full((len(contexts),), gamma)
    draft = PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram, match=match).propose(
        sequences, gammas, SamplingParams(), [torch.Generator() for _ in contexts]
    )
    assert draft.probs is None
    for row, context in enumerate(contexts):
        expected = lookup_by_loop(context, gamma, max_ngram, min_ngram, match)
        assert int(draft.num_draft[row]) == len(expected)
        assert draft.tokens[row, : len(expected)].tolist() == expected


def test_prompt_lookup_match_policies_hand_cases():
    sequences = TokenSequences([torch.tensor([1, 2, 9, 1, 2, 7, 1, 2]), torch.tensor([5, 6, 7, 5, 6]),
                                torch.tensor([3, 4]), torch.tensor([8, 1, 2, 5, 3, 1, 2, 6, 3, 1, 2])],
                               torch.device("cpu"))
    expected = {  # "1 2" -> after its first / last earlier use / the use preceded by "3"; none
        "earliest": [[9, 1], [7, 5], [0, 0], [5, 3]],
        "latest": [[7, 1], [7, 5], [0, 0], [6, 3]],
        "longest": [[9, 1], [7, 5], [0, 0], [6, 3]],
    }
    for match, tokens in expected.items():
        draft = PromptLookupDrafter(max_ngram=2, match=match).propose(sequences, torch.full((4,), 2), SamplingParams(),
                                                                      [torch.Generator() for _ in range(4)])
        assert draft.tokens.tolist() == tokens, match
        assert draft.num_draft.tolist() == [2, 2, 0, 2]
    assert PromptLookupDrafter().match == "longest"


def test_early_exit_view_shares_weights_and_computes_head_of_layer_k(models):
    target = models[0]
    view = truncated_view(target, 1)
    target_storage = {parameter.data_ptr() for parameter in target.parameters()}
    assert all(parameter.data_ptr() in target_storage for parameter in view.parameters())
    assert len(target.model.layers) == 2 and target.config.num_hidden_layers == 2  # target untouched
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        hidden_after_layer_1 = target(input_ids=ids, output_hidden_states=True).hidden_states[1]
        expected = target.lm_head(target.model.norm(hidden_after_layer_1))
        torch.testing.assert_close(view(input_ids=ids).logits, expected)


# ------------------------------------------------------------------------------------------------
# Reproducibility and EOS
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", ["model", "lookup"])
def test_same_seed_gives_same_tokens(drafter, models):
    target, draft = models
    prompts = [torch.tensor(p) for p in PROMPTS]

    def run(seed):
        return speculative_generate(target, make_drafter(drafter, target, draft), prompts, max_new_tokens=16,
                                    gamma=3, temperature=1.0, top_p=0.95, seed=seed).tokens

    first = run(11)
    assert torch.equal(first, run(11))
    assert not torch.equal(first, run(12))


def test_eos_ends_a_row_and_pads_it(models):
    target, draft = models
    greedy = target_greedy(target, PROMPTS[0])
    eos = greedy[5]
    stop = greedy.index(eos)
    generation = speculative_generate(target, ModelDrafter(draft), [torch.tensor(PROMPTS[0])],
                                      max_new_tokens=NEW_TOKENS,
                                      gamma=3, temperature=0.0, eos_token_id=eos)
    assert generation.tokens[0, : stop + 1].tolist() == greedy[: stop + 1]
    assert (generation.tokens[0, stop + 1 :] == -1).all()
    assert int(generation.num_tokens[0]) == stop + 1
