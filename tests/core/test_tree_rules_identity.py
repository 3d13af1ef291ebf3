"""Proof that the faster tree rules are bit-identical to the ones they replaced.

``benchmarks/legacy_tree_rules.py`` is a frozen copy of ``specverify/core/tree_rules.py`` before the
speed-up (the draft row read whole only after a rejection, accepted rows updated in place, and a
validation screen before the detailed checks).  Every rule of the module is compared with its
frozen twin on random ragged trees (shapes up to V = 128k, fp32/bf16/fp16/fp64, siblings drawn from
the target itself for high acceptance, exact zeros, one-hot rows, uniforms at the acceptance edge),
with injected uniforms and with generators; outputs must be equal tensors and corrupted inputs must
raise the same ``ValueError`` message.

The comparisons run on both paths of the rules (the ``rule_path`` fixture): the native walk
(``specverify.core.native_rules.tree_verify``, taken by ``tree_rejection_sample`` and
``point_mass_tree_verify`` for contiguous CPU float32/bfloat16 inputs) and the torch code
(``SPECVERIFY_NATIVE=0``).  On the native path a test of those rules and dtypes must have taken it.
tests/core/test_native_tree_rules.py checks the kernel's own pieces and mutants.
"""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import legacy_tree_rules as frozen
from specverify.core import native_rules, tree_rules
from specverify.core.seeding import derive_seed

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)

RULES = [
    ("tree_rejection_sample", True, {}),
    ("point_mass_tree_verify", False, {}),
    ("typical_acceptance_tree_verify", False, {}),
    ("unchanged_target_tree_verify", True, {}),
    ("thresholded_tree_verify", True, {}),
]


NATIVE_RULES = ("tree_rejection_sample", "point_mass_tree_verify")


@pytest.fixture(params=["native", "torch"])
def rule_path(request, monkeypatch):
    """Run the test on the native walk or on the torch code; yields the list of the native walk's
    outcomes (``None``: it declined or flagged the inputs), which stays empty on the torch path."""
    taken: list = []
    if request.param == "torch":
        monkeypatch.setenv("SPECVERIFY_NATIVE", "0")
        yield taken
        return
    if not native_rules.enabled():
        pytest.skip("no C compiler: the native kernel cannot be built")
    original = native_rules.tree_verify
    monkeypatch.setattr(native_rules, "tree_verify", lambda *a, **k: taken.append(original(*a, **k)) or taken[-1])
    yield taken


def assert_native_taken(taken, request, name, dtype):
    """On the native path, a native rule on float32/bfloat16 inputs must have run the native walk."""
    if request.node.callspec.params.get("rule_path") == "native" and name in NATIVE_RULES \
            and dtype in (torch.float32, torch.bfloat16):
        assert any(result is not None for result in taken), "the native path was never taken"


def random_rows(gen: torch.Generator, shape: tuple[int, ...], zero_fraction: float) -> torch.Tensor:
    probs = torch.softmax(3.0 * torch.randn(shape, generator=gen, dtype=torch.float64), -1)
    probs = probs * (torch.rand(shape, generator=gen, dtype=torch.float64) >= zero_fraction)
    probs[..., 0] += probs.sum(-1) == 0
    hot = torch.rand(shape[:-1], generator=gen, dtype=torch.float64) < 0.1
    probs = torch.where(hot[..., None], torch.nn.functional.one_hot(probs.argmax(-1), shape[-1]).to(probs), probs)
    return probs / probs.sum(-1, keepdim=True)


def random_tree_case(seed: int, batch: int, num_nodes: int, vocab: int, dtype: torch.dtype):
    """``(target_probs, draft_probs, tree_tokens, parents, uniforms)``: per row a random tree of a
    random size (absent nodes last), each node's parent an earlier node or the root, its token
    drawn from its draft row as cast to ``dtype``; a third of the rows draft from the target law
    at the parent (high acceptance, deep paths)."""
    gen = torch.Generator().manual_seed(seed)
    p = random_rows(gen, (batch, num_nodes + 1, vocab), float(torch.rand((), generator=gen)) * 0.5)
    q = random_rows(gen, (batch, num_nodes, vocab), float(torch.rand((), generator=gen)) * 0.5)
    parents = torch.full((batch, num_nodes), -1, dtype=torch.int64)
    for node in range(1, num_nodes):
        parents[:, node] = torch.randint(-1, node, (batch,), generator=gen)
    same = torch.rand(batch, generator=gen) < 1 / 3
    at_parent = p.gather(1, (parents + 1)[..., None].expand(-1, -1, vocab))
    q = torch.where(same[:, None, None], at_parent, q)
    p_cast, q_cast = p.to(dtype), q.to(dtype)
    tokens = torch.multinomial(q_cast.double().reshape(-1, vocab), 1, generator=gen).reshape(batch, num_nodes)
    size = torch.randint(1, num_nodes + 1, (batch,), generator=gen)
    absent = torch.arange(num_nodes) >= size[:, None]
    tokens = torch.where(absent, -1, tokens)
    parents = torch.where(absent, -1, parents)
    u = torch.rand(batch, num_nodes + 1, generator=gen, dtype=torch.float64)
    edge = torch.rand(batch, num_nodes, generator=gen) < 0.2
    p_at = at_parent.to(dtype).double().gather(-1, tokens.clamp(min=0)[..., None])[..., 0]
    q_at = q_cast.double().gather(-1, tokens.clamp(min=0)[..., None])[..., 0]
    u[:, :-1] = torch.where(edge, (p_at / q_at).clamp(max=math.nextafter(1.0, 0.0)), u[:, :-1])
    return p_cast, q_cast, tokens, parents, u


def outcome(rule, *args, **kwargs):
    try:
        return tuple(rule(*args, **kwargs))
    except ValueError as error:
        return str(error)


