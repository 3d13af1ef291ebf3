"""Proof that the faster ``rejection_sample`` is bit-identical to the rule it replaced.

The rule reads two length-V rows per request in cache-sized chunks and screens its inputs with
one cheap pass per tensor.  This file compares the frozen copy of the rule and of its
validator as they were at commit ffae46c (``benchmarks/legacy_rules.py``) with the new rule on
many random inputs: shapes up to V = 128k, ragged ``num_draft``, fp32/bf16/fp16/fp64, exact zeros,
one-hot rows, the rounding fallback, subnormal masses, injected uniforms (random and at the
acceptance edges ``u = p/q``) and generators (the same single ``torch.rand`` draw).  Outputs must be
equal tensors, and corrupted inputs must raise the same ``ValueError`` message.

The main comparisons run on both paths of the rule (the ``rule_path`` fixture): the fused native
kernel (``specverify.core.native_rules``, taken for contiguous CPU float32/bfloat16 inputs) and the
torch code (``SPECVERIFY_NATIVE=0``); the tests of the torch code's internal paths (chunk sizes)
run on the torch path.  tests/core/test_native_rules.py checks that the native path is taken.
"""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import legacy_rules
from specverify.core import native_rules, rules
from specverify.core.rules import VerifyResult, rejection_sample
from specverify.core.seeding import derive_seed

# The frozen copy of the rule at ffae46c is benchmarks/legacy_rules.py, which the benchmark also
# times side by side with the new rule: one copy, the baseline of both.
_frozen_rejection_sample = legacy_rules.rejection_sample


@pytest.fixture(params=["native", "torch"])
def rule_path(request, monkeypatch):
    """Run the test on the native kernel or on the torch code of the rule.  On the native path,
    the tests of float32/bfloat16 tokens must have taken it (so that they cannot pass vacuously)."""
    if request.param == "torch":
        monkeypatch.setenv("SPECVERIFY_NATIVE", "0")
        yield request.param
        return
    if not native_rules.enabled():
        pytest.skip("no C compiler: the native kernel cannot be built")
    taken = []
    original = native_rules.verify
    monkeypatch.setattr(native_rules, "verify", lambda *a, **k: taken.append(original(*a, **k)) or taken[-1])
    yield request.param
    params = getattr(request.node, "callspec", None)
    dtype = params.params.get("dtype") if params else None
    if dtype in (torch.float32, torch.bfloat16) and request.node.originalname.startswith("test_same_tokens"):
        assert any(result is not None for result in taken), "the native path was never taken"


@pytest.fixture
def torch_path(monkeypatch):
    """Run the test on the torch code of the rule (its internal paths are what it tests)."""
    monkeypatch.setenv("SPECVERIFY_NATIVE", "0")


# --------------------------------------------------------------------------------------------
# Random inputs
# --------------------------------------------------------------------------------------------

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def random_rows(gen: torch.Generator, shape: tuple[int, ...], zero_fraction: float,
                one_hot_fraction: float) -> torch.Tensor:
    """Float64 probability rows: peaked softmaxes, some entries exactly 0, some rows one-hot."""
    logits = 3.0 * torch.randn(shape, generator=gen, dtype=torch.float64)
    probs = torch.softmax(logits, -1)
    if zero_fraction:
        probs = probs * (torch.rand(shape, generator=gen, dtype=torch.float64) >= zero_fraction)
        empty = probs.sum(-1) == 0
        probs[..., 0] += empty
    if one_hot_fraction:
        hot = torch.rand(shape[:-1], generator=gen, dtype=torch.float64) < one_hot_fraction
        one_hot = torch.nn.functional.one_hot(probs.argmax(-1), shape[-1]).to(torch.float64)
        probs = torch.where(hot[..., None], one_hot, probs)
    return probs / probs.sum(-1, keepdim=True)


