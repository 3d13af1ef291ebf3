"""The native tree walk (specverify.core.native_rules.tree_verify) against the torch tree rules.

``tree_rejection_sample`` and ``point_mass_tree_verify`` must return bit-identical outputs on both
paths under the same uniforms or generator, raise the same errors, and take the native path where it
applies (contiguous CPU float32/bfloat16) and only there.  The final draw's certified shortcut and
its exact sequential cumulative sum are both compared with torch, the rounding fallback (a residual
with no float64 mass) is exercised, and mutated copies of the kernel are shown to fail these
comparisons.  Without a compiler everything runs on the torch path.
"""

from __future__ import annotations

import platform

import pytest
import torch

from specverify.core import native_cache, native_rules, tree_rules
from specverify.core.seeding import derive_seed
from specverify.core.tree_rules import point_mass_tree_verify, tree_rejection_sample
from tests.core.test_native_rules import mutated_library, use_portable_build
from tests.core.test_tree_rules_identity import _corruptions, assert_same, outcome
from tests.core.test_tree_rules_identity import random_tree_case as identity_case

needs_compiler = pytest.mark.skipif(not native_rules.enabled(), reason="no C compiler: the "
                                    "native kernel cannot be built")

NATIVE_DTYPES = (torch.float32, torch.bfloat16)
SHAPES = [(1, 1, 1), (1, 1, 2), (3, 2, 3), (5, 4, 7), (2, 8, 33), (17, 3, 50), (64, 8, 32), (9, 1, 1000),
          (33, 5, 257), (4, 6, 32_768 + 5)]


def random_tree_case(seed: int, batch: int, num_nodes: int, vocab: int, dtype: torch.dtype):
    """The identity tests' random trees with valid uniforms: their edge uniforms ``p/q`` are NaN in
    the columns of absent nodes (``q = 0``), which validation rejects."""
    p, q, tokens, parents, u = identity_case(seed, batch, num_nodes, vocab, dtype)
    return p, q, tokens, parents, torch.nan_to_num(u, nan=0.5)


def on_path(native: bool, rule, *args, **kwargs):
    """``outcome(rule, ...)`` with the native path on or off (``$SPECVERIFY_NATIVE``)."""
    with native_rules.path(native):
        return outcome(rule, *args, **kwargs)


def both_rules(p, q, tokens, parents, **kwargs):
    """Both native rules on both paths: equal outputs (or equal error messages)."""
    assert_same(on_path(False, tree_rejection_sample, p, q, tokens, parents, **kwargs),
                on_path(True, tree_rejection_sample, p, q, tokens, parents, **kwargs))
    assert_same(on_path(False, point_mass_tree_verify, p, tokens, parents, **kwargs),
                on_path(True, point_mass_tree_verify, p, tokens, parents, **kwargs))


class Calls:
    """Counts the native walks that returned a result (patched over ``native_rules.tree_verify``)."""

    def __init__(self, monkeypatch):
        self.taken = 0
        self.outcomes: list = []
        original = native_rules.tree_verify

        def counting(*args, **kwargs):
            result = original(*args, **kwargs)
            self.taken += result is not None
            self.outcomes.append(result)
            return result

        monkeypatch.setattr(native_rules, "tree_verify", counting)


def walk(p, q, tokens, parents, u, *, force_exact=False):
    """The native walk called directly (validation on), as the rules call it."""
    batch, _, vocab = p.shape
    buffers = tuple(torch.empty(batch, vocab, dtype=torch.float64) for _ in range(2))
    limit = tree_rules._native_screen_limit(p.dtype, vocab)
    return native_rules.tree_verify(p, q, tokens, parents, lambda: u, u, True, buffers, limit=limit,
                                    force_exact=force_exact)


# --------------------------------------------------------------------------------------------
# The native path is taken where it applies, and only there
# --------------------------------------------------------------------------------------------


@needs_compiler
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
def test_the_native_path_is_taken_for_contiguous_cpu_float32_and_bfloat16(dtype, monkeypatch):
    p, q, tokens, parents, u = random_tree_case(derive_seed("native-tree-taken", str(dtype)), 4, 5, 300, dtype)
    calls = Calls(monkeypatch)
    tree_rejection_sample(p, q, tokens, parents, uniforms=u)
    tree_rejection_sample(p, q, tokens, parents, torch.Generator().manual_seed(0), validate=False)
    point_mass_tree_verify(p, tokens, parents, uniforms=u)
    assert calls.taken == 3


