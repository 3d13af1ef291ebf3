"""Tests of the Hugging Face transformers adapters, and the audit findings about transformers.

- sampler level (``hf-transformers``, :mod:`specverify.hf.sampler_adapter`): the adapter's
  contract (shape, padding, randomness from the generator only) and the sampler battery's
  verdict on transformers' ``_speculative_sampling``;
- decoder level (``hf-transformers``, ``hf-transformers-prompt-lookup``,
  :mod:`specverify.hf.generate_adapter`): the adapter's contract and the decoder battery's
  verdict on ``model.generate(assistant_model=...)`` and prompt lookup;
- the findings of docs/hf-transformers-findings.md that are shown exactly (no sampling): the
  zero-uniform acceptance of a token the target forbids, the global RNG, the assistant's double
  temperature, and the agreement of transformers' top-k/top-p with specverify.core.processing on the
  audit's models (so the decoder audit's exact law is transformers' own sampling law).

These run on tiny random models (no downloads).  Default run: the adapters' contracts, the exact
findings, a decoder audit at 20 calls and a smaller fixed-budget sampler audit; the ``quick`` and
``standard`` sampler and decoder audits are ``slow``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("transformers")

from transformers.generation import utils as hf_generation_utils  # noqa: E402
from transformers.generation.logits_process import (  # noqa: E402
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specverify.auditing.decoder.battery import GREEDY_CASES, POSITION_STRATA, DecoderModels  # noqa: E402
from specverify.auditing.defaults import EXIT_FAIL, EXIT_PASS
from specverify.auditing.loading import load_target  # noqa: E402
from specverify.auditing.runner import audit  # noqa: E402
from specverify.core.processing import process_logits  # noqa: E402
from specverify.core.rules import rejection_sample  # noqa: E402
from specverify.hf import generate_adapter as hf_generate  # noqa: E402
from specverify.hf import sampler_adapter as hf_sampler


@pytest.fixture(scope="module")
def models() -> DecoderModels:
    return DecoderModels()


def random_step(batch: int, num_draft: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    p = torch.rand(batch, num_draft + 1, vocab, generator=generator) ** 3
    q = torch.rand(batch, num_draft, vocab, generator=generator) ** 3
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    x = torch.multinomial(q.reshape(-1, vocab), 1, generator=generator).reshape(batch, num_draft)
    return p, q, x


# --------------------------------------------------------------------------------------------
# Sampler level
# --------------------------------------------------------------------------------------------


def test_builtins_resolve_to_the_adapters():
    assert load_target("hf-transformers", "sampler") is hf_sampler.verify
    assert load_target("hf-transformers", "decoder") is hf_generate.generate
    assert load_target("hf-transformers-prompt-lookup", "decoder") is hf_generate.generate_prompt_lookup


@pytest.mark.parametrize("num_draft", [1, 3])
def test_sampler_adapter_follows_spec_1(num_draft):
    p, q, x = random_step(64, num_draft, 5, seed=num_draft)
    emitted = hf_sampler.verify(p, q, x, torch.Generator().manual_seed(0))
    assert emitted.dtype == torch.int64 and emitted.shape == (64, num_draft + 1)
    lengths = (emitted >= 0).sum(1)
    assert ((emitted >= 0) == (torch.arange(num_draft + 1) < lengths[:, None])).all()  # -1 only after the tokens
    accepted = torch.arange(num_draft) < (lengths - 1)[:, None]
    assert (emitted[:, :num_draft][accepted] == x[accepted]).all()


def test_sampler_adapter_randomness_comes_from_the_generator_only():
    p, q, x = random_step(32, 2, 4, seed=7)
    state = torch.random.get_rng_state()
    torch.manual_seed(1)
    first = hf_sampler.verify(p, q, x, torch.Generator().manual_seed(5))
    torch.manual_seed(2)
    second = hf_sampler.verify(p, q, x, torch.Generator().manual_seed(5))
    third = hf_sampler.verify(p, q, x, torch.Generator().manual_seed(6))
    assert torch.equal(first, second) and not torch.equal(first, third)
    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    hf_sampler.verify(p, q, x, torch.Generator().manual_seed(5))
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's global RNG is untouched
    torch.random.set_rng_state(state)


def naive_verify(target_probs, draft_probs, draft_tokens, generator):
    """transformers' rule wrapped WITHOUT routing its randomness: it then draws from the global RNG."""
    emitted = torch.full((draft_tokens.shape[0], draft_tokens.shape[1] + 1), -1, dtype=torch.int64)
    for row in range(draft_tokens.shape[0]):
        tokens, _ = hf_generation_utils._speculative_sampling(
            draft_tokens[row : row + 1], draft_probs[row : row + 1].log(), draft_tokens.shape[1],
            target_probs[row : row + 1].log())
        emitted[row, : tokens.shape[1]] = tokens[0]
    return emitted


