"""Losslessness on CUDA tensors: the reference rules and the reference decoder (``-m gpu``).

Two sampled checks, each a Pearson goodness-of-fit test at α = 1e-4 (measured level of Pearson's
X² at this α: up to 1.5 × α, see ``specverify.core.stats.goodness_of_fit``); with the 12 CUDA cases
below the family-wise false-positive rate stays under 2e-3.

1. Rules (``specverify.core.rules`` on ``device="cuda"``, float64/32/16 and bfloat16 inputs): one step
   with K = 2 drafts over V = 4 tokens.  The step's emitted tokens, completed to K + 1 tokens by
   sampling from the target (Leviathan et al. 2023, Theorem 1: lossless ⇔ the completed tuple is
   distributed as target sampling), are compared with the product law p_0 ⊗ p_1 ⊗ p_2 on 64 cells.
   The probabilities are multiples of 1/32, exact in every dtype, so the law is the same for all.
   Sample size: ``sample_size_for_tv(0.02, α, power=0.99, cells=64)`` rows; every deviation of
   total variation ≥ 0.02 is detected with probability ≥ 0.99.  Known-buggy catalog rules, whose
   exact total variation from the target law (``specverify.core.exact``) is asserted to exceed 0.02,
   must be caught.
2. Decoder (``reference.decoder.speculative_generate`` on CUDA with ``specverify.hf.tiny_models``):
   the first two sampled tokens of many identical requests in one batch against their exact law
   (``continuation_distribution``, 144 cells), ε = 0.05 with power 0.99; a decoder whose rule
   draws the correction from p instead of (p − q)+ must be caught.

Runtime on one GPU: a few seconds per case.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import reference.decoder
from reference.drafters import EarlyExitDrafter, ModelDrafter, PromptLookupDrafter
from specverify.auditing.sampler.catalog import CATALOG
from specverify.core import exact, rules, stats
from specverify.core.chains import PositionalChain
from specverify.core.rules import VerifyResult
from specverify.core.seeding import derive_seed
from specverify.hf import packaged as models
from specverify.hf.tiny_models import continuation_distribution, tiny_target_and_draft

pytestmark = [pytest.mark.gpu, pytest.mark.statistical]

ALPHA = 1e-4
POWER = 0.99
P = np.array([[12, 8, 8, 4], [4, 4, 8, 16], [16, 4, 4, 8]]) / 32  # target laws at positions 0, 1, 2 (bonus)
Q = np.array([[4, 12, 8, 8], [8, 8, 8, 8]]) / 32  # draft laws at positions 0, 1
K, V = Q.shape
RULE_EPSILON = 0.02
RULE_ROWS = stats.sample_size_for_tv(RULE_EPSILON, alpha=ALPHA, power=POWER, num_cells=V ** (K + 1))


def cuda() -> str:
    return models.resolve_device("cuda")


def completed_step_counts(rule, dtype: torch.dtype, seed: int) -> np.ndarray:
    """Run ``rule`` on RULE_ROWS copies of the step on CUDA; counts of the completed K+1-tuples."""
    device = cuda()
    generator = torch.Generator(device=device).manual_seed(seed)
    p = torch.tensor(P, dtype=dtype, device=device).expand(RULE_ROWS, -1, -1)
    q = torch.tensor(Q, dtype=dtype, device=device).expand(RULE_ROWS, -1, -1)
    draws = [torch.multinomial(torch.tensor(law, dtype=torch.float32, device=device).expand(RULE_ROWS, -1).contiguous(),
                               1, replacement=True, generator=generator) for law in (*Q, *P)]
    drafts = torch.cat(draws[:K], dim=1)
    emitted = rule(p, q, drafts, generator)
    emitted = emitted.emitted if isinstance(emitted, VerifyResult) else emitted
    assert emitted.device.type == torch.device(device).type and emitted.shape == (RULE_ROWS, K + 1)
    # Positions after the emitted tokens are filled from the target: P is positional (context-free).
    completed = torch.where(emitted >= 0, emitted, torch.cat(draws[K:], dim=1))
    codes = (completed * torch.tensor([V * V, V, 1], device=device)).sum(1)
    return torch.bincount(codes, minlength=V ** (K + 1)).cpu().numpy()


TARGET_LAW = np.einsum("a,b,c->abc", *P).reshape(-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rule", [rules.verify, rules.point_mass_as_verify], ids=lambda r: r.__name__)
def test_reference_rule_is_lossless_on_cuda(rule, dtype):
    counts = completed_step_counts(rule, dtype, derive_seed("cuda-rule", rule.__name__, str(dtype)))
    result = stats.goodness_of_fit(counts, TARGET_LAW)
    assert result.pvalue > ALPHA, f"{rule.__name__} on CUDA {dtype}: {result}"


@pytest.mark.parametrize("name", ["residual_is_target", "bonus_from_draft"])
def test_rule_check_catches_catalog_bugs_on_cuda(name):
    chain = PositionalChain(P, Q)
    law = exact.completed_step_distribution(exact.step_distribution(CATALOG[name].fn, chain, K), chain, K)
    tv = exact.total_variation(law, exact.target_sequence_distribution(chain, K + 1))
    assert tv >= RULE_EPSILON, f"{name}: exact TV {tv:.4f} is below the detectable {RULE_EPSILON}"
    counts = completed_step_counts(CATALOG[name].fn, torch.float32, derive_seed("cuda-rule-bug", name))
    result = stats.goodness_of_fit(counts, TARGET_LAW)
    assert result.pvalue <= ALPHA, f"{name} (exact TV {tv:.4f}) was not caught on CUDA: {result}"


# --- the decoder, sequence level --------------------------------------------------------------

DECODER_EPSILON = 0.05
LENGTH = 2
TINY_VOCAB = 12
DECODER_ROWS = stats.sample_size_for_tv(DECODER_EPSILON, alpha=ALPHA, power=POWER, num_cells=TINY_VOCAB**LENGTH)
PROMPT = [3, 7, 3, 7, 3]  # repeats, so prompt lookup proposes drafts
DECODER_CASES = {  # drafter, sampling settings
    "draft-model": ("model", dict(temperature=1.0)),
    "early-exit": ("early-exit", dict(temperature=0.8, top_k=6)),
    "prompt-lookup": ("prompt-lookup", dict(temperature=1.0, top_p=0.9)),
}


def sample_decoder(drafter_kind: str, settings: dict, seed: int) -> tuple[np.ndarray, dict]:
    """Counts of the first LENGTH tokens of DECODER_ROWS identical requests on CUDA, and their exact law."""
    target, draft = tiny_target_and_draft(vocab_size=TINY_VOCAB)
    law = continuation_distribution(target, PROMPT, LENGTH, **settings)
    target, draft = target.to(cuda()), draft.to(cuda())
    drafter = {"model": lambda: ModelDrafter(draft), "early-exit": lambda: EarlyExitDrafter(target, 1),
               "prompt-lookup": PromptLookupDrafter}[drafter_kind]()
    prompts = torch.tensor(PROMPT, device=cuda()).expand(DECODER_ROWS, -1)
    tokens = reference.decoder.speculative_generate(
        target, drafter, prompts, max_new_tokens=LENGTH, gamma=2, seed=seed, **settings
    ).tokens.cpu()
    codes = tokens[:, 0] * TINY_VOCAB + tokens[:, 1]
    counts = torch.bincount(codes, minlength=TINY_VOCAB**LENGTH).numpy()
    expected = np.array([law[(a, b)] for a in range(TINY_VOCAB) for b in range(TINY_VOCAB)])
    return counts, expected


@pytest.mark.parametrize("case", list(DECODER_CASES))
def test_reference_decoder_sequence_law_on_cuda(case):
    drafter_kind, settings = DECODER_CASES[case]
    counts, expected = sample_decoder(drafter_kind, settings, derive_seed("cuda-decoder", case))
    result = stats.goodness_of_fit(counts, expected)
    assert result.pvalue > ALPHA, f"reference decoder ({case}) on CUDA: {result}"


def test_decoder_check_catches_a_wrong_residual_on_cuda(monkeypatch):
    buggy = CATALOG["residual_is_target"].fn

    def buggy_rejection_sample(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None,
                               num_draft=None):
        """The catalog entry on the rows with n >= 1 drafts (their first n columns, their uniforms at
        columns 0..n-1 and K); a row with no draft (one token left) is a plain draw, the correct rule's."""
        emitted = rules.rejection_sample(target_probs, draft_probs, draft_tokens, uniforms=uniforms,
                                         num_draft=num_draft).emitted.clone()
        width = draft_tokens.shape[1]
        for n in set(num_draft.tolist()) - {0}:
            rows = num_draft == n
            step = buggy(target_probs[rows][:, : n + 1], draft_probs[rows][:, :n], draft_tokens[rows][:, :n],
                         uniforms=uniforms[rows][:, list(range(n)) + [width]])
            emitted[rows] = torch.cat([step, step.new_full((step.shape[0], width - n), -1)], 1)
        return VerifyResult(emitted, (emitted >= 0).sum(1) - 1)

    monkeypatch.setattr(reference.decoder, "rejection_sample", buggy_rejection_sample)
    counts, expected = sample_decoder("model", dict(temperature=1.0), derive_seed("cuda-decoder-bug"))
    result = stats.goodness_of_fit(counts, expected)
    assert result.pvalue <= ALPHA, f"a decoder drawing corrections from p was not caught: {result}"
