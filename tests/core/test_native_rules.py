"""The fused native kernel (specverify.core.native_rules) against the torch rules it replaces on CPU.

Every rule with a native path (``rejection_sample``, ``point_mass_verify``, ``greedy_verify``) must
return bit-identical outputs on both paths under the same uniforms or generator, raise the same
errors, and actually take the native path where it applies (so that the identity tests cannot pass
vacuously).  The kernel's two ways of locating the inverse-CDF token (the certified shortcut and the
exact sequential cumulative sum) are both compared with torch, and mutated copies of the kernel are
shown to fail these comparisons.  Without a compiler everything runs on the torch path.
"""

from __future__ import annotations

import math
import platform
import threading
from pathlib import Path

import pytest
import torch

from specverify.core import native_cache, native_rules, rules
from specverify.core.rules import greedy_verify, point_mass_verify, rejection_sample
from specverify.core.seeding import derive_seed
from tests.core.test_rules_identity import _corruptions, assert_same, outcome, random_case

needs_compiler = pytest.mark.skipif(not native_rules.enabled(), reason="no C compiler: the "
                                    "native kernel cannot be built")

NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SHAPES = [(1, 1, 1), (1, 1, 2), (3, 2, 3), (5, 4, 7), (2, 8, 33), (17, 3, 50), (64, 8, 32), (9, 1, 1000),
          (33, 5, 257), (4, 2, 32_768 + 5)]


def mutated_library(old: str, new: str, monkeypatch, tmp_path):
    """The kernel built (into ``tmp_path``) from its source with the one occurrence of ``old``
    replaced by ``new``."""
    source = native_rules.SOURCE.read_text()
    assert source.count(old) == 1
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    mutated = native_rules.build(source.replace(old, new).encode())
    assert mutated is not None
    return mutated


