"""The engine adapters (specverify.engines) are faithful: each passes the engine exactly the inputs
the rule needs, in the engine's layout, and reads its output back; checked against specverify's
own rules on identical inputs (no sampling).  Each test skips, with the install command, when its
engine is not installed.  The engines' audits themselves are in test_engine_audits.py (`-m engines`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specverify.auditing.runner import audit
from specverify.core.rules import greedy_verify
from specverify.core.rules import verify as reference_verify
from specverify.core.sampling import inverse_cdf
from specverify.core.seeding import derive_seed
from specverify.engines import AUDIT_PLANS, AUDITED_VERSIONS, audit_command
from specverify.engines.environment import (
    INSTALL_HINTS,
    gumbel_perturbed_logits,
    installed_version,
    require_engine,
    target_draws,
    with_greedy_rows_perturbed,
)


def engine_module(engine: str):
    """The adapter module of ``engine``, or a skip naming what to install."""
    version = installed_version(engine)
    if version is None:
        pytest.skip(f"{engine} is not installed ({INSTALL_HINTS[engine]})")
    if version != AUDITED_VERSIONS[engine]:
        pytest.skip(f"{engine} {version} is installed; the adapters are written for {AUDITED_VERSIONS[engine]}")
    return pytest.importorskip(f"specverify.engines.{engine}_engine")


def step_inputs(name: str, batch: int = 16, num_draft: int = 3, vocab: int = 7):
    """A step with zeros on both sides (the target forbids some draft tokens), drafts drawn from q."""
    rng = np.random.default_rng(derive_seed("engine-adapters", name))
    p = rng.dirichlet(np.ones(vocab), size=(batch, num_draft + 1)) * (rng.random((batch, num_draft + 1, vocab)) > 0.2)
    p[..., 0] += 1e-3
    q = rng.dirichlet(np.ones(vocab), size=(batch, num_draft)) * (rng.random((batch, num_draft, vocab)) > 0.2)
    q[..., 1] += 1e-3
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    target, draft = torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=torch.Generator().manual_seed(1)).reshape(
        batch, num_draft)
    return target, draft, tokens


def test_require_engine_names_the_install_command():
    with pytest.raises(ModuleNotFoundError, match="pip install"):
        require_engine("not-an-engine-distribution")


def test_every_plan_is_a_builtin_and_prints_a_command():
    from specverify.auditing.loading import BUILTINS

    for plan in AUDIT_PLANS:
        assert plan.target in BUILTINS[plan.level], plan.target
        assert audit_command(plan).startswith(f"specverify audit {plan.target} ")
        assert plan.engine in AUDITED_VERSIONS


def test_sglang_chain_kernel_equals_the_reference_rule_on_the_same_uniforms():
    """The classic chain kernel follows SPEC §1's uniform convention: on float32-representable
    uniforms it emits exactly what the reference rule emits."""
    sglang = engine_module("sglang")
    target, draft, tokens = step_inputs("sglang-chain")
    uniforms = torch.rand(tokens.shape[0], tokens.shape[1] + 1, generator=torch.Generator().manual_seed(2))
    uniforms = uniforms.double()  # float32 values: the kernel's coins are exactly these
    got = sglang.verify_chain_triton(target, draft, tokens, None, uniforms=uniforms)
    expected = reference_verify(target.double(), draft.double(), tokens, None, uniforms=uniforms)
    assert torch.equal(got, expected)


def test_greedy_path_equals_greedy_verification_of_the_perturbed_logits():
    """vLLM's greedy target hands the engine logits whose argmax is a target draw; its output equals
    specverify's greedy rule on the same logits (the Gumbel noise replayed from the same seed)."""
    vllm = engine_module("vllm")
    target, draft, tokens = step_inputs("greedy-vllm")
    got = vllm.verify_greedy(target, draft, tokens, torch.Generator().manual_seed(3))
    logits = gumbel_perturbed_logits(target, torch.Generator().manual_seed(3))
    assert torch.equal(got, greedy_verify(logits, tokens, validate=False).emitted)


