"""Every fast path of ``rejection_sample`` gives the tokens and the errors of its plain torch path.

The rule is defined once, by its torch code (``specverify.core.rules``).  The faster ways of
computing it must not change a single token:

- the fused C kernel (``specverify.core.native_rules``: contiguous CPU float32/bfloat16, float16
  widened, strided views copied), on unless ``SPECVERIFY_NATIVE=0``;
- the final rows gathered in cache-sized chunks of rows (``FINAL_ROWS_CHUNK_ELEMENTS``) or, from
  ``ROW_BY_ROW_MIN_VOCAB`` on, copied row by row into float64 buffers kept between calls;
- the validation screen reduced in cache-sized chunks (``SCREEN_CHUNK_BYTES``);
- CUDA (``pytest -m gpu``).

The plain path (:data:`PLAIN`) is the torch code with the kernel off, one gathered chunk of final
rows for the whole batch and the screen over whole tensors.  On random inputs (shapes up to
V = 128k, ragged ``num_draft``, fp64/fp32/bf16/fp16, exact zeros, one-hot rows, the rounding
fallback, subnormal residual masses, uniforms at the acceptance edge ``u = p/q``, at 0 and just
below 1) every path must return equal tensors under the same uniforms, and under the same
generator also leave it in the same state.  With validation, every path must raise the first
error of the detailed checks (``rules._raise_first_problem``, run unconditionally) or, when they
find none, return the tokens of the plain path without validation: the screen that lets valid
inputs skip the detailed checks must miss nothing they find.  Perturbed fast paths are shown to
fail these comparisons.

The plain path itself is held to the exact law (``specverify.core.exact``) by enumeration under
injected uniforms in tests/core/test_rules.py (``test_rejection_sample_is_exact_by_enumeration``,
the point-mass rule, the hand cases of the rounding fallback and of subnormal residuals) and
tests/core/test_exact.py (``test_step_distribution_of_specverify_rules_is_the_ideal_law``); its
float32/bfloat16/float16 outputs equal those of the float64 upcast
(``test_low_precision_inputs_match_their_float64_upcast``), and ragged rows those of truncated
rows (``test_ragged_rows_match_truncated_single_rows``).  tests/core/test_native_rules.py checks
the kernel's own pieces and mutants.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from specverify.core import native_rules, rules
from specverify.core.rules import VerifyResult, rejection_sample
from specverify.core.seeding import derive_seed

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
NATIVE_DTYPES = (torch.float32, torch.bfloat16)

# --------------------------------------------------------------------------------------------
# The paths: (native kernel on, settings of specverify.core.rules)
# --------------------------------------------------------------------------------------------

WHOLE = 1 << 62
"""A chunk size no input reaches: one chunk for the whole tensor."""

PLAIN = {"FINAL_ROWS_CHUNK_ELEMENTS": WHOLE, "ROW_BY_ROW_MIN_VOCAB": WHOLE, "SCREEN_CHUNK_BYTES": WHOLE}

PATHS = {
    "native kernel": (True, {}),
    "torch defaults": (False, {}),
    "gathered final rows, one row a chunk": (False, {"ROW_BY_ROW_MIN_VOCAB": WHOLE, "FINAL_ROWS_CHUNK_ELEMENTS": 1}),
    "gathered final rows, uneven chunks": (False, {"ROW_BY_ROW_MIN_VOCAB": WHOLE,
                                                   "FINAL_ROWS_CHUNK_ELEMENTS": 7 * 50 + 5}),
    "row-by-row final rows, one row a chunk": (False, {"ROW_BY_ROW_MIN_VOCAB": 1, "FINAL_ROWS_CHUNK_ELEMENTS": 1}),
    "row-by-row final rows, uneven chunks": (False, {"ROW_BY_ROW_MIN_VOCAB": 1,
                                                     "FINAL_ROWS_CHUNK_ELEMENTS": 3 * 50 + 7}),
    "chunked screen, one row a chunk": (False, {"SCREEN_CHUNK_BYTES": 1}),
    "chunked screen, uneven chunks": (False, {"SCREEN_CHUNK_BYTES": 5 * 50 * 2 + 3}),
}
SCREEN_PATHS = ["native kernel", "torch defaults", "chunked screen, one row a chunk", "chunked screen, uneven chunks"]


def outcome(rule, *args, **kwargs):
    """The rule's result, or the text of the ValueError it raised."""
    try:
        result = rule(*args, **kwargs)
    except ValueError as error:
        return str(error)
    assert isinstance(result, VerifyResult)
    return result


