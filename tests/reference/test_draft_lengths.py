"""Per-row draft lengths of the reference decoder: row b drafts ``γ_b = min(γ, r_b − 1)`` tokens,
``r_b`` the tokens it still needs, and draws exactly its own random numbers.

- With a draft model, greedy, batch 1: the target passes (their widths), the draft passes and the
  tokens equal Hugging Face assisted generation's with a constant ``num_assistant_tokens = γ``,
  whose candidate generator caps the assistant at ``min(γ, max_length − cur_len − 1)``.  Its
  prompt lookup caps only the last step (no candidate when one token is left); the reference
  trims every step, so it makes the same passes, none wider than the tokens left.
- Every step, every row: ``γ_b`` is ``min(γ, r_b − 1)`` (0 once finished, by length or EOS), the
  row proposes at most ``γ_b`` drafts, the draft model runs ``max_b γ_b`` passes and the target
  pass is as wide as the widest row's unseen tokens plus drafts.
- A request's tokens do not depend on its batch-mates, whether they have more or fewer tokens
  left (rows accept different numbers of drafts, so their ``γ_b`` differ within a step) or
  finished early at EOS; and the check fails for a decoder whose rows draw the batch's ``K + 1``
  uniforms, or a draft token at every draft position of the batch, instead of their own counts.

Tiny fp32 models (``specverify.hf.tiny_models``): exact checks, no sampling tolerance.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

import reference.decoder
import reference.drafters
from reference.decoder import speculative_generate
from reference.drafters import (
    EarlyExitDrafter,
    HiddenStateDrafter,
    ModelDrafter,
    MTPDrafter,
    MTPHead,
    PromptLookupDrafter,
)
from specverify.hf.tiny_models import tiny_target_and_draft

VOCAB = 16
PROMPT = (3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4)  # repeats: prompt lookup finds drafts
BATCH_PROMPTS = ((3, 1, 4, 1, 5, 9, 2, 6), (7,), (2, 7, 1, 8, 2, 8), (5, 5, 1, 5, 5))
SEEDS = [11, 23, 5, 42]


@pytest.fixture(scope="module")
def models():
    return tiny_target_and_draft(vocab_size=VOCAB, hidden_size=32, seed=3)


def make_drafter(name: str, target, draft):
    return {"model": lambda: ModelDrafter(draft), "lookup": PromptLookupDrafter,
            "early-exit": lambda: EarlyExitDrafter(target, num_layers=1),
            "mtp": lambda: MTPDrafter(MTPHead(target))}[name]()


class StepLog:
    """Wraps a drafter; per step records each row's new tokens so far, ``gammas`` and ``num_draft``."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter
        self.steps: list[tuple[torch.Tensor, list[list[int]], torch.Tensor, torch.Tensor]] = []

    def check_target(self, target) -> None:
        self.drafter.check_target(target)

    def start(self, sequences) -> None:
        self.drafter.start(sequences)

    def propose(self, sequences, gammas, params, generators):
        draft = self.drafter.propose(sequences, gammas, params, generators)
        new = [sequences.tokens[row, start:end].tolist()
               for row, (start, end) in enumerate(zip(sequences.prompt_lengths.tolist(), sequences.lengths.tolist()))]
        self.steps.append((sequences.lengths - sequences.prompt_lengths, new, gammas.clone(), draft.num_draft.clone()))
        return draft

    def accepted(self, num_accepted) -> None:
        self.drafter.accepted(num_accepted)


class HiddenStateStepLog(StepLog, HiddenStateDrafter):
    """A :class:`StepLog` of a drafter that reads the target's hidden states, which it hands on."""

    def target_hidden(self, hidden, counts) -> None:
        self.drafter.target_hidden(hidden, counts)


def forward_widths(model, log: list[int]):
    """A forward hook appending the input width of each call of ``model`` to ``log``; returns the
    handle.  An early-exit view (a shallow copy, sharing the hooks) has its own config: not counted."""

    def record(module, args, kwargs, output) -> None:
        if module.config is model.config:
            log.append(kwargs["input_ids"].shape[1])

    return model.register_forward_hook(record, with_kwargs=True)