@needs_compiler
def test_the_native_path_is_not_taken_where_it_does_not_apply(monkeypatch):
    p, q, tokens, parents, u = random_tree_case(derive_seed("native-tree-not-taken"), 4, 5, 300, torch.float32)
    calls = Calls(monkeypatch)
    for dtype in (torch.float64, torch.float16):
        tree_rejection_sample(p.to(dtype), q.to(dtype), tokens, parents, uniforms=u)
    tree_rejection_sample(p, q.to(torch.bfloat16), tokens, parents, uniforms=u)  # mixed dtypes
    strided = torch.cat([p, p], dim=-1)[..., :300]
    tree_rejection_sample(strided, q, tokens, parents, uniforms=u)
    tree_rules.unchanged_target_tree_verify(p, q, tokens, parents, uniforms=u)  # lossy rules: torch only
    tree_rules.thresholded_tree_verify(p, q, tokens, parents, uniforms=u)
    tree_rules.typical_acceptance_tree_verify(p, tokens, parents, uniforms=u)
    monkeypatch.setenv("SPECVERIFY_NATIVE", "0")
    tree_rejection_sample(p, q, tokens, parents, uniforms=u)
    point_mass_tree_verify(p, tokens, parents, uniforms=u)
    assert calls.taken == 0 and not calls.outcomes


# --------------------------------------------------------------------------------------------
# Bit-identical outputs on both paths
# --------------------------------------------------------------------------------------------


@needs_compiler
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_both_rules_give_the_torch_outputs(shape, dtype, monkeypatch):
    calls = Calls(monkeypatch)
    for repeat in range(2):
        p, q, tokens, parents, u = random_tree_case(derive_seed("native-tree", shape, str(dtype), repeat), *shape,
                                                    dtype)
        both_rules(p, q, tokens, parents, uniforms=u)
        both_rules(p, q, tokens, parents, uniforms=u, validate=False)
    assert calls.taken == 8


@needs_compiler
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
def test_the_same_generator_draw_and_final_state(dtype):
    p, q, tokens, parents, _ = random_tree_case(derive_seed("native-tree-gen", str(dtype)), 7, 6, 200, dtype)
    for validate in (True, False):
        generators = [torch.Generator().manual_seed(3) for _ in range(2)]
        results = [on_path(native, tree_rejection_sample, p, q, tokens, parents, generator, validate=validate)
                   for native, generator in zip((False, True), generators)]
        assert_same(*results)
        assert torch.equal(generators[0].get_state(), generators[1].get_state())


@needs_compiler
def test_without_validation_and_without_a_generator_the_global_generator_is_used():
    p, q, tokens, parents, _ = random_tree_case(derive_seed("native-tree-global"), 5, 4, 100, torch.float32)
    torch.manual_seed(11)
    reference = on_path(False, tree_rejection_sample, p, q, tokens, parents, validate=False)
    torch.manual_seed(11)
    assert_same(reference, on_path(True, tree_rejection_sample, p, q, tokens, parents, validate=False))


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_same_errors_for_corrupted_inputs(dtype, monkeypatch):
    calls = Calls(monkeypatch)
    for shape in [(1, 1, 3), (4, 3, 50), (3, 2, 4096)]:
        case = random_tree_case(derive_seed("native-tree-errors", shape, str(dtype)), *shape, dtype)
        for label, (p, q, tokens, parents, u) in _corruptions(*case):
            assert_same(on_path(False, tree_rejection_sample, p, q, tokens, parents, uniforms=u),
                        on_path(True, tree_rejection_sample, p, q, tokens, parents, uniforms=u))
            if label != "minus zero":
                assert calls.outcomes[-1] is None, label  # the kernel flagged it; torch worded the error
            assert_same(on_path(False, point_mass_tree_verify, p, tokens, parents, uniforms=u),
                        on_path(True, point_mass_tree_verify, p, tokens, parents, uniforms=u))
        p, q, tokens, parents, u = case  # a structure fault the torch validator words
        cycle = parents.clone()
        cycle[0, 0] = 0
        both_rules(p, q, tokens, cycle, uniforms=u)