def assert_same(expected, actual):
    if isinstance(expected, str) or isinstance(actual, str):
        assert expected == actual
        return
    assert torch.equal(expected.emitted, actual.emitted), (expected.emitted, actual.emitted)
    assert torch.equal(expected.num_accepted, actual.num_accepted)


def on_path(path: str, rule, *args, **kwargs):
    """``outcome(rule, ...)`` on one path (a name of :data:`PATHS`, or ``"plain"``)."""
    native, settings = (False, PLAIN) if path == "plain" else PATHS[path]
    with pytest.MonkeyPatch.context() as patch, native_rules.path(native):
        for name, value in settings.items():
            patch.setattr(rules, name, value)
        return outcome(rule, *args, **kwargs)


def plain_outcome(p, q, drafts, u, num_draft):
    """What ``rejection_sample(..., validate=True)`` must give: the first error of the detailed
    checks, or the plain path's result without validation."""
    try:
        rules._check_structure(p, q, drafts, None, u, num_draft, True)
        rules._raise_first_problem(p, q, drafts, u, num_draft)
    except ValueError as error:
        return str(error)
    return on_path("plain", rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft, validate=False)


def compare(path, p, q, drafts, u, num_draft, *, valid=True):
    """Assert that ``path`` gives the plain outcome, with validation and (for valid inputs) without."""
    expected = plain_outcome(p, q, drafts, u, num_draft)
    assert_same(expected, on_path(path, rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft))
    if valid:
        assert not isinstance(expected, str), expected
        assert_same(expected, on_path(path, rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft,
                                      validate=False))
    return expected


@pytest.fixture
def kernel_calls(monkeypatch):
    """The kernel's outcomes during the test (``None``: it declined or flagged the inputs)."""
    taken: list = []
    original = native_rules.verify
    monkeypatch.setattr(native_rules, "verify", lambda *a, **k: taken.append(original(*a, **k)) or taken[-1])
    return taken


def skip_without_kernel(path: str) -> None:
    if PATHS[path][0] and not native_rules.enabled():
        pytest.skip("no C compiler: the native kernel cannot be built")


def assert_kernel_taken(path: str, dtype: torch.dtype, calls: list) -> None:
    """On the native path, float32/bfloat16 inputs must have run the kernel (no vacuous pass)."""
    if PATHS[path][0] and dtype in NATIVE_DTYPES:
        assert any(result is not None for result in calls), "the native path was never taken"


# --------------------------------------------------------------------------------------------
# Random inputs
# --------------------------------------------------------------------------------------------


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
    if ragged:  # padding beyond num_draft: -1 tokens and zero rows, which every path must ignore
        pad = torch.arange(num_draft_tokens) >= num_draft[:, None]
        drafts = torch.where(pad, -1, drafts)
        q_cast = torch.where(pad[..., None], torch.zeros((), dtype=dtype), q_cast)
    return p_cast, q_cast, drafts, u, num_draft


# (batch, K, V): small and odd vocabularies, several chunks per call, and V = 32k (row by row by default).
SHAPES = [(1, 1, 1), (3, 2, 3), (17, 3, 50), (64, 8, 32), (9, 2, 32_768)]
MORE_SHAPES = [(1, 1, 2), (5, 4, 7), (2, 8, 32), (9, 1, 1000), (33, 5, 257)]
LARGE_SHAPES = [(3, 2, 131_072), (1, 8, 131_072)]


# --------------------------------------------------------------------------------------------
# The same tokens on every path
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shapes", [
    pytest.param(SHAPES, id="shapes"),
    pytest.param(MORE_SHAPES, id="more-shapes", marks=pytest.mark.slow),
])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS, ids=list(PATHS))
def test_every_path_gives_the_plain_tokens_under_the_same_uniforms(path, dtype, shapes, kernel_calls):
    skip_without_kernel(path)
    for shape in shapes:
        for ragged in (False, True):
            seed = derive_seed("rules-identity", shape, str(dtype), ragged)
            compare(path, *random_case(seed, *shape, dtype, ragged))
    assert_kernel_taken(path, dtype, kernel_calls)