def hf_assisted(target, draft, prompt: torch.Tensor, max_new_tokens: int, gamma: int, lookup: bool):
    """Hugging Face assisted generation, greedy, constant γ: (tokens, target pass widths, draft passes)."""
    target_widths, draft_widths = [], []
    handles = [forward_widths(target, target_widths), forward_widths(draft, draft_widths)]
    config = GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=None, pad_token_id=0,
        **({"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": 3} if lookup else {}),
    )
    assistant = draft.generation_config
    saved = (assistant.num_assistant_tokens, assistant.num_assistant_tokens_schedule,
             assistant.assistant_confidence_threshold)
    assistant.num_assistant_tokens, assistant.num_assistant_tokens_schedule = gamma, "constant"
    assistant.assistant_confidence_threshold = 0.0
    try:
        output = target.generate(prompt[None], attention_mask=torch.ones_like(prompt[None]), generation_config=config,
                                 **({} if lookup else {"assistant_model": draft}))
    finally:
        (assistant.num_assistant_tokens, assistant.num_assistant_tokens_schedule,
         assistant.assistant_confidence_threshold) = saved
        for handle in handles:
            handle.remove()
    return output[0, len(prompt):].tolist(), target_widths, len(draft_widths)


def reference_run(target, draft, drafter, prompts, max_new_tokens: int, gamma: int, **options):
    """(generation, step log, target pass widths, draft pass count) of one reference decode."""
    log = HiddenStateStepLog(drafter) if isinstance(drafter, HiddenStateDrafter) else StepLog(drafter)
    target_widths, draft_widths = [], []
    handles = [forward_widths(target, target_widths), forward_widths(draft, draft_widths)]
    try:
        generation = speculative_generate(target, log, [torch.tensor(p) for p in prompts],
                                          max_new_tokens=max_new_tokens, gamma=gamma, **options)
    finally:
        for handle in handles:
            handle.remove()
    return generation, log, target_widths, len(draft_widths)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 10])
@pytest.mark.parametrize("gamma", [1, 3, 4])
def test_model_drafter_makes_hf_assisted_generations_passes(gamma, max_new_tokens, models):
    target, draft = models
    expected, hf_widths, hf_draft_passes = hf_assisted(target, draft, torch.tensor(PROMPT), max_new_tokens, gamma,
                                                       lookup=False)
    generation, log, widths, draft_passes = reference_run(target, draft, ModelDrafter(draft), [PROMPT],
                                                          max_new_tokens, gamma, temperature=0.0)
    assert generation.tokens[0].tolist() == expected
    assert widths == hf_widths
    assert draft_passes == hf_draft_passes == sum(int(gammas.max()) for _, _, gammas, _ in log.steps)
    new, _, gammas, _ = log.steps[-1]
    assert int(gammas[0]) == min(gamma, max_new_tokens - int(new[0]) - 1)  # the last step: only what is left


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 10])
@pytest.mark.parametrize("gamma", [1, 3, 4])
def test_prompt_lookup_makes_hf_passes_none_wider_than_needed(gamma, max_new_tokens, models):
    """HF's prompt lookup = the ``earliest`` policy; its passes may be wider than the tokens left."""
    target, draft = models
    expected, hf_widths, _ = hf_assisted(target, draft, torch.tensor(PROMPT), max_new_tokens, gamma, lookup=True)
    generation, log, widths, _ = reference_run(target, draft, PromptLookupDrafter(max_ngram=3, match="earliest"),
                                               [PROMPT], max_new_tokens, gamma, temperature=0.0)
    assert generation.tokens[0].tolist() == expected
    assert len(widths) == len(hf_widths)
    for step, ((new, _, _, num_draft), width, hf_width) in enumerate(zip(log.steps, widths, hf_widths)):
        fed = len(PROMPT) if step == 0 else 1
        assert width == fed + int(num_draft[0]) == min(hf_width, fed + max_new_tokens - int(new[0]) - 1)


def assert_draft_lengths_follow_the_rule(log: StepLog, widths: list[int], draft_passes: int | None, prompts,
                                         max_new_tokens: int, gamma: int, eos: int | None) -> None:
    """Every step: γ_b = min(γ, r_b − 1), 0 once finished; n_b <= γ_b; target width; draft passes."""
    lengths = torch.tensor([len(p) for p in prompts])
    for step, ((new, tokens, gammas, num_draft), width) in enumerate(zip(log.steps, widths)):
        finished = (new >= max_new_tokens) | torch.tensor([eos in row for row in tokens])
        expected = torch.where(finished, 0, (max_new_tokens - new - 1).clamp(max=gamma))
        assert torch.equal(gammas, expected), (step, gammas.tolist(), expected.tolist())
        assert bool((num_draft <= gammas).all())
        fed = lengths if step == 0 else torch.ones_like(lengths)
        assert width == int((fed + num_draft).max())
    if draft_passes is not None:
        assert draft_passes == sum(int(gammas.max()) for _, _, gammas, _ in log.steps)