def random_case(seed: int, batch: int, num_draft_tokens: int, vocab: int, dtype: torch.dtype, ragged: bool):
    """``(target_probs, draft_probs, draft_tokens, uniforms, num_draft)`` with draft tokens drawn from
    the draft rows as cast to ``dtype`` (so every draft token has positive draft probability).
    A quarter of the requests draft from the target itself (high acceptance), and one row in eight
    copies its draft row into the target at position 0 scaled by (1 - 1e-9), which rejects by
    rounding with a residual of no mass (the rule's fallback)."""
    gen = torch.Generator().manual_seed(seed)
    zeros = float(torch.rand((), generator=gen)) * 0.5
    hot = float(torch.rand((), generator=gen)) * 0.3
    p = random_rows(gen, (batch, num_draft_tokens + 1, vocab), zeros, hot)
    q = random_rows(gen, (batch, num_draft_tokens, vocab), zeros, hot)
    same = torch.rand(batch, generator=gen) < 0.25
    q = torch.where(same[:, None, None], p[:, :-1], q)
    near = torch.rand(batch, generator=gen) < 0.125
    p[near, 0] = q[near, 0] * (1 - 1e-9)
    p_cast, q_cast = p.to(dtype), q.to(dtype)
    drafts = torch.multinomial(q_cast.double().reshape(-1, vocab), 1, generator=gen).reshape(batch, num_draft_tokens)
    u = torch.rand(batch, num_draft_tokens + 1, generator=gen, dtype=torch.float64)
    edge = torch.rand(batch, num_draft_tokens, generator=gen) < 0.2  # u_i = p/q exactly: the accept boundary
    p_at = p_cast.double()[:, :-1].gather(-1, drafts[..., None]).squeeze(-1)
    q_at = q_cast.double().gather(-1, drafts[..., None]).squeeze(-1)
    ratio = (p_at / q_at).clamp(max=math.nextafter(1.0, 0.0))
    u[:, :-1] = torch.where(edge, ratio, u[:, :-1])
    u[near, 0] = math.nextafter(1.0, 0.0)  # rejects the near-copy of q (in float64): the fallback
    num_draft = torch.randint(0, num_draft_tokens + 1, (batch,), generator=gen) if ragged else None
    if ragged:  # padding beyond num_draft: -1 tokens and zero rows, which both rules must ignore
        pad = torch.arange(num_draft_tokens) >= num_draft[:, None]
        drafts = torch.where(pad, -1, drafts)
        q_cast = torch.where(pad[..., None], torch.zeros((), dtype=dtype), q_cast)
    return p_cast, q_cast, drafts, u, num_draft


def outcome(rule, *args, **kwargs):
    """The rule's result, or the text of the ValueError it raised."""
    try:
        result = rule(*args, **kwargs)
    except ValueError as error:
        return str(error)
    assert isinstance(result, VerifyResult)
    return result


def assert_same(old, new):
    if isinstance(old, str) or isinstance(new, str):
        assert old == new
        return
    assert torch.equal(old.emitted, new.emitted), (old.emitted, new.emitted)
    assert torch.equal(old.num_accepted, new.num_accepted)


def compare(p, q, drafts, u, num_draft, validate=True):
    old = outcome(_frozen_rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft, validate=validate)
    new = outcome(rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft, validate=validate)
    assert_same(old, new)
    return new


# (batch, K, V): small and odd vocabularies, several chunks per call (V = 32k: 4 rows a chunk), 128k.
SHAPES = [(1, 1, 1), (1, 1, 2), (3, 2, 3), (5, 4, 7), (2, 8, 32), (17, 3, 50), (64, 8, 32), (9, 1, 1000),
          (33, 5, 257), (9, 2, 32_768), (6, 4, 32_768)]
LARGE_SHAPES = [(3, 2, 131_072), (1, 8, 131_072)]