@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=str)
@pytest.mark.parametrize("path", ["native kernel", "torch defaults"])
def test_the_same_tokens_at_128k(path, shape, dtype, kernel_calls):
    """V = 128k: the kernel, and the torch code's row-by-row final rows, against one gathered chunk."""
    skip_without_kernel(path)
    compare(path, *random_case(derive_seed("rules-identity-128k", shape, str(dtype)), *shape, dtype, ragged=True))
    assert_kernel_taken(path, dtype, kernel_calls)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("path", ["native kernel", "torch defaults", "row-by-row final rows, one row a chunk"])
def test_the_same_tokens_and_generator_state_under_the_same_generator(path, dtype, kernel_calls):
    """Every path draws the same single ``torch.rand(B, K+1, float64)``: equal outputs, and the
    generators end in the same state."""
    skip_without_kernel(path)
    for batch, num_draft_tokens, vocab in [(1, 1, 5), (8, 4, 1000), (64, 8, 64), (5, 3, 32_768)]:
        p, q, drafts, _, num_draft = random_case(derive_seed("rules-identity-gen", batch, str(dtype)),
                                                 batch, num_draft_tokens, vocab, dtype, ragged=True)
        for seed in range(3):
            plain_gen, path_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            expected = on_path("plain", rejection_sample, p, q, drafts, plain_gen, num_draft=num_draft)
            assert_same(expected, on_path(path, rejection_sample, p, q, drafts, path_gen, num_draft=num_draft))
            assert torch.equal(plain_gen.get_state(), path_gen.get_state())
    assert_kernel_taken(path, dtype, kernel_calls)


@pytest.mark.parametrize("path", PATHS, ids=list(PATHS))
def test_all_zero_uniforms_and_uniforms_just_below_one(path):
    skip_without_kernel(path)
    for u_value in (0.0, math.nextafter(1.0, 0.0)):
        case = random_case(derive_seed("rules-identity-extreme-u"), 12, 3, 40, torch.float32, True)
        p, q, drafts, u, num_draft = case
        compare(path, p, q, drafts, torch.full_like(u, u_value), num_draft)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS, ids=list(PATHS))
def test_rounding_fallback_and_subnormal_residuals(path, dtype):
    """Residual with no mass (p = (1 - 1e-9) q in float64 rejects by rounding) and residual masses
    of ~1e-320 (subnormal in float64), mixed with ordinary rows in one batch."""
    skip_without_kernel(path)
    vocab = 6
    q = torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0]], dtype=torch.float64)
    rows = [q * (1 - 1e-9), q, torch.tensor([[0.5 - 1e-320, 0.25, 0.125, 0.0625, 0.0625, 1e-320]], dtype=torch.float64)]
    p = torch.stack([torch.cat([row, torch.full((1, vocab), 1 / vocab, dtype=torch.float64)]) for row in rows])
    p, q_batch = p.to(dtype), q.expand(3, 1, vocab).to(dtype).contiguous()
    drafts = torch.zeros(3, 1, dtype=torch.int64)
    for u0 in (0.0, 0.5, math.nextafter(1.0, 0.0)):
        for u1 in (0.0, 0.3, 0.999999):
            result = compare(path, p, q_batch, drafts, torch.tensor([[u0, u1]] * 3, dtype=torch.float64), None)
            if dtype == torch.float64 and u0 > 1 - 1e-9:  # row 0 rejected by rounding: the fallback p_0
                assert int(result.num_accepted[0]) == 0


@pytest.mark.parametrize("path", PATHS, ids=list(PATHS))
def test_non_contiguous_inputs(path):
    """Inputs that are slices of larger tensors (advanced-indexing path of the row gather; copied
    to contiguous tensors for the kernel)."""
    skip_without_kernel(path)
    p, q, drafts, u, num_draft = random_case(derive_seed("rules-identity-strided"), 6, 3, 200, torch.float32, True)
    wide_p = torch.cat([p, p], dim=1)[:, :4]  # the same values; first two dims not flattenable
    wide_q = torch.cat([q, q], dim=1)[:, :3]
    assert not wide_p.is_contiguous() and wide_p.stride(0) != 4 * wide_p.stride(1)
    assert_same(compare(path, p, q, drafts, u, num_draft), compare(path, wide_p, wide_q, drafts, u, num_draft))
    compare(path, p.transpose(0, 1).contiguous().transpose(0, 1), q, drafts, u, num_draft)