@needs_compiler
def test_rows_at_the_edge_of_the_tolerance_get_the_torch_verdict():
    """Rows just inside and just outside the row-sum tolerance: the screen declines them and the
    torch validator decides (accepting, then the walk runs, or raising its message)."""
    p, q, tokens, parents, u = random_tree_case(derive_seed("native-tree-edge"), 3, 3, 64, torch.float32)
    tolerance = tree_rules._native_screen_limit(torch.float32, 64) / 0.75
    for factor in (1 + 0.9 * tolerance, 1 + 1.1 * tolerance):
        scaled = p.clone()
        scaled[0, 0] *= factor
        both_rules(scaled, q, tokens, parents, uniforms=u)


@needs_compiler
def test_a_residual_without_float64_mass_keeps_the_law():
    """The rounding fallback: p = (1 - 2e-6) q elementwise (within the float32 tolerance), so the
    node is rejected but every entry of (p - q)+ is 0; the law stays p and the final draw is from p."""
    q = torch.tensor([[[0.25, 0.25, 0.25, 0.25]]])
    p = torch.cat([q * (1 - 2e-6), torch.tensor([[[0.1, 0.2, 0.3, 0.4]]])], dim=1)
    tokens, parents = torch.tensor([[0]]), torch.tensor([[-1]])
    for u_final in (0.0, 0.3, 0.99):
        u = torch.tensor([[0.9999995, u_final]], dtype=torch.float64)
        reference = on_path(False, tree_rejection_sample, p, q, tokens, parents, uniforms=u)
        assert reference[1].item() == 0 and 0 <= reference[0][0, 0].item() < 4
        assert_same(reference, on_path(True, tree_rejection_sample, p, q, tokens, parents, uniforms=u))


@needs_compiler
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
def test_the_exact_cumulative_sum_and_the_certified_shortcut_agree_with_torch(dtype):
    for shape in [(6, 5, 33), (9, 4, 1000), (3, 6, 4099)]:
        p, q, tokens, parents, u = random_tree_case(derive_seed("native-tree-exact", shape, str(dtype)), *shape, dtype)
        reference = on_path(False, tree_rejection_sample, p, q, tokens, parents, uniforms=u)
        shortcut, exact = walk(p, q, tokens, parents, u), walk(p, q, tokens, parents, u, force_exact=True)
        assert exact.exact_rows == shape[0]
        for result in (shortcut, exact):
            assert_same(reference, (result.emitted, result.num_accepted, result.last_node))


@needs_compiler
def test_every_row_rejecting_every_node_and_rows_moving_between_buffers():
    """Drafts disjoint from the target (every node rejected, the residual buffers alternate) and
    a mix of accepting and rejecting rows over deep chains and stars."""
    vocab, batch, nodes = 40, 12, 7
    gen = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(batch, nodes + 1, vocab, generator=gen), -1)
    q = torch.softmax(torch.randn(batch, nodes, vocab, generator=gen) * 4, -1)
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, nodes)
    star = torch.full((batch, nodes), -1)
    chain = torch.arange(-1, nodes - 1).expand(batch, nodes).contiguous()
    mixed = torch.tensor([-1, -1, 0, 0, 1, 1, 2]).expand(batch, nodes).contiguous()
    for parents in (star, chain, mixed):
        for seed in range(4):
            u = torch.rand(batch, nodes + 1, generator=gen, dtype=torch.float64) ** (seed + 1)
            both_rules(p, q, tokens, parents, uniforms=u)


# --------------------------------------------------------------------------------------------
# Mutants fail, and the kernel's absence falls back to torch
# --------------------------------------------------------------------------------------------


MUTATIONS = {
    "accept test <= instead of <": ("if (scaled < r_x) {", "if (scaled <= r_x) {"),
    "residual not clamped at 0": ("        out[t] = d < 0.0 ? 0.0 : d;  ", "        out[t] = d;  "),
    "point mass: x not removed": ("        out[token] = d < 0.0 ? 0.0 : d;\n", "\n"),
    "accepting row keeps its total": ("                s[b] = 1.0;\n                current[b] = n;",
                                      "                current[b] = n;"),
    "zero-mass residual kept": ("if (totals[b] > 0.0) {", "if (totals[b] >= 0.0) {"),
    "final row drawn from the target row": ("if (held[b]) token = f64_draw(", "if (0) token = f64_draw("),
}