def assert_same(old, new):
    if isinstance(old, str) or isinstance(new, str):
        assert old == new
        return
    assert len(old) == len(new)
    for old_field, new_field in zip(old, new):
        assert torch.equal(old_field, new_field), (old_field, new_field)


def compare(name, with_draft, p, q, tokens, parents, u, validate=True):
    draft = (q,) if with_draft else ()
    old = outcome(getattr(frozen, name), p, *draft, tokens, parents, uniforms=u, validate=validate)
    new = outcome(getattr(tree_rules, name), p, *draft, tokens, parents, uniforms=u, validate=validate)
    assert_same(old, new)
    return new


SHAPES = [(1, 1, 2), (3, 2, 5), (5, 4, 7), (8, 8, 32), (17, 6, 50), (64, 8, 16)]
LARGE_SHAPES = [(4, 5, 4099), (3, 4, 32_768)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rule", RULES, ids=[name for name, _, _ in RULES])
def test_same_outputs_as_the_frozen_tree_rule(rule, shape, dtype, rule_path, request):
    name, with_draft, _ = rule
    for repeat in range(3):
        case = random_tree_case(derive_seed("tree-identity", name, shape, str(dtype), repeat), *shape, dtype)
        compare(name, with_draft, *case)
        compare(name, with_draft, *case, validate=False)
    assert_native_taken(rule_path, request, name, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=str)
def test_same_outputs_as_the_frozen_tree_rule_at_large_vocabularies(shape, dtype, rule_path, request):
    case = random_tree_case(derive_seed("tree-identity-large", shape, str(dtype)), *shape, dtype)
    compare("tree_rejection_sample", True, *case)
    compare("tree_rejection_sample", True, *case, validate=False)
    compare("point_mass_tree_verify", False, *case)
    assert_native_taken(rule_path, request, "tree_rejection_sample", dtype)


def test_greedy_tree_rule_unchanged():
    for shape in SHAPES[:6]:
        p, _, tokens, parents, _ = random_tree_case(derive_seed("tree-identity-greedy", shape), *shape, torch.float32)
        assert_same(tuple(frozen.greedy_tree_verify(p, tokens, parents)),
                    tuple(tree_rules.greedy_tree_verify(p, tokens, parents)))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_same_outputs_at_128k(dtype, rule_path, request):
    case = random_tree_case(derive_seed("tree-identity-128k", str(dtype)), 2, 4, 131_072, dtype)
    compare("tree_rejection_sample", True, *case)
    assert_native_taken(rule_path, request, "tree_rejection_sample", dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_same_outputs_under_the_same_generator(dtype, rule_path, request):
    p, q, tokens, parents, _ = random_tree_case(derive_seed("tree-identity-gen", str(dtype)), 9, 6, 300, dtype)
    for seed in range(3):
        for name, draft in (("tree_rejection_sample", (q,)), ("point_mass_tree_verify", ())):
            old_gen, new_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            old = getattr(frozen, name)(p, *draft, tokens, parents, old_gen)
            new = getattr(tree_rules, name)(p, *draft, tokens, parents, new_gen)
            assert_same(tuple(old), tuple(new))
            assert torch.equal(old_gen.get_state(), new_gen.get_state())
    assert_native_taken(rule_path, request, "tree_rejection_sample", dtype)


def test_float64_inputs_are_not_modified():
    """The walk updates its float64 rows in place; with float64 inputs the first row must be a copy."""
    p, q, tokens, parents, u = random_tree_case(derive_seed("tree-identity-inplace"), 6, 5, 40, torch.float64)
    p_before, q_before = p.clone(), q.clone()
    tree_rules.tree_rejection_sample(p, q, tokens, parents, uniforms=u)
    assert torch.equal(p, p_before) and torch.equal(q, q_before)


def _corruptions(p, q, tokens, parents, u):
    batch, _, vocab = p.shape

    def with_entry(tensor, index, value):
        tensor = tensor.clone()
        tensor[index] = value
        return tensor

    yield "target NaN", (with_entry(p, (batch - 1, 0, vocab - 1), math.nan), q, tokens, parents, u)
    yield "target Inf", (with_entry(p, (0, 0, 0), math.inf), q, tokens, parents, u)
    yield "target negative", (with_entry(p, (0, 0, vocab - 1), -1e-30), q, tokens, parents, u)
    yield "minus zero", (with_entry(p, (0, 0, vocab - 1), -0.0) if float(p[0, 0, -1]) == 0 else p, q, tokens, parents,
                         u)
    yield "draft NaN", (p, with_entry(q, (0, 0, 1), math.nan), tokens, parents, u)
    yield "draft negative", (p, with_entry(q, (0, 0, vocab - 1), -1e-3), tokens, parents, u)
    yield "target scaled", (p * 1.5, q, tokens, parents, u)
    yield "draft scaled", (p, q * 0.5, tokens, parents, u)
    yield "token too large", (p, q, with_entry(tokens, (0, 0), vocab), parents, u)
    yield "forward parent", (p, q, tokens, with_entry(parents, (0, 0), 0), u)
    yield "draft probability 0", (p, with_entry(q, (0, 0, int(tokens[0, 0])), 0.0), tokens, parents, u)
    yield "uniform 1", (p, q, tokens, parents, with_entry(u, (0, -1), 1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.usefixtures("rule_path")
def test_same_validation_errors_as_the_frozen_validator(dtype):
    for shape in [(1, 1, 3), (4, 3, 50), (3, 2, 4096)]:
        case = random_tree_case(derive_seed("tree-identity-validation", shape, str(dtype)), *shape, dtype)
        for _, corrupted in _corruptions(*case):
            for name, with_draft, _ in RULES:
                compare(name, with_draft, *corrupted)