def test_audit_detects_the_global_rng_of_an_unrouted_wrapper():
    """transformers samples with torch.rand_like / torch.multinomial on the global RNG; an adapter
    that does not seed it from the generator is a contract violation the audit reports."""
    report = audit(naive_verify, level="sampler", budget=200, checks=["randomness-source", "step-K1"])
    assert report.exit_code == EXIT_FAIL, report.explain()
    assert {c.name: c.verdict for c in report.checks}["randomness-source"] == "fail"


def test_zero_uniform_accepts_a_token_the_target_forbids(monkeypatch):
    """transformers accepts draft x iff ``r <= p(x)/q(x)`` with ``r = torch.rand_like(...)``.  When
    p(x) = 0 (a token the target's top-k/top-p removed, which the draft may still propose), the
    ratio is 0 and ``r = 0`` accepts it.  Forcing r = 0 shows it exactly; the strict test
    ``u·q < p`` of specverify.core.rules rejects it for every u."""
    p = torch.tensor([[[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]]])
    q = torch.tensor([[[0.8, 0.1, 0.1]]])
    x = torch.tensor([[0]])
    monkeypatch.setattr(torch, "rand_like", lambda tensor, **kwargs: torch.zeros_like(tensor))
    emitted = hf_sampler.verify(p, q, x, torch.Generator().manual_seed(0))
    assert emitted[0, 0] == 0  # a token of target probability 0 was emitted
    strict = rejection_sample(p.double(), q.double(), x, uniforms=torch.zeros(1, 2, dtype=torch.float64))
    assert strict.emitted[0, 0] != 0


def test_cpu_uniforms_hit_zero_with_probability_two_to_the_minus_24():
    """The size of that loss: float32 ``torch.rand`` on the CPU returns multiples of 2^-24, so
    ``r == 0`` has probability 2^-24 ≈ 6e-8 per forbidden draft (far below any sampled audit)."""
    values = torch.rand(200_000, generator=torch.Generator().manual_seed(0))
    scaled = values.double() * 2**24
    assert torch.equal(scaled, scaled.floor())


@pytest.mark.statistical
def test_sampler_audit_of_transformers_small_budget():
    """Default-run audit of the toy-shaped checks (1000 samples per check: each detects TV ≈
    0.13–0.2 with power 0.99); the production-shape checks (1000 rows give them no power at
    V = 151,936) run in the slow quick/standard audits below."""
    from specverify.auditing.sampler.battery import SamplerBattery
    from specverify.core.rules import verify as reference

    battery = SamplerBattery()
    toy = [c.name for c in battery.checks(battery.open_session(reference, device="cpu", timeout_s=10))
           if not c.production_shape]
    report = audit("hf-transformers", level="sampler", budget=1000, checks=toy)
    assert report.exit_code == EXIT_PASS, report.explain()


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("budget", ["quick", "standard"])
def test_sampler_audit_of_transformers(budget):
    report = audit("hf-transformers", level="sampler", budget=budget)
    assert report.exit_code == EXIT_PASS, report.explain()


# --------------------------------------------------------------------------------------------
# Decoder level
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("generate", [hf_generate.generate, hf_generate.generate_prompt_lookup])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decoder_adapter_follows_spec_2(models, generate, temperature):
    prompt = torch.tensor([[1, 5, 2, 6]])
    state = torch.random.get_rng_state()
    tokens = generate(models.target, models.draft, prompt, max_new_tokens=5, temperature=temperature, top_k=None,
                      top_p=None, seed=3)
    again = generate(models.target, models.draft, prompt, max_new_tokens=5, temperature=temperature, top_k=None,
                     top_p=None, seed=3)
    assert tokens.dtype == torch.int64 and tokens.shape == (5,)
    assert torch.equal(tokens, again)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(prompt, torch.tensor([[1, 5, 2, 6]]))