@needs_compiler
@pytest.mark.parametrize("mutation", MUTATIONS, ids=list(MUTATIONS))
def test_a_perturbed_kernel_fails_the_identity_check(mutation, monkeypatch, tmp_path):
    old, new = MUTATIONS[mutation]
    mutated = mutated_library(old, new, monkeypatch, tmp_path)
    cases = [random_tree_case(derive_seed("native-tree-mutation", seed), 16, 6, 40, torch.float32) for seed in range(6)]
    # p(x) = 0 with u = 0 (the accept test's edge)
    cases.append((torch.tensor([[[0.0, 1.0], [0.5, 0.5]]]), torch.tensor([[[0.5, 0.5]]]), torch.tensor([[0]]),
                  torch.tensor([[-1]]), torch.tensor([[0.0, 0.5]], dtype=torch.float64)))
    # node 0 rejected (s = 0.4), its sibling accepted (s must return to 1), then its child tested
    half = torch.full((1, 4, 2), 0.5)
    cases.append((half, torch.tensor([[[0.9, 0.1], [0.1, 0.9], [0.9, 0.1]]]), torch.tensor([[0, 1, 0]]),
                  torch.tensor([[-1, -1, 1]]), torch.tensor([[0.9, 0.5, 0.7, 0.5]], dtype=torch.float64)))
    q = torch.tensor([[[0.25, 0.25, 0.25, 0.25]]])  # the rounding fallback (see above)
    cases.append((torch.cat([q * (1 - 2e-6), q], dim=1), q, torch.tensor([[0]]), torch.tensor([[-1]]),
                  torch.tensor([[0.9999995, 0.5]], dtype=torch.float64)))

    def mismatches() -> int:
        count = 0
        for p, q, tokens, parents, u in cases:
            for rule, draft in ((tree_rejection_sample, (q,)), (point_mass_tree_verify, ())):
                reference = on_path(False, rule, p, *draft, tokens, parents, uniforms=u)
                count += not isinstance(reference, str) and \
                    not torch.equal(on_path(True, rule, p, *draft, tokens, parents, uniforms=u)[0], reference[0])
        return count

    assert mismatches() == 0
    monkeypatch.setattr(native_rules, "library", lambda: mutated)
    assert mismatches() > 0


@needs_compiler
def test_the_portable_build_without_avx512_gives_the_torch_outputs(monkeypatch, tmp_path):
    use_portable_build(monkeypatch, tmp_path)
    calls = Calls(monkeypatch)
    for dtype in NATIVE_DTYPES:
        for shape in [(5, 4, 7), (17, 3, 50), (3, 6, 4099)]:
            p, q, tokens, parents, u = random_tree_case(derive_seed("native-tree-portable", shape, str(dtype)),
                                                        *shape, dtype)
            both_rules(p, q, tokens, parents, uniforms=u)
    assert calls.taken == 12