@pytest.mark.parametrize("path", PATHS, ids=list(PATHS))
def test_an_empty_batch_gives_empty_outputs_on_every_rule(path):
    """B = 0 (an engine's step with no requests) returns empty outputs."""
    skip_without_kernel(path)
    target, draft = torch.rand(0, 3, 5), torch.rand(0, 2, 5)
    tokens = torch.zeros(0, 2, dtype=torch.int64)
    for rule, args in ((rejection_sample, (target, draft, tokens, torch.Generator().manual_seed(0))),
                       (rules.point_mass_verify, (target, tokens, torch.Generator().manual_seed(0))),
                       (rules.greedy_verify, (target, tokens))):
        result = on_path(path, rule, *args)
        assert result.emitted.shape == (0, 3) and result.num_accepted.shape == (0,)


@pytest.mark.gpu
def test_cuda_gives_the_plain_tokens_on_cpu():
    for shape in [(64, 8, 32_768), (5, 3, 1000)]:
        p, q, drafts, u, num_draft = random_case(derive_seed("rules-identity-cuda", shape), *shape, torch.float32, True)
        expected = on_path("plain", rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft)
        on_cuda = rejection_sample(p.cuda(), q.cuda(), drafts.cuda(), uniforms=u.cuda(), num_draft=num_draft.cuda())
        assert torch.equal(expected.emitted, on_cuda.emitted.cpu())
        assert torch.equal(expected.num_accepted, on_cuda.num_accepted.cpu())


# --------------------------------------------------------------------------------------------
# Validation: the detailed checks' first error on every path, nothing for valid inputs
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
    tiny_negative = -2.0 ** -24 if p.dtype == torch.float16 else -1e-30  # -1e-30 rounds to -0.0 in float16
    yield "target NaN", (with_entry(p, last, nan), q, drafts, u, num_draft)
    yield "target Inf", (with_entry(p, (0, 0, 0), math.inf), q, drafts, u, num_draft)
    yield "draft NaN", (with_entry(q, (batch - 1, 0, 0), nan), q, drafts, u, num_draft)
    yield "target negative", (with_entry(p, (0, 0, vocab - 1), tiny_negative), q, drafts, u, num_draft)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", SCREEN_PATHS)
def test_every_screen_path_gives_the_detailed_checks_first_error(path, dtype):
    skip_without_kernel(path)
    for shape in [(1, 1, 3), (4, 3, 50), (3, 2, 4096)]:
        for ragged in (False, True):
            seed = derive_seed("rules-identity-validation", shape, str(dtype), ragged)
            case = random_case(seed, *shape, dtype, ragged)
            for name, corrupted in _corruptions(*case):
                expected = compare(path, *corrupted, valid=name == "minus zero (valid)")
                # a corruption the rows in use never see (padding beyond num_draft) is no error
                assert isinstance(expected, str) or name == "minus zero (valid)" or ragged, name


def test_screen_flags_minus_zero_but_the_detailed_check_accepts_it():
    """-0.0 sets the sign bit: the screen sends the inputs to the detailed checks, which pass them."""
    p = torch.tensor([[[0.5, 0.5, -0.0], [0.5, 0.5, 0.0]]])
    q = torch.tensor([[[0.5, 0.5, 0.0]]])
    drafts = torch.tensor([[1]])
    assert rules._any_problem(p, q, drafts, None, None)
    rules.validate_verify_inputs(p, q, drafts, torch.Generator())


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


INVALID = {
    "NaN": (math.nan, "contains NaN or Inf"),
    "+Inf": (math.inf, "contains NaN or Inf"),
    "-Inf": (-math.inf, "contains NaN or Inf"),
    "negative": (-1e-30, "contains negative entries"),
}


