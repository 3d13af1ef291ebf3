"""Bad input to the reference decoder: a ValueError that names the argument, before any model runs."""

from __future__ import annotations

import pytest
import torch

from reference.decoder import generate, speculative_generate
from reference.drafters import EarlyExitDrafter, ModelDrafter, PromptLookupDrafter
from specverify.hf.tiny_models import tiny_causal_lm, tiny_target_and_draft


@pytest.fixture(scope="module")
def models():
    return tiny_target_and_draft(vocab_size=12, seed=0)


@pytest.fixture
def forward_calls(models):
    """Counts forward passes of the target and the draft during a test."""
    calls = []
    handles = [model.register_forward_pre_hook(lambda module, args: calls.append(module)) for model in models]
    yield calls
    for handle in handles:
        handle.remove()


VALID = dict(max_new_tokens=4, gamma=2, temperature=1.0, top_k=None, top_p=None, seed=0)
PROMPT = [torch.tensor([1, 2, 3])]


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        (dict(gamma=0), "gamma"),
        (dict(gamma=-1), "gamma"),
        (dict(gamma=2.0), "gamma"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=-3), "max_new_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(seed="0"), "seed"),
    ],
)
def test_bad_settings(change, argument, models, forward_calls):
    target, draft = models
    with pytest.raises(ValueError, match=argument):
        speculative_generate(target, ModelDrafter(draft), PROMPT, **{**VALID, **change})
    assert forward_calls == []


@pytest.mark.parametrize(
    "prompts",
    [[], [torch.tensor([], dtype=torch.int64)], [torch.tensor([1, 2]), torch.tensor([], dtype=torch.int64)],
     torch.zeros(2, 0, dtype=torch.int64)],
    ids=["no prompts", "empty prompt", "one empty row", "T = 0"],
)
def test_empty_prompts(prompts, models, forward_calls):
    target, draft = models
    with pytest.raises(ValueError, match="prompt"):
        speculative_generate(target, ModelDrafter(draft), prompts, **VALID)
    assert forward_calls == []


@pytest.mark.parametrize(
    "prompt", [torch.tensor([1, 12]), torch.tensor([-1, 2]), torch.tensor([1.0, 2.0]), torch.tensor([[1, 2]])],
    ids=["id >= V", "negative id", "float ids", "2-D row"],
)
def test_bad_prompt_tokens(prompt, models, forward_calls):
    target, draft = models
    with pytest.raises(ValueError, match="prompts"):
        speculative_generate(target, ModelDrafter(draft), [prompt], **VALID)
    assert forward_calls == []


def test_mismatched_vocabularies(models, forward_calls):
    target = models[0]
    other_vocabulary = tiny_causal_lm(vocab_size=10, seed=5)
    with pytest.raises(ValueError, match="draft: its vocabulary has 10 ids but the target's has 12"):
        speculative_generate(target, ModelDrafter(other_vocabulary), PROMPT, **VALID)
    with pytest.raises(ValueError, match="vocabulary"):
        generate(target, other_vocabulary, PROMPT[0][None], **VALID)
    assert forward_calls == []


def test_target_in_training_mode(models, forward_calls):
    target, draft = models
    target.train()
    try:
        with pytest.raises(ValueError, match="target.*eval"):
            speculative_generate(target, ModelDrafter(draft), PROMPT, **VALID)
    finally:
        target.eval()
    assert forward_calls == []


def test_draft_on_another_device(models, forward_calls):
    target = models[0]
    on_meta = tiny_causal_lm(vocab_size=12, seed=5).to("meta")
    with pytest.raises(ValueError, match="draft: on meta"):
        speculative_generate(target, ModelDrafter(on_meta), PROMPT, **VALID)
    assert forward_calls == []


def test_eos_out_of_range(models, forward_calls):
    target, draft = models
    with pytest.raises(ValueError, match="eos_token_id"):
        speculative_generate(target, ModelDrafter(draft), PROMPT, eos_token_id=12, **VALID)
    assert forward_calls == []


@pytest.mark.parametrize(
    "input_ids", [torch.tensor([1, 2, 3]), torch.tensor([[1, 2], [3, 4]]), [[1, 2, 3]]], ids=["1-D", "B = 2", "list"]
)
def test_spec_adapter_wants_one_row(input_ids, models, forward_calls):
    target, draft = models
    with pytest.raises(ValueError, match="input_ids"):
        generate(target, draft, input_ids, **VALID)
    assert forward_calls == []


def test_spec_adapter_empty_prompt(models, forward_calls):
    target, draft = models
    with pytest.raises(ValueError, match="empty"):
        generate(target, None, torch.zeros(1, 0, dtype=torch.int64), **VALID)
    assert forward_calls == []


@pytest.mark.parametrize("num_layers", [0, 2, 5])
def test_early_exit_layer_count(num_layers, models, forward_calls):
    with pytest.raises(ValueError, match="num_layers: expected 1..1"):
        EarlyExitDrafter(models[0], num_layers)
    assert forward_calls == []


def test_early_exit_built_from_another_target(models, forward_calls):
    target = models[0]
    other = tiny_causal_lm(vocab_size=12, num_layers=2, seed=9)
    with pytest.raises(ValueError, match="target: this EarlyExitDrafter was built from a different model"):
        speculative_generate(target, EarlyExitDrafter(other, 1), PROMPT, **VALID)
    assert forward_calls == []


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(0, 1), (2, 3), (3, 0)])
def test_prompt_lookup_ngram_range(max_ngram, min_ngram):
    with pytest.raises(ValueError, match="min_ngram/max_ngram"):
        PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)


def test_prompt_lookup_match_policy():
    with pytest.raises(ValueError, match="match: expected one of"):
        PromptLookupDrafter(match="recent")