@pytest.mark.usefixtures("rule_path")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("ragged", [False, True], ids=["full", "ragged"])
def test_same_tokens_as_the_frozen_rule_under_the_same_uniforms(shape, dtype, ragged):
    for repeat in range(1 if shape[-1] >= 32_768 else 3):
        seed = derive_seed("rules-identity", shape, str(dtype), ragged, repeat)
        case = random_case(seed, *shape, dtype, ragged)
        compare(*case)
        compare(*case, validate=False)


@pytest.mark.usefixtures("rule_path")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=str)
def test_same_tokens_at_128k(shape, dtype):
    case = random_case(derive_seed("rules-identity-128k", shape, str(dtype)), *shape, dtype, ragged=True)
    compare(*case)


@pytest.mark.usefixtures("rule_path")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_same_tokens_under_the_same_generator(dtype):
    """The generator path draws the same single ``torch.rand(B, K+1, float64)``: equal outputs, and
    the generators end in the same state."""
    for batch, num_draft_tokens, vocab in [(1, 1, 5), (8, 4, 1000), (64, 8, 64), (5, 3, 32_768)]:
        p, q, drafts, _, num_draft = random_case(derive_seed("rules-identity-gen", batch, str(dtype)),
                                                 batch, num_draft_tokens, vocab, dtype, ragged=True)
        for seed in range(3):
            old_gen, new_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            old = _frozen_rejection_sample(p, q, drafts, old_gen, num_draft=num_draft)
            new = rejection_sample(p, q, drafts, new_gen, num_draft=num_draft)
            assert_same(old, new)
            assert torch.equal(old_gen.get_state(), new_gen.get_state())


@pytest.mark.usefixtures("torch_path")
def test_chunking_does_not_change_tokens(monkeypatch):
    """One row per chunk, and a chunk size that does not divide the batch, give the same tokens."""
    case = random_case(derive_seed("rules-identity-chunks"), 23, 4, 300, torch.float32, ragged=True)
    reference = compare(*case)
    for elements in (1, 300, 7 * 300 + 5):
        monkeypatch.setattr(rules, "FINAL_ROWS_CHUNK_ELEMENTS", elements)
        assert_same(reference, compare(*case))


@pytest.mark.usefixtures("rule_path")
def test_all_zero_uniforms_and_uniforms_just_below_one():
    for u_value in (0.0, math.nextafter(1.0, 0.0)):
        p, q, drafts, u, num_draft = random_case(derive_seed("rules-identity-extreme-u"), 12, 3, 40, torch.float32,
                                                 True)
        compare(p, q, drafts, torch.full_like(u, u_value), num_draft)


@pytest.mark.usefixtures("rule_path")
def test_rounding_fallback_and_subnormal_residuals():
    """Residual with no mass (p = (1 - 1e-9) q in float64 rejects by rounding) and residual masses
    of ~1e-320 (subnormal), mixed with ordinary rows in one batch."""
    vocab = 6
    q = torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0]], dtype=torch.float64)
    rows = [q * (1 - 1e-9), q, torch.tensor([[0.5 - 1e-320, 0.25, 0.125, 0.0625, 0.0625, 1e-320]], dtype=torch.float64)]
    p = torch.stack([torch.cat([row, torch.full((1, vocab), 1 / vocab, dtype=torch.float64)]) for row in rows])
    q_batch = q.expand(3, 1, vocab).clone()
    drafts = torch.zeros(3, 1, dtype=torch.int64)
    for u0 in (0.0, 0.5, math.nextafter(1.0, 0.0)):
        for u1 in (0.0, 0.3, 0.999999):
            result = compare(p, q_batch, drafts, torch.tensor([[u0, u1]] * 3, dtype=torch.float64), None)
            if u0 > 1 - 1e-9:  # row 0 rejected by rounding: its token comes from the fallback p_0
                assert int(result.num_accepted[0]) == 0


# --------------------------------------------------------------------------------------------
# Validation: the same error (message and first index) for corrupted inputs, nothing for valid ones
# --------------------------------------------------------------------------------------------