def test_without_a_compiler_both_rules_run_on_the_torch_path(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(native_cache.shutil, "which", lambda name: None)
    native_rules.library.cache_clear()
    try:
        assert native_rules.library() is None and not native_rules.enabled()
        p, q, tokens, parents, u = random_tree_case(derive_seed("native-tree-no-compiler"), 5, 4, 40, torch.float32)
        calls = Calls(monkeypatch)
        assert_same(on_path(False, tree_rejection_sample, p, q, tokens, parents, uniforms=u),
                    tree_rejection_sample(p, q, tokens, parents, uniforms=u))
        assert_same(on_path(False, point_mass_tree_verify, p, tokens, parents, uniforms=u),
                    point_mass_tree_verify(p, tokens, parents, uniforms=u))
        assert calls.taken == 0 and not calls.outcomes
    finally:
        monkeypatch.undo()
        native_rules.library.cache_clear()


def second_residual_case():
    """A star of two nodes per row, both rejected (u ~ 1, drafts far from the target): the second
    residual ``(r - q_1 s)+`` has ``s != 1``, where a fused multiply-add would round differently."""
    batch, vocab = 8, 333
    gen = torch.Generator().manual_seed(9)
    p = torch.softmax(torch.randn(batch, 3, vocab, generator=gen), -1)
    q = torch.softmax(4 * torch.randn(batch, 2, vocab, generator=gen), -1)
    tokens = q.argmax(-1)
    parents = torch.full((batch, 2), -1)
    u = torch.full((batch, 3), 0.999999, dtype=torch.float64)
    return p, q, tokens, parents, u


def residual_buffers(p, q, tokens, parents, u):
    """The walk's two residual buffers after the walk, and torch's second residual."""
    batch, _, vocab = p.shape
    buffers = tuple(torch.full((batch, vocab), -1.0, dtype=torch.float64) for _ in range(2))
    limit = tree_rules._native_screen_limit(p.dtype, vocab)
    result = native_rules.tree_verify(p, q, tokens, parents, lambda: u, u, True, buffers, limit=limit)
    assert result is not None and result.sums == 2 and bool((result.last_node == -1).all())
    first = torch.sub(p[:, 0].double(), q[:, 0].double().mul(1.0)).clamp_(min=0)
    total = first.sum(-1)
    second = torch.sub(first, q[:, 1].double().mul_(total[:, None])).clamp_(min=0)
    return buffers, second


@needs_compiler
def test_the_residuals_are_the_torch_expressions_bit_for_bit(monkeypatch, tmp_path):
    """The second residual of every row equals torch's ``(r - q * s).clamp(min=0)`` bit for bit, and a
    kernel built with fused multiply-adds allowed (``-ffp-contract=fast``) does not."""
    case = second_residual_case()
    buffers, second = residual_buffers(*case)
    assert torch.equal(buffers[1], second)
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    monkeypatch.setattr(native_rules, "FLAGS", tuple(f for f in native_rules.FLAGS if f != "-ffp-contract=off")
                        + ("-ffp-contract=fast",))
    if platform.machine() not in ("x86_64", "AMD64") or "fma" not in native_cache.cpu_flags().split():
        pytest.skip("no fused multiply-add on this CPU")
    fused = native_rules.build(native_rules.SOURCE.read_bytes())
    monkeypatch.setattr(native_rules, "library", lambda: fused)
    buffers, second = residual_buffers(*case)
    assert not torch.equal(buffers[1], second)


def greedy_friendly_tree(p, tokens, parents, seed):
    """Tokens that equal the target's argmax at their parent for ~70 % of the present nodes."""
    gen = torch.Generator().manual_seed(seed)
    at_parent = p.argmax(-1).gather(1, parents + 1)
    agree = torch.rand(tokens.shape, generator=gen) < 0.7
    return torch.where(agree & (tokens >= 0), at_parent, tokens)


@needs_compiler
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
def test_greedy_tree_verify_gives_the_torch_outputs_and_errors(dtype, monkeypatch):
    taken = []
    original = native_rules.tree_greedy
    monkeypatch.setattr(native_rules, "tree_greedy", lambda *a, **k: taken.append(original(*a, **k)) or taken[-1])
    for shape in SHAPES:
        p, q, tokens, parents, u = random_tree_case(derive_seed("native-tree-greedy", shape, str(dtype)), *shape, dtype)
        tokens = greedy_friendly_tree(p, tokens, parents, 0)
        for validate in (True, False):
            assert_same(on_path(False, tree_rules.greedy_tree_verify, p, tokens, parents, validate=validate),
                        on_path(True, tree_rules.greedy_tree_verify, p, tokens, parents, validate=validate))
        assert taken[-1] is not None
        if shape[-1] >= 3:
            for _, (bad_p, _, bad_tokens, bad_parents, _) in _corruptions(p, q, tokens, parents, u):
                assert_same(on_path(False, tree_rules.greedy_tree_verify, bad_p, bad_tokens, bad_parents),
                            on_path(True, tree_rules.greedy_tree_verify, bad_p, bad_tokens, bad_parents))
    ties = torch.tensor([[[0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]]])  # first maximal index
    for token in range(4):
        assert_same(on_path(False, tree_rules.greedy_tree_verify, ties.to(dtype), torch.tensor([[token]]),
                            torch.tensor([[-1]])),
                    on_path(True, tree_rules.greedy_tree_verify, ties.to(dtype), torch.tensor([[token]]),
                            torch.tensor([[-1]])))