@pytest.mark.parametrize("path", ["native kernel", "torch defaults", "chunked screen, one row a chunk"])
@pytest.mark.parametrize("argument", ["target_probs", "draft_probs"])
@pytest.mark.parametrize("kind", list(INVALID) + ["not summing to 1"])
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
def test_validation_rejects_each_kind_of_invalid_value(path, argument, kind, dtype):
    skip_without_kernel(path)
    p, q, drafts, u, _ = random_case(derive_seed("rules-identity-invalid", str(dtype)), 8, 3, 40, dtype, False)
    tensor = (p if argument == "target_probs" else q).clone()
    if kind == "not summing to 1":
        tensor[3, 1] *= 2
        message = "a row does not sum to 1"
    else:
        value, message = INVALID[kind]
        tensor[3, 1, 39] = value
    p, q = (tensor, q) if argument == "target_probs" else (p, tensor)
    for check in (rejection_sample, rules.validate_verify_inputs):
        error = on_path(path, check, p, q, drafts, uniforms=u)
        assert isinstance(error, str) and error.startswith(f"{argument}: {message}"), error


@pytest.mark.parametrize("argument, change, message", [
    ("target_probs", lambda p, q, d: (p.double().long(), q, d), "expected a floating-point tensor"),
    ("target_probs", lambda p, q, d: (p[:, :1], q, d), "speculative verification needs K >= 1"),
    ("draft_probs", lambda p, q, d: (p, q[:, :-1], d), "positions but target_probs has"),
    ("draft_probs", lambda p, q, d: (p, q[..., :-1], d), "vocabulary size"),
    ("draft_tokens", lambda p, q, d: (p, q, d.int()), "expected dtype torch.int64"),
    ("draft_tokens", lambda p, q, d: (p, q, d[:, :-1]), "expected shape"),
])
@pytest.mark.parametrize("path", ["native kernel", "torch defaults"])
def test_validation_rejects_wrong_dtypes_and_shapes(path, argument, change, message):
    skip_without_kernel(path)
    p, q, drafts, u, _ = random_case(derive_seed("rules-identity-structure"), 4, 3, 40, torch.float32, False)
    error = on_path(path, rejection_sample, *change(p, q, drafts), uniforms=u)
    assert isinstance(error, str) and re.match(f"{argument}: .*{message}", error), error


# --------------------------------------------------------------------------------------------
# The comparisons catch a fast path that differs from the plain path
# --------------------------------------------------------------------------------------------


def _row_by_row_without_residual(original):
    """Row by row, every final row drawn from ``p_n`` (the residual never formed)."""
    return lambda target, draft, accepted, rejected, u: original(target, draft, accepted, torch.zeros_like(rejected), u)


def _chunks_reading_the_first_chunk(original):
    """Chunked gathers whose every chunk reads the rows of the first chunk."""

    def picker(probs, positions):
        pick = original(probs, positions)
        return lambda chunk: pick(slice(0, positions[chunk].numel()))

    return picker


def _screen_without_the_sign_bit(original):
    """A screen that checks the row sums only (a tiny negative entry passes it)."""

    def screen(probs):
        sums = probs.sum(-1).to(torch.float64)
        return (sums - 1).abs() <= rules.row_sum_tolerance(probs.dtype, probs.shape[-1])

    return screen


MUTANTS = {
    "row by row without the residual": ("_draw_final_tokens_by_row", _row_by_row_without_residual,
                                        "row-by-row final rows, uneven chunks"),
    "chunks reading the first chunk": ("_row_picker", _chunks_reading_the_first_chunk,
                                       "gathered final rows, uneven chunks"),
    "screen without the sign bit": ("_rows_look_valid", _screen_without_the_sign_bit, "torch defaults"),
}


@pytest.mark.parametrize("mutant", MUTANTS, ids=list(MUTANTS))
def test_a_perturbed_fast_path_fails_the_comparison(mutant, monkeypatch):
    """Each mutant changes only a fast path (the plain path never reaches it, or the detailed checks
    replace it); the comparisons of the float32 cases above must fail on it."""
    name, mutate, path = MUTANTS[mutant]
    monkeypatch.setattr(rules, name, mutate(getattr(rules, name)))
    with pytest.raises(AssertionError):
        for shape in SHAPES:
            for ragged in (False, True):
                case = random_case(derive_seed("rules-identity", shape, str(torch.float32), ragged), *shape,
                                   torch.float32, ragged)
                compare(path, *case)
                compare(path, *dict(_corruptions(*case))["target negative"], valid=False)