def _corruptions(p, q, drafts, u, num_draft):
    """(name, inputs) pairs, each breaking one property the validator checks (or none: -0.0)."""
    batch, positions, vocab = p.shape
    nan = torch.tensor(math.nan, dtype=p.dtype)

    def with_entry(tensor, index, value):
        tensor = tensor.clone()
        tensor[index] = value
        return tensor

    last = (batch - 1, positions - 1, vocab - 1)
    yield "target NaN", (with_entry(p, last, nan), q, drafts, u, num_draft)
    yield "target Inf", (with_entry(p, (0, 0, 0), math.inf), q, drafts, u, num_draft)
    yield "draft NaN", (with_entry(q, (batch - 1, 0, 0), nan), q, drafts, u, num_draft)
    yield "target negative", (with_entry(p, (0, 0, vocab - 1), -1e-30), q, drafts, u, num_draft)
    yield "draft negative", (with_entry(q, (0, 0, vocab - 1), -1e-3), q, drafts, u, num_draft)
    yield "minus zero (valid)", (with_entry(p, last, -0.0) if float(p[last]) == 0 else p, q, drafts, u, num_draft)
    yield "target scaled", (p * 1.5, q, drafts, u, num_draft)
    yield "draft scaled", (p, q * 0.5, drafts, u, num_draft)
    yield "token too large", (p, q, with_entry(drafts, (0, 0), vocab), u, num_draft)
    yield "token negative", (p, q, with_entry(drafts, (batch - 1, 0), -1), u, num_draft)
    yield "draft probability 0", (p, with_entry(q, (0, 0, int(drafts[0, 0].clamp(min=0))), 0.0), drafts, u, num_draft)
    yield "uniform 1", (p, q, drafts, with_entry(u, (0, -1), 1.0), num_draft)
    yield "uniform NaN", (p, q, drafts, with_entry(u, (batch - 1, 0), math.nan), num_draft)
    if num_draft is not None:
        yield "num_draft too large", (p, q, drafts, u, with_entry(num_draft, 0, positions))
        yield "num_draft negative", (p, q, drafts, u, with_entry(num_draft, batch - 1, -1))


@pytest.mark.usefixtures("rule_path")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ragged", [False, True], ids=["full", "ragged"])
def test_same_validation_errors_as_the_frozen_validator(dtype, ragged):
    for shape in [(1, 1, 3), (4, 3, 50), (3, 2, 4096)]:
        case = random_case(derive_seed("rules-identity-validation", shape, str(dtype), ragged), *shape, dtype, ragged)
        for name, corrupted in _corruptions(*case):
            p, q, drafts, u, num_draft = corrupted
            old = outcome(_frozen_rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft)
            new = outcome(rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft)
            assert_same(old, new), name


def test_screen_flags_minus_zero_but_the_detailed_check_accepts_it():
    """-0.0 sets the sign bit: the screen sends the inputs to the detailed checks, which pass them."""
    p = torch.tensor([[[0.5, 0.5, -0.0], [0.5, 0.5, 0.0]]])
    q = torch.tensor([[[0.5, 0.5, 0.0]]])
    drafts = torch.tensor([[1]])
    assert rules._any_problem(p, q, drafts, None, None)
    rules.validate_verify_inputs(p, q, drafts, torch.Generator())


@pytest.mark.usefixtures("rule_path")
def test_non_contiguous_inputs():
    """Inputs that are slices of larger tensors (advanced-indexing path of the row gather)."""
    p, q, drafts, u, num_draft = random_case(derive_seed("rules-identity-strided"), 6, 3, 200, torch.float32, True)
    wide_p = torch.cat([p, p], dim=1)[:, :4]  # the same values; first two dims not flattenable
    wide_q = torch.cat([q, q], dim=1)[:, :3]
    assert not wide_p.is_contiguous() and wide_p.stride(0) != 4 * wide_p.stride(1)
    assert_same(compare(p, q, drafts, u, num_draft), compare(wide_p, wide_q, drafts, u, num_draft))
    compare(p.transpose(0, 1).contiguous().transpose(0, 1), q, drafts, u, num_draft)