@pytest.mark.parametrize("engine", ["sglang", "lmdeploy"])
def test_greedy_paths_equal_greedy_verification_of_the_target_draws(engine):
    """SGLang's and lmdeploy's greedy rules take the target's token ids: their output equals
    specverify's greedy rule on logits whose argmax is the same draws (replayed from the same seed)."""
    module = engine_module(engine)
    target, draft, tokens = step_inputs(f"greedy-{engine}")
    got = module.verify_greedy(target, draft, tokens, torch.Generator().manual_seed(3))
    draws = target_draws(target, torch.Generator().manual_seed(3))
    one_hot = torch.nn.functional.one_hot(draws, target.shape[-1]).double()
    assert torch.equal(got, greedy_verify(one_hot, tokens, validate=False).emitted)


def test_target_draws_follow_the_target_law():
    """Each position's draws are the inverse-CDF draws of core.sampling from one uniform per position."""
    probs = torch.softmax(torch.randn(3, 2, 7, generator=torch.Generator().manual_seed(5)), -1)
    draws = target_draws(probs, torch.Generator().manual_seed(1))
    uniforms = torch.rand(6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.equal(draws, inverse_cdf(probs.reshape(6, 7), uniforms).view(3, 2))


def test_only_the_greedy_rows_are_perturbed():
    """A mixed batch draws Gumbel noise for its greedy rows only; the other rows keep their logits."""
    probs = torch.softmax(torch.randn(4, 2, 5, generator=torch.Generator().manual_seed(6)), -1)
    logits = torch.log(probs)
    greedy = torch.tensor([True, False, True, False])
    got = with_greedy_rows_perturbed(logits, probs, greedy, torch.Generator().manual_seed(2))
    assert torch.equal(got[~greedy], logits[~greedy])
    assert torch.equal(got[greedy], gumbel_perturbed_logits(probs[greedy], torch.Generator().manual_seed(2)))


def test_vllm_ragged_rows_reach_its_flattened_layout():
    """With num_draft_tokens= (docs/spec.md §1) the vLLM targets pass each row's k_b drafts and k_b + 1
    target rows only: the greedy path equals specverify's greedy rule on the same ragged rows."""
    vllm = engine_module("vllm")
    target, draft, tokens = step_inputs("ragged-vllm")
    counts = torch.tensor([0, 3, 1, 2] * 4)
    got = vllm.verify_greedy(target, draft, tokens, torch.Generator().manual_seed(3), num_draft_tokens=counts)
    logits = gumbel_perturbed_logits(target, torch.Generator().manual_seed(3))
    assert torch.equal(got, greedy_verify(logits, tokens, num_draft=counts, validate=False).emitted)


def test_vllm_metadata_is_gpu_model_runner_s():
    """The worked example in GPUModelRunner._calc_spec_decode_metadata (each request scheduled its
    drafts plus one token): drafts [3, 0, 2, 0, 1]."""
    vllm = engine_module("vllm")
    metadata = vllm.spec_decode_metadata(torch.arange(6), [3, 0, 2, 0, 1])
    assert metadata.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]
    assert metadata.cu_num_sampled_tokens.tolist() == [4, 5, 8, 9, 11]
    assert metadata.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert metadata.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
    assert metadata.max_spec_len == 3 and metadata.draft_token_ids.dtype == torch.int32


def test_lmdeploy_leaves_the_global_rng_as_it_was():
    lmdeploy = engine_module("lmdeploy")
    target, draft, tokens = step_inputs("lmdeploy-rng")
    torch.manual_seed(5)
    before = torch.get_rng_state()
    first = lmdeploy.verify(target, draft, tokens, torch.Generator().manual_seed(4))
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(first, lmdeploy.verify(target, draft, tokens, torch.Generator().manual_seed(4)))


def _lmdeploy_greedy_on_the_argmax(target_probs, draft_probs, draft_tokens, generator):
    """lmdeploy's greedy path on the plain argmax, not on draws from the target: greedy verification
    of sampled requests (lossy)."""
    from specverify.engines.lmdeploy_engine import _IMPL

    return _IMPL.forward_greedy(target_probs.argmax(-1), draft_tokens.contiguous())[0].long()


def test_the_greedy_audits_can_fail():
    """On the target's argmax instead of its draws the same engine path is greedy decoding of
    sampled requests, and the checks the greedy targets get catch it."""
    engine_module("lmdeploy")
    report = audit(_lmdeploy_greedy_on_the_argmax, budget="quick", checks=["step-K2", "bonus-position"],
                   isolation="none")
    assert report.exit_code == 1, report.explain()