@pytest.mark.parametrize("generate", [hf_generate.generate, hf_generate.generate_prompt_lookup])
def test_decoder_adapter_greedy_is_the_targets_greedy(models, generate):
    for case in GREEDY_CASES:
        expected, _ = models.greedy(case, 8)
        target, draft = models.pair(case.models)
        setting = case.setting
        tokens = generate(target, draft, torch.tensor([case.prompt]), max_new_tokens=8,
                          temperature=setting.temperature, top_k=setting.top_k, top_p=setting.top_p, seed=0)
        assert tokens.tolist() == expected


def hf_warpers(temperature: float, top_k: int | None, top_p: float | None) -> LogitsProcessorList:
    """transformers' warpers for these settings, in the order ``_get_logits_processor`` builds them."""
    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k is not None:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers


@pytest.mark.parametrize("stratum", POSITION_STRATA, ids=lambda s: s.label())
def test_transformers_processing_equals_specverify_processing_on_the_audit_models(models, stratum):
    """On every context of the prompt + up to 2 tokens, transformers' temperature/top-k/top-p give
    the same law as specverify.core.processing (same kept tokens, probabilities within float32
    rounding), so the audit's exact law is transformers' own plain-sampling law."""
    setting, prompt = stratum.setting, stratum.prompt
    target = models.pair(stratum.models)[0]
    warpers = hf_warpers(setting.temperature, setting.top_k, setting.top_p)
    with torch.no_grad():
        for length in range(3):
            ids = torch.tensor([prompt + suffix for suffix in itertools.product(range(8), repeat=length)])
            logits = target(ids).logits[:, -1].float()
            ours = process_logits(logits, temperature=setting.temperature, top_k=setting.top_k, top_p=setting.top_p)
            theirs = warpers(ids, logits.clone()).softmax(-1)
            assert torch.equal(ours > 0, theirs > 0)
            torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


def test_assistant_draws_at_temperature_squared(models, monkeypatch):
    """Finding (transformers 5.24): the assistant model's logits are processed twice, once by the
    main model's processor list passed into the candidate generator and once by its own
    ``generate``, so the draft samples from softmax(draft_logits / T²) (top-p, too, is applied
    twice).  candidate_logits are those doubly processed scores, i.e. the law the draft really
    used, so verification stays lossless; only the acceptance rate changes.  If this test fails
    after a transformers upgrade, update docs/hf-transformers-findings.md."""
    seen = []
    original = hf_generation_utils._speculative_sampling

    def spy(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs):
        seen.append((candidate_input_ids.clone(), candidate_logits.clone(), candidate_length))
        return original(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs)

    monkeypatch.setattr(hf_generation_utils, "_speculative_sampling", spy)
    temperature = 0.7
    hf_generate.generate(models.target, models.draft, torch.tensor([[1, 5, 2, 6]]), max_new_tokens=4,
                         temperature=temperature, top_k=None, top_p=None, seed=0)
    candidate_ids, candidate_logits, length = seen[0]
    with torch.no_grad():
        raw = models.draft(candidate_ids).logits[:, -length - 1 : -1].float()
    torch.testing.assert_close(candidate_logits, raw / temperature**2, atol=1e-4, rtol=1e-4)


@pytest.mark.statistical
def test_decoder_audit_of_transformers_assisted_generation_small_budget():
    """Every decoder check on transformers' assisted generation, at 20 calls of the position-law
    check (below the power ceiling, allowed explicitly); ``quick`` runs in the slow test below."""
    report = audit("hf-transformers", level="decoder", budget=20, allow_underpowered=True)
    assert report.exit_code == EXIT_PASS, report.explain()


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize(("target", "budget"), [("hf-transformers", "quick"), ("hf-transformers", "standard"),
                                               ("hf-transformers-prompt-lookup", "quick"),
                                               ("hf-transformers-prompt-lookup", "standard")])
def test_decoder_audit_of_transformers(target, budget):
    report = audit(target, level="decoder", budget=budget)
    assert report.exit_code == EXIT_PASS, report.explain()