@pytest.mark.gpu
def test_cuda_same_tokens_as_the_frozen_rule_on_cpu():
    for shape in [(64, 8, 32_768), (5, 3, 1000)]:
        p, q, drafts, u, num_draft = random_case(derive_seed("rules-identity-cuda", shape), *shape, torch.float32, True)
        old = _frozen_rejection_sample(p, q, drafts, uniforms=u, num_draft=num_draft)
        new = rejection_sample(p.cuda(), q.cuda(), drafts.cuda(), uniforms=u.cuda(), num_draft=num_draft.cuda())
        assert torch.equal(old.emitted, new.emitted.cpu())


# --------------------------------------------------------------------------------------------
# Every code path of the new rule: the final draw by chunk gathers (small V) and row by row (large
# V), and the validation screen over the whole tensor and in cache-sized chunks
# --------------------------------------------------------------------------------------------

PATHS = {
    "default": {},
    "row-by-row final draw, one row a chunk": {"ROW_BY_ROW_MIN_VOCAB": 1, "FINAL_ROWS_CHUNK_ELEMENTS": 1},
    "row-by-row final draw, uneven chunks": {"ROW_BY_ROW_MIN_VOCAB": 1, "FINAL_ROWS_CHUNK_ELEMENTS": 3 * 50 + 7},
    "gathered final draw at every V": {"ROW_BY_ROW_MIN_VOCAB": 1 << 40},
    "chunked screen, one row a chunk": {"SCREEN_CHUNK_BYTES": 1},
    "chunked screen, uneven chunks": {"SCREEN_CHUNK_BYTES": 5 * 50 * 2 + 3},
}