def use_portable_build(monkeypatch, tmp_path) -> None:
    """From here on the rules use the kernel built for baseline x86-64 (no AVX-512: the plain C
    loops everywhere), as on a machine without AVX-512; skips elsewhere."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the portable-build check targets x86-64")
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    monkeypatch.setattr(native_rules, "FLAGS", tuple(f for f in native_rules.FLAGS if f != "-march=native")
                        + ("-march=x86-64-v2",))
    portable = native_rules.build(native_rules.SOURCE.read_bytes())
    assert portable is not None
    monkeypatch.setattr(native_rules, "library", lambda: portable)


def on_path(native: bool, rule, *args, **kwargs):
    """``outcome(rule, ...)`` with the native path on or off (``$SPECVERIFY_NATIVE``)."""
    with native_rules.path(native):
        return outcome(rule, *args, **kwargs)


def both_paths(rule, *args, **kwargs):
    """Run ``rule`` on both paths; assert equal outputs (or equal error messages); return them."""
    native = on_path(True, rule, *args, **kwargs)
    reference = on_path(False, rule, *args, **kwargs)
    assert_same(reference, native)
    return native


def greedy_friendly(p, drafts, num_draft, seed):
    """Draft tokens that equal the target's argmax at a random prefix of positions (so that greedy
    and point-mass verification accept some drafts)."""
    gen = torch.Generator().manual_seed(seed)
    argmax = p[:, :-1].argmax(-1)
    agree = torch.rand(drafts.shape, generator=gen) < 0.7
    return torch.where(agree & (drafts >= 0), argmax, drafts)


class Calls:
    """Counts the kernel calls that returned a result (patched over ``native_rules.verify``)."""

    def __init__(self, monkeypatch):
        self.taken = 0
        original = native_rules.verify

        def counting(*args, **kwargs):
            result = original(*args, **kwargs)
            self.taken += result is not None
            return result

        monkeypatch.setattr(native_rules, "verify", counting)


# --------------------------------------------------------------------------------------------
# The native path is taken where it applies, and only there
# --------------------------------------------------------------------------------------------


@needs_compiler
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
def test_the_native_path_is_taken_for_cpu_float32_bfloat16_and_float16(dtype, monkeypatch):
    p, q, drafts, u, num_draft = random_case(derive_seed("native-taken", str(dtype)), 4, 3, 300, dtype, True)
    calls = Calls(monkeypatch)
    rejection_sample(p, q, drafts, uniforms=u, num_draft=num_draft)
    rejection_sample(p, q, drafts, torch.Generator().manual_seed(0), validate=False, num_draft=num_draft)
    point_mass_verify(p, drafts, uniforms=u, num_draft=num_draft)
    greedy_verify(p, drafts, num_draft=num_draft)
    assert calls.taken == 4


@needs_compiler
def test_the_native_path_is_not_taken_where_it_does_not_apply(monkeypatch):
    p, q, drafts, u, num_draft = random_case(derive_seed("native-not-taken"), 4, 3, 300, torch.float32, True)
    calls = Calls(monkeypatch)
    rejection_sample(p.to(torch.float64), q.to(torch.float64), drafts, uniforms=u, num_draft=num_draft)
    rejection_sample(p, q.to(torch.bfloat16), drafts, uniforms=u, num_draft=num_draft)  # mixed dtypes
    monkeypatch.setenv("SPECVERIFY_NATIVE", "0")
    rejection_sample(p, q, drafts, uniforms=u, num_draft=num_draft)
    assert calls.taken == 0


@needs_compiler
def test_strided_views_and_float16_take_the_native_path(monkeypatch):
    """Engines pass views of wider buffers, rows expanded over a batch and fp16 laws: views whose
    rows of V entries are contiguous are read in place, fp16 included, with the torch path's
    outputs."""
    p, q, drafts, u, num_draft = random_case(derive_seed("native-views"), 4, 3, 300, torch.float32, True)
    strided = torch.cat([p, p], dim=-1)[..., :300]
    expanded = (p[:1].expand(4, -1, -1), q[:1].expand(4, -1, -1))  # one request's laws, four rows
    row_drafts, row_num_draft = drafts[:1].repeat(4, 1), None if num_draft is None else num_draft[:1].repeat(4)
    copies = []
    real_contiguous = torch.Tensor.contiguous
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda self, *a, **k: copies.append(self.shape) or
                        real_contiguous(self, *a, **k))
    calls = Calls(monkeypatch)
    native = rejection_sample(strided, q, drafts, uniforms=u, num_draft=num_draft)
    native_expanded = rejection_sample(*expanded, row_drafts, uniforms=u, num_draft=row_num_draft)
    half = rejection_sample(p.half(), q.half(), drafts, uniforms=u, num_draft=num_draft)
    greedy_verify(strided, drafts, num_draft=num_draft)
    assert calls.taken >= 3
    assert not [shape for shape in copies if len(shape) == 3], "a law view was copied before the kernel"
    monkeypatch.setenv("SPECVERIFY_NATIVE", "0")
    torch_path = rejection_sample(strided, q, drafts, uniforms=u, num_draft=num_draft)
    torch_expanded = rejection_sample(*(t.contiguous() for t in expanded), row_drafts, uniforms=u,
                                      num_draft=row_num_draft)
    torch_half = rejection_sample(p.half(), q.half(), drafts, uniforms=u, num_draft=num_draft)
    assert all(torch.equal(a, b) for a, b in zip(native, torch_path))
    assert all(torch.equal(a, b) for a, b in zip(native_expanded, torch_expanded))
    assert all(torch.equal(a, b) for a, b in zip(half, torch_half))


# --------------------------------------------------------------------------------------------
# Bit-identical outputs on both paths
# --------------------------------------------------------------------------------------------


@needs_compiler
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_rule_gives_the_torch_outputs(shape, dtype):
    for ragged in (False, True):
        seed = derive_seed("native-identity", shape, str(dtype), ragged)
        p, q, drafts, u, num_draft = random_case(seed, *shape, dtype, ragged)
        friendly = greedy_friendly(p, drafts, num_draft, seed)
        for validate in (True, False):
            both_paths(rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft, validate=validate)
            both_paths(point_mass_verify, p, drafts, uniforms=u, num_draft=num_draft, validate=validate)
            both_paths(point_mass_verify, p, friendly, uniforms=u, num_draft=num_draft, validate=validate)
            both_paths(greedy_verify, p, drafts, num_draft=num_draft, validate=validate)
            both_paths(greedy_verify, p, friendly, num_draft=num_draft, validate=validate)


@needs_compiler
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
def test_the_same_generator_draw_and_final_state(dtype):
    p, q, drafts, _, num_draft = random_case(derive_seed("native-generator", str(dtype)), 6, 4, 500, dtype, True)
    for rule, args in ((rejection_sample, (p, q, drafts)), (point_mass_verify, (p, drafts))):
        generators = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        native = on_path(True, rule, *args, generators[0], num_draft=num_draft)
        reference = on_path(False, rule, *args, generators[1], num_draft=num_draft)
        assert_same(reference, native)
        assert torch.equal(generators[0].get_state(), generators[1].get_state())


@needs_compiler
def test_without_validation_and_without_a_generator_the_global_generator_is_used():
    """``validate=False`` with neither a generator nor uniforms: both paths draw from torch's global
    generator (``torch.rand(..., generator=None)``), the same numbers."""
    p, q, drafts, _, num_draft = random_case(derive_seed("native-global-generator"), 6, 3, 100, torch.float32, True)
    for rule, args in ((rejection_sample, (p, q, drafts)), (point_mass_verify, (p, drafts))):
        torch.manual_seed(11)
        native = on_path(True, rule, *args, num_draft=num_draft, validate=False)
        after_native = torch.random.get_rng_state()
        torch.manual_seed(11)
        reference = on_path(False, rule, *args, num_draft=num_draft, validate=False)
        assert_same(reference, native)
        assert torch.equal(after_native, torch.random.get_rng_state())


@needs_compiler
def test_a_flagged_input_restores_the_generator_and_reruns_the_torch_rule(monkeypatch):
    """-0.0 sets the sign bit: the kernel flags it, the torch rule accepts it.  The result and the
    generator's final state equal the torch path's (one draw, not two)."""
    p = torch.tensor([[[0.5, 0.5, -0.0], [0.25, 0.75, 0.0]]])
    q = torch.tensor([[[0.75, 0.25, 0.0]]])
    drafts = torch.tensor([[0]])
    calls = Calls(monkeypatch)
    for seed in range(20):
        generators = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        native = on_path(True, rejection_sample, p, q, drafts, generators[0])
        reference = on_path(False, rejection_sample, p, q, drafts, generators[1])
        assert_same(reference, native)
        assert torch.equal(generators[0].get_state(), generators[1].get_state())
    assert calls.taken == 0


@needs_compiler
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
def test_the_same_errors_for_corrupted_inputs(dtype):
    for ragged in (False, True):
        case = random_case(derive_seed("native-errors", str(dtype), ragged), 4, 3, 50, dtype, ragged)
        for _, (p, q, drafts, u, num_draft) in _corruptions(*case):
            both_paths(rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft)
            both_paths(point_mass_verify, p, drafts, uniforms=u, num_draft=num_draft)
            both_paths(greedy_verify, p, drafts, num_draft=num_draft)


@needs_compiler
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
def test_rows_at_the_edge_of_the_tolerance_get_the_torch_verdict(dtype):
    """Rows scaled to 1 + tolerance * [0.5, 1.5]: the kernel's float64 screen sends the rows near the
    edge to the torch check, so valid and invalid rows get the same verdict on both paths."""
    gen = torch.Generator().manual_seed(derive_seed("native-edge", str(dtype)))
    vocab = 3000
    tolerance = rules.row_sum_tolerance(dtype, vocab)
    verdicts = set()
    for scale in torch.linspace(0.5, 1.5, 21).tolist():
        for sign in (1, -1):
            p = torch.softmax(torch.randn(2, 3, vocab, generator=gen, dtype=torch.float64), -1)
            p[1, 1] *= 1 + sign * scale * tolerance
            p = p.to(dtype)
            q = torch.softmax(torch.randn(2, 2, vocab, generator=gen, dtype=torch.float64), -1).to(dtype)
            drafts = torch.multinomial(q.double().reshape(-1, vocab), 1, generator=gen).reshape(2, 2)
            u = torch.rand(2, 3, generator=gen, dtype=torch.float64)
            result = both_paths(rejection_sample, p, q, drafts, uniforms=u)
            both_paths(greedy_verify, p, drafts)
            verdicts.add(isinstance(result, str))
    assert verdicts == {True, False}  # rows on both sides of the tolerance


# --------------------------------------------------------------------------------------------
# The two ways of locating the token: the certified shortcut and the exact cumulative sum
# --------------------------------------------------------------------------------------------


def kernel(rule, p, q, drafts, u, num_draft, *, force_exact=False, validate=True):
    limit = rules._native_screen_limit(p.dtype, p.shape[-1])
    result = native_rules.verify(rule, p, q, drafts, None, u, num_draft, validate, target_limit=limit,
                                 draft_limit=limit, force_exact=force_exact)
    assert result is not None
    return result


@needs_compiler
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
def test_the_exact_cumulative_sum_and_the_certified_shortcut_agree_with_torch(dtype):
    for shape in [(5, 4, 7), (17, 3, 50), (33, 5, 257), (3, 2, 32_768 + 5)]:
        p, q, drafts, u, num_draft = random_case(derive_seed("native-exact", shape, str(dtype)), *shape, dtype, True)
        for rule, draft_probs in (("rejection", q), ("point_mass", None)):
            torch_rule = rejection_sample if rule == "rejection" else point_mass_verify
            args = (p, q, drafts) if rule == "rejection" else (p, drafts)
            reference = on_path(False, torch_rule, *args, uniforms=u, num_draft=num_draft)
            exact = kernel(rule, p, draft_probs, drafts, u, num_draft, force_exact=True)
            certified = kernel(rule, p, draft_probs, drafts, u, num_draft)
            for result in (exact, certified):
                assert torch.equal(result.emitted, reference.emitted)
                assert torch.equal(result.num_accepted, reference.num_accepted)
            assert exact.exact_rows >= shape[0]  # every row (fallback rows twice)


@needs_compiler
def test_the_shortcut_certifies_ordinary_rows_and_declines_boundary_draws():
    """Softmax rows are certified (no sequential sum); a uniform that puts the threshold exactly on
    a cumulative sum (dyadic masses, u = 1/4, 1/2, 3/4) is declined and drawn exactly."""
    p, q, drafts, u, _ = random_case(derive_seed("native-certified"), 64, 4, 4096, torch.float32, False)
    assert kernel("rejection", p, q, drafts, u, None).exact_rows <= 1
    target = torch.tensor([[[0.25, 0.0, 0.25, 0.25, 0.25], [0.25, 0.25, 0.0, 0.25, 0.25]]])
    draft = torch.tensor([[[0.0, 0.0, 0.0, 0.0, 1.0]]])
    tokens = torch.tensor([[4]])
    for u_final in (0.0, 0.25, 0.5, 0.75, math.nextafter(1.0, 0.0)):
        for u_draft in (0.0, 0.9):  # accept (bonus from row 1) / reject (residual of row 0)
            uniforms = torch.tensor([[u_draft, u_final]], dtype=torch.float64)
            result = kernel("rejection", target, draft, tokens, uniforms, None)
            reference = on_path(False, rejection_sample, target, draft, tokens, uniforms=uniforms)
            assert torch.equal(result.emitted, reference.emitted)
            if u_final in (0.25, 0.5, 0.75) and u_draft == 0:  # the bonus row's sums hit 1/4, 1/2, 3/4
                assert result.exact_rows == 1


def sequential_sum_ahead_of_the_estimate():
    """A bonus row whose sequential cumulative sum runs ahead of the kernel's block-order estimate:
    0.5, then 127 entries of 0.625 ulp(0.5), each of which rounds the sequential sum up by a whole
    ulp (the estimate adds most of them exactly: ~82 ulps instead of 127), then 0.25, 0.25, then 64
    entries of 0.375 ulp(1) that the sequential sum loses and the estimate keeps (so that the two
    totals, and the thresholds formed from them, agree).  The threshold is put at 0.5 + 100.5 ulps:
    the token is ~101, while the estimate first crosses it at 128 (a big term a certificate without
    its lower check would accept)."""
    vocab, tiny, tinier = 256, 1.25 * 2.0 ** -54, 1.5 * 2.0 ** -54
    row = torch.zeros(vocab, dtype=torch.float64)
    row[0], row[1:128], row[128], row[129], row[130:194] = 0.5, tiny, 0.25, 0.25, tinier
    cumulative = torch.cumsum(row, 0)
    total = float(cumulative[-1])
    u_final = (0.5 + 100.5 * 2.0 ** -53) / total
    first = torch.softmax(torch.arange(vocab, dtype=torch.float64), 0)
    target = torch.stack([first, row]).to(torch.float32)[None]
    draft = target[:, :1].clone()
    tokens = torch.tensor([[vocab - 1]])
    uniforms = torch.tensor([[0.0, u_final]], dtype=torch.float64)  # u_0 = 0: accept, bonus row
    return target, draft, tokens, uniforms


@needs_compiler
def test_the_certificate_declines_a_candidate_the_sequential_sum_has_passed():
    target, draft, tokens, uniforms = sequential_sum_ahead_of_the_estimate()
    reference = on_path(False, rejection_sample, target, draft, tokens, uniforms=uniforms)
    assert 90 < int(reference.emitted[0, 1]) < 128  # the sequential sum crossed inside the tiny entries
    result = kernel("rejection", target, draft, tokens, uniforms, None)
    assert torch.equal(result.emitted, reference.emitted)
    assert result.exact_rows == 1


# --------------------------------------------------------------------------------------------
# A perturbed kernel fails the identity tests; no compiler means the torch path everywhere
# --------------------------------------------------------------------------------------------

MUTATIONS = {
    "accept test <= instead of <": ("u[i] * (double)VALUE(q[i * q_step + row_tokens[i]]) < pv",
                                    "u[i] * (double)VALUE(q[i * q_step + row_tokens[i]]) <= pv"),
    "target rows read V apart whatever their stride": ("double pv = (double)VALUE(p[i * p_step + row_tokens[i]]);",
                                                       "double pv = (double)VALUE(p[i * vocab + row_tokens[i]]);"),
    "search >= instead of >": ("if (cumulative[mid] > threshold) high = mid;",
                               "if (cumulative[mid] >= threshold) high = mid;"),
    "residual not clamped at 0": ("x -= (double)VALUE(q[t]); x = x > 0.0 ? x : 0.0;", "x -= (double)VALUE(q[t]);"),
    "certificate without its lower check": (
        "if ((t == 0 || before + delta <= th_low) && estimate - delta > th_high) return t;",
        "if (estimate - delta > th_high) return t;"),
}
"""Each mutation changes the kernel's output on the cases below (the threshold cap
``nextafter(T, 0)`` is not among them: it binds only for a subnormal total, which float32 and
bfloat16 rows cannot produce in float64, so removing it from the kernel changes nothing)."""


@needs_compiler
@pytest.mark.parametrize("mutation", MUTATIONS, ids=list(MUTATIONS))
def test_a_perturbed_kernel_fails_the_identity_check(mutation, monkeypatch, tmp_path):
    old, new = MUTATIONS[mutation]
    mutated = mutated_library(old, new, monkeypatch, tmp_path)
    cases = [random_case(derive_seed("native-mutation", seed), 16, 3, 40, torch.float32, True) for seed in range(6)]
    # p(x) = 0 with u = 0 (the accept test's edge), then a residual [0, 0.5] searched with u = 0
    cases.append((torch.tensor([[[0.0, 1.0], [0.5, 0.5]]]), torch.tensor([[[0.5, 0.5]]]), torch.tensor([[0]]),
                  torch.tensor([[0.0, 0.0]], dtype=torch.float64), None))
    cases.append((*sequential_sum_ahead_of_the_estimate(), None))

    def strided(probs):  # each position's row V entries further on than contiguous (a padded buffer)
        return torch.cat([probs, probs], dim=-1)[..., : probs.shape[-1]]

    cases += [(strided(p), strided(q), drafts, u, num_draft) for p, q, drafts, u, num_draft in cases[:3]]

    def mismatches() -> int:
        count = 0
        for p, q, drafts, u, num_draft in cases:
            reference = on_path(False, rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft)
            for force_exact in (False, True):
                result = kernel("rejection", p, q, drafts, u, num_draft, force_exact=force_exact)
                count += not torch.equal(result.emitted, reference.emitted)
        return count

    assert mismatches() == 0
    monkeypatch.setattr(native_rules, "library", lambda: mutated)
    assert mismatches() > 0


@needs_compiler
def test_the_portable_build_without_avx512_gives_the_torch_outputs(monkeypatch, tmp_path):
    """The kernel built for baseline x86-64 (no AVX-512: the plain C loops everywhere), as on a
    machine without AVX-512, on the identity cases of every rule."""
    use_portable_build(monkeypatch, tmp_path)
    calls = Calls(monkeypatch)
    for dtype in NATIVE_DTYPES:
        for shape in [(5, 4, 7), (17, 3, 50), (33, 5, 257), (3, 2, 4096 + 3)]:
            p, q, drafts, u, num_draft = random_case(derive_seed("native-portable", shape, str(dtype)), *shape,
                                                     dtype, True)
            both_paths(rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft)
            both_paths(point_mass_verify, p, drafts, uniforms=u, num_draft=num_draft)
            both_paths(greedy_verify, p, greedy_friendly(p, drafts, num_draft, 0), num_draft=num_draft)
            corruptions = _corruptions(p, q, drafts, u, num_draft) if shape == (5, 4, 7) else ()
            for _, (bad_p, bad_q, bad_drafts, bad_u, bad_num_draft) in corruptions:
                both_paths(rejection_sample, bad_p, bad_q, bad_drafts, uniforms=bad_u, num_draft=bad_num_draft)
    assert calls.taken >= 24


def test_without_a_compiler_every_rule_runs_on_the_torch_path(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(native_cache.shutil, "which", lambda name: None)
    native_rules.library.cache_clear()
    try:
        assert native_rules.library() is None and not native_rules.enabled()
        p, q, drafts, u, num_draft = random_case(derive_seed("native-no-compiler"), 5, 3, 40, torch.float32, True)
        calls = Calls(monkeypatch)
        assert_same(on_path(False, rejection_sample, p, q, drafts, uniforms=u, num_draft=num_draft),
                    rejection_sample(p, q, drafts, uniforms=u, num_draft=num_draft))
        assert_same(on_path(False, greedy_verify, p, drafts, num_draft=num_draft),
                    greedy_verify(p, drafts, num_draft=num_draft))
        assert_same(on_path(False, point_mass_verify, p, drafts, uniforms=u, num_draft=num_draft),
                    point_mass_verify(p, drafts, uniforms=u, num_draft=num_draft))
        assert calls.taken == 0
    finally:
        monkeypatch.undo()
        native_rules.library.cache_clear()


@needs_compiler
def test_concurrent_builds_leave_one_working_library(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    source = native_rules.SOURCE.read_bytes() + b"\n/* concurrent build test */\n"
    built = []
    threads = [threading.Thread(target=lambda: built.append(native_rules.build(source))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 3 and all(lib is not None for lib in built)
    assert [path.suffix for path in Path(tmp_path, "native").iterdir()] == [".so"]


def test_torch_row_sums_stay_well_inside_the_screen_margin():
    """The margin the kernel's screen leaves (SCREEN_MARGIN_FRACTION of the tolerance) must exceed
    the rounding of the torch sum that the detailed check uses.  Measured here on rows that stress
    it (uniform, peaked, ramps, one large entry; V up to 128k): float32 errs by < 1% of the margin,
    bfloat16 (whose sum is rounded to bfloat16) by < 25%."""
    gen = torch.Generator().manual_seed(derive_seed("native-margin"))
    for vocab in (32_768, 131_072):
        ramp = torch.arange(1, vocab + 1, dtype=torch.float64)
        one_big = torch.full((vocab,), 0.5 / (vocab - 1), dtype=torch.float64)
        one_big[0] = 0.5
        rows = [torch.full((vocab,), 1 / vocab, dtype=torch.float64), ramp / ramp.sum(), one_big,
                *(torch.softmax(scale * torch.randn(vocab, generator=gen, dtype=torch.float64), -1)
                  for scale in (1.0, 3.0, 10.0))]
        for dtype, share in ((torch.float32, 0.01), (torch.bfloat16, 0.25)):
            margin = native_rules.SCREEN_MARGIN_FRACTION * rules.row_sum_tolerance(dtype, vocab)
            for row in rows:
                cast = row.to(dtype).expand(3, 2, vocab).contiguous()
                error = (cast.sum(-1).double() - cast.double().sum(-1)).abs().max().item()
                assert error < share * margin, (vocab, dtype, error, margin)


@needs_compiler
@pytest.mark.slow
def test_large_vocabularies_with_peaked_and_flat_rows_give_the_torch_outputs():
    """Differential check at V = 8k–128k with softmax temperatures from flat to very peaked (masses
    down to ~1e-40, far below the certificate's delta), target-like and independent drafts; the
    certified path must decline nothing it cannot prove (every row equal to torch)."""
    for seed in range(60):
        gen = torch.Generator().manual_seed(derive_seed("native-large", seed))
        batch, num_drafts = (1, 4, 9)[seed % 3], (1, 3, 8)[seed // 3 % 3]
        vocab, scale = (8195, 32_768, 131_072)[seed // 9 % 3], (1.0, 3.0, 10.0, 30.0)[seed % 4]
        dtype = NATIVE_DTYPES[seed % 2]
        p = torch.softmax(scale * torch.randn(batch, num_drafts + 1, vocab, generator=gen, dtype=torch.float64), -1)
        q = torch.softmax(scale * torch.randn(batch, num_drafts, vocab, generator=gen, dtype=torch.float64), -1)
        if seed % 5 < 2:
            q = 0.5 * q + 0.5 * p[:, :-1]
        p, q = p.to(dtype), q.to(dtype)
        drafts = torch.multinomial(q.double().reshape(-1, vocab), 1, generator=gen).reshape(batch, num_drafts)
        u = torch.rand(batch, num_drafts + 1, generator=gen, dtype=torch.float64)
        both_paths(rejection_sample, p, q, drafts, uniforms=u)
        both_paths(point_mass_verify, p, drafts, uniforms=u)
        both_paths(greedy_verify, p, p[:, :-1].argmax(-1))