def eos_of_first_row(target, draft, drafter: str, gamma: int, max_new_tokens: int) -> int:
    """An EOS id that row 0 makes early (its second token when decoded without EOS)."""
    generation = speculative_generate(target, make_drafter(drafter, target, draft),
                                      [torch.tensor(p) for p in BATCH_PROMPTS], max_new_tokens=max_new_tokens,
                                      gamma=gamma, temperature=1.0, seed=SEEDS)
    return int(generation.tokens[0, 1])


@pytest.mark.parametrize("with_eos", [False, True], ids=["no-eos", "eos"])
@pytest.mark.parametrize("drafter", ["model", "lookup", "early-exit", "mtp"])
def test_rows_draft_what_they_need_and_their_tokens_ignore_their_batch_mates(drafter, with_eos, models):
    """γ = 4, 7 new tokens (not a multiple of γ + 1), temperature 1, one seed per request: each
    request decoded alone equals its row in a batch of four prompts of different lengths, where
    within one step rows have different γ_b (more or fewer tokens left than their mates) and,
    with EOS, rows that finished early ride along with γ_b = 0."""
    target, draft = models
    gamma, max_new_tokens = 4, 7
    eos = eos_of_first_row(target, draft, drafter, gamma, max_new_tokens) if with_eos else None
    options = dict(temperature=1.0, eos_token_id=eos)
    generation, log, widths, draft_passes = reference_run(
        target, draft, make_drafter(drafter, target, draft), BATCH_PROMPTS, max_new_tokens, gamma, seed=SEEDS,
        **options)
    assert_draft_lengths_follow_the_rule(log, widths, draft_passes if drafter == "model" else None, BATCH_PROMPTS,
                                         max_new_tokens, gamma, eos)
    assert any(len(set(gammas.tolist())) > 1 for _, _, gammas, _ in log.steps)  # mates with other γ_b in one step
    assert any(bool(num_draft.any()) for _, _, _, num_draft in log.steps)  # the drafter drafted
    if with_eos:
        assert int(generation.num_tokens[0]) < max_new_tokens  # row 0 finished early and rode along
    for row, (prompt, seed) in enumerate(zip(BATCH_PROMPTS, SEEDS)):
        alone = speculative_generate(target, make_drafter(drafter, target, draft), [torch.tensor(prompt)],
                                     max_new_tokens=max_new_tokens, gamma=gamma, seed=[seed], **options)
        assert generation.tokens[row].tolist() == alone.tokens[0].tolist(), f"row {row}"


def uniforms_for_the_batch_width(generators, num_draft, width, device):
    """BUG: every row draws K + 1 uniforms (the batch's width), whatever its own drafts."""
    return torch.stack([torch.rand(width + 1, generator=g, dtype=torch.float64, device=device) for g in generators])


def draft_draw_at_every_position(probs, generators, drawing):
    """BUG: every row draws a draft token at every position the batch drafts, past its own γ_b."""
    return torch.cat([reference.drafters.sample_from(probs[row : row + 1], g) for row, g in enumerate(generators)])


@pytest.mark.parametrize("bug", ["uniforms", "draft-draws"])
def test_batch_mates_check_fails_when_rows_draw_the_batchs_count(bug, models, monkeypatch):
    if bug == "uniforms":
        monkeypatch.setattr(reference.decoder, "step_uniforms", uniforms_for_the_batch_width)
    else:
        monkeypatch.setattr(reference.drafters, "sample_each_row", draft_draw_at_every_position)
    target, draft = models
    batch = speculative_generate(target, ModelDrafter(draft), [torch.tensor(p) for p in BATCH_PROMPTS],
                                 max_new_tokens=7, gamma=4, temperature=1.0, seed=SEEDS).tokens
    alone = [speculative_generate(target, ModelDrafter(draft), [torch.tensor(p)], max_new_tokens=7, gamma=4,
                                  temperature=1.0, seed=[s]).tokens[0] for p, s in zip(BATCH_PROMPTS, SEEDS)]
    assert not all(torch.equal(batch[row], tokens) for row, tokens in enumerate(alone))