@pytest.mark.usefixtures("torch_path")
@pytest.mark.parametrize("path", PATHS, ids=list(PATHS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_path_gives_the_frozen_rule_tokens(path, dtype, monkeypatch):
    for name, value in PATHS[path].items():
        monkeypatch.setattr(rules, name, value)
    for shape in [(1, 1, 2), (5, 4, 7), (17, 3, 50), (64, 8, 32), (9, 2, 1000), (3, 2, 8192)]:
        for ragged in (False, True):
            case = random_case(derive_seed("rules-identity-paths", shape, str(dtype), ragged), *shape, dtype, ragged)
            compare(*case)
            compare(*case, validate=False)


@pytest.mark.usefixtures("torch_path")
@pytest.mark.parametrize("path", ["default", "chunked screen, one row a chunk", "chunked screen, uneven chunks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_screen_path_gives_the_frozen_validation_errors(path, dtype, monkeypatch):
    for name, value in PATHS[path].items():
        monkeypatch.setattr(rules, name, value)
    for ragged in (False, True):
        case = random_case(derive_seed("rules-identity-screen", str(dtype), ragged), 6, 3, 50, dtype, ragged)
        for label, corrupted in _corruptions(*case):
            p, q, drafts, u, num_draft = corrupted
            old = outcome(_frozen_rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft)
            new = outcome(rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft)
            assert_same(old, new), label


def test_chunked_screen_sums_equal_the_whole_tensor_sums(monkeypatch):
    """The chunked screen reduces every row whole, so its row flags equal the one-pass flags, also for
    rows whose sum lies right at the tolerance."""
    gen = torch.Generator().manual_seed(derive_seed("rules-identity-screen-sums"))
    for dtype in DTYPES:
        probs = torch.softmax(torch.randn(7, 5, 3000, generator=gen, dtype=torch.float64), -1)
        tolerance = rules.row_sum_tolerance(dtype, 3000)
        probs *= 1 + tolerance * torch.linspace(0.5, 1.5, 5, dtype=torch.float64)[None, :, None]
        probs = probs.to(dtype)
        whole = rules._rows_look_valid(probs)
        assert whole.any() and not whole.all()  # rows on both sides of the tolerance
        monkeypatch.setattr(rules, "SCREEN_CHUNK_BYTES", 3000 * dtype.itemsize * 2 + 1)
        assert torch.equal(rules._rows_look_valid(probs), whole)
        monkeypatch.undo()


# --------------------------------------------------------------------------------------------
# Validation rejects each kind of invalid input, on every screen path, naming the argument
# --------------------------------------------------------------------------------------------

INVALID = {
    "NaN": (math.nan, "contains NaN or Inf"),
    "+Inf": (math.inf, "contains NaN or Inf"),
    "-Inf": (-math.inf, "contains NaN or Inf"),
    "negative": (-1e-30, "contains negative entries"),
}


@pytest.mark.usefixtures("rule_path")
@pytest.mark.parametrize("path", ["default", "chunked screen, one row a chunk"])
@pytest.mark.parametrize("argument", ["target_probs", "draft_probs"])
@pytest.mark.parametrize("kind", list(INVALID) + ["not summing to 1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_validation_rejects_each_kind_of_invalid_value(path, argument, kind, dtype, monkeypatch):
    for name, value in PATHS[path].items():
        monkeypatch.setattr(rules, name, value)
    p, q, drafts, u, _ = random_case(derive_seed("rules-identity-invalid", str(dtype)), 8, 3, 40, dtype, False)
    tensor = (p if argument == "target_probs" else q).clone()
    if kind == "not summing to 1":
        tensor[3, 1] *= 2
        message = "a row does not sum to 1"
    else:
        value, message = INVALID[kind]
        tensor[3, 1, 39] = value
    p, q = (tensor, q) if argument == "target_probs" else (p, tensor)
    with pytest.raises(ValueError, match=f"^{argument}: {message}"):
        rejection_sample(p, q, drafts, uniforms=u)
    with pytest.raises(ValueError, match=f"^{argument}: {message}"):
        rules.validate_verify_inputs(p, q, drafts, uniforms=u)


@pytest.mark.usefixtures("rule_path")
@pytest.mark.parametrize("argument, change, message", [
    ("target_probs", lambda p, q, d: (p.double().long(), q, d), "expected a floating-point tensor"),
    ("target_probs", lambda p, q, d: (p[:, :1], q, d), "speculative verification needs K >= 1"),
    ("draft_probs", lambda p, q, d: (p, q[:, :-1], d), "positions but target_probs has"),
    ("draft_probs", lambda p, q, d: (p, q[..., :-1], d), "vocabulary size"),
    ("draft_tokens", lambda p, q, d: (p, q, d.int()), "expected dtype torch.int64"),
    ("draft_tokens", lambda p, q, d: (p, q, d[:, :-1]), "expected shape"),
])
def test_validation_rejects_wrong_dtypes_and_shapes(argument, change, message):
    p, q, drafts, u, _ = random_case(derive_seed("rules-identity-structure"), 4, 3, 40, torch.float32, False)
    with pytest.raises(ValueError, match=f"^{argument}: .*{message}"):
        rejection_sample(*change(p, q, drafts), uniforms=u)


def test_an_empty_batch_gives_empty_outputs_on_every_rule():
    """B = 0 (an engine's step with no requests) returns empty outputs, not an error."""
    from specverify.core.rules import greedy_verify, point_mass_verify, rejection_sample

    target, draft = torch.rand(0, 3, 5), torch.rand(0, 2, 5)
    tokens = torch.zeros(0, 2, dtype=torch.int64)
    for result in (rejection_sample(target, draft, tokens, generator=torch.Generator().manual_seed(0)),
                   point_mass_verify(target, tokens, generator=torch.Generator().manual_seed(0)),
                   greedy_verify(target, tokens)):
        assert result.emitted.shape == (0, 3) and result.num_accepted.shape == (0,)
